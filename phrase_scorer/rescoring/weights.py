"""Weights for the dense features of n-best lists, and applying them: each sentence's best hypothesis.

A sentence's best hypothesis is the first of those with the largest weighted sum of the dense
features; it is written as its hypothesis field with the surrounding spaces removed, which is
the words Moses prints as the 1-best translation (it ends that line with a space). A sentence id
that the list skips gets an empty line, so line k + 1 is always sentence k. Every sentence with
hypotheses gets its line (:func:`weighted_sum`, :func:`better`): a feature weighted 0 does not
count, even at -inf; a sum that is no number (+inf and -inf features together) ranks below every
number, -inf included; so among hypotheses whose sums are all -inf, or all undefined, the first
wins: Moses' own 1-best, as in every tie. A feature value that is NaN is refused, naming the list
and the line.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import AtomicOutput
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import (
    Layout,
    NBestEntry,
    check_sentence_order,
    checked_dense_rows,
    dense_features,
    describe_layout,
    group_by_sentence,
    read_nbest,
)

log = logging.getLogger(__name__)


def weighted_sum(values: np.ndarray, weights: np.ndarray):
    """The weighted sum of a hypothesis' dense features (of each row, for a matrix of hypotheses);
    a feature weighted 0 does not count (its value may be -inf). Infinite values or a sum too large
    for a float give +-inf, or NaN when +inf meets -inf: :func:`better` ranks those."""
    used = weights != 0
    with np.errstate(over="ignore", invalid="ignore"):
        sums = values[..., used] @ weights[used]
    return float(sums) if sums.ndim == 0 else sums



def better(score: float, best: Optional[float]) -> bool:
    """Whether a hypothesis of weighted sum ``score`` replaces the best so far (``best``, None for
    none yet): only a strictly larger sum does, so the first of equals wins, as Moses orders its
    lists best first; NaN ranks below every number, -inf included."""
    if best is None:
        return True
    if math.isnan(score):
        return False
    return math.isnan(best) or score > best



def best_of(sums: Sequence[float]) -> int:
    """The index of the best of a sentence's weighted sums, by :func:`better`."""
    best, index = None, 0
    for i, score in enumerate(sums):
        if better(float(score), best):
            best, index = float(score), i
    return index



@dataclass
class Weights:
    """One weight per dense feature value, in the lists' order."""

    layout: Layout
    values: List[float]

    def by_name(self) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        position = 0
        for name, count in self.layout:
            out[name] = self.values[position : position + count]
            position += count
        return out

    def value_names(self) -> List[str]:
        """Each value's feature name, repeated for a feature with several values (mert-moses.pl's
        dense weight file)."""
        return [name for name, count in self.layout for _ in range(count)]

    def unweighted(self) -> List[str]:
        """The features all of whose weights are exactly 0: they change no choice
        (:func:`weighted_sum`), so a list may as well lack them (:meth:`without`)."""
        return [name for name, values in self.by_name().items() if all(v == 0.0 for v in values)]

    def without(self, names: Sequence[str]) -> "Weights":
        """These weights for lists that lack the features ``names``, each weighted 0 (:meth:`unweighted`):
        every sentence gets the hypothesis it gets with them. A weighted feature cannot be left out."""
        weighted = [name for name in names if name not in self.unweighted()]
        if weighted:
            raise PhraseScorerError(f"feature {weighted[0]} is weighted, so lists cannot leave it out",
                                    hint="leave out only features whose weights are 0")
        by_name = self.by_name()
        layout = tuple((name, count) for name, count in self.layout if name not in names)
        return Weights(layout, [v for name, _ in layout for v in by_name[name]])



def check_layout(found: Layout, expected: Layout, weights: Weights, nbest: PathLike, entry: NBestEntry) -> None:
    """Refuse a line whose dense features (``found``) are not laid out as ``expected`` (the
    weights' layout, or the part of it the line holds yet), naming the list and the line."""
    if found != expected:
        raise PhraseScorerError(
            f"the dense features are {describe_layout(found)}, but the weights are for "
            f"{describe_layout(weights.layout)}", path=nbest, line=entry.line_number,
            hint="rerank lists made by the same decoder and rescored with the same models")


def best_hypothesis(entries: Sequence[NBestEntry], rows: Union[Sequence[Sequence[float]], np.ndarray], weights: Weights,
                    values: np.ndarray, nbest: PathLike) -> str:
    """A sentence's best hypothesis (its field without the surrounding spaces): ``entries`` with
    their dense values ``rows`` (the weights' layout), ranked by :func:`weighted_sum` with the
    weights' ``values`` and :func:`best_of`."""
    best = entries[best_of(weighted_sum(checked_dense_rows(entries, rows, weights.layout, nbest), values))]
    return best.hypothesis.strip(" ")


def apply_weights(nbest: PathLike, weights: Weights, output: PathLike, ignore: Sequence[str] = ()) -> int:
    """Write the best hypothesis of each sentence of ``nbest`` under ``weights`` (the features in
    ``ignore`` left out); returns the number of lines written (largest sentence id + 1). Each
    sentence's best is chosen by :func:`weighted_sum` and :func:`better`: never none. The output is
    written under a temporary name and renamed into place (the caller has checked it: see
    :func:`write_best_hypotheses` for a command's own output)."""
    with AtomicOutput(output) as out:
        written = write_best_hypotheses(nbest, weights, out.write, ignore)
        out.commit()
    return written


def write_best_hypotheses(nbest: PathLike, weights: Weights, write: Callable[[bytes], None],
                          ignore: Sequence[str] = ()) -> int:
    """:func:`apply_weights`, the lines given to ``write`` in chunks (an output a job holds):
    returns the number of lines; an empty list is an error, raised before the output is finished."""
    w = np.asarray(weights.values, np.float64)
    if not np.isfinite(w).all():
        name = weights.value_names()[int(np.argmax(~np.isfinite(w)))]
        raise PhraseScorerError(f"the weight of {name} is {w[~np.isfinite(w)][0]}, not a finite number",
                                hint="tune the weights again")
    written = 0

    def best_lines() -> Iterator[bytes]:
        nonlocal written
        last_id = -1
        for sentence_id, entries in group_by_sentence(read_nbest(nbest)):
            check_sentence_order(entries[0], last_id, nbest)
            last_id = sentence_id
            rows = []
            for entry in entries:
                found, values = dense_features(entry, ignore)
                check_layout(found, weights.layout, weights, nbest, entry)
                rows.append(values)
            for _ in range(written, sentence_id):  # a sentence with no hypotheses
                yield b"\n"
                written += 1
            yield (best_hypothesis(entries, rows, weights, w, nbest) + "\n").encode("utf-8")
            written += 1

    chunk: List[bytes] = []
    for line in best_lines():
        chunk.append(line)
        if len(chunk) == 4096:
            write(b"".join(chunk))
            chunk = []
    write(b"".join(chunk))
    if written == 0:
        raise PhraseScorerError("the n-best list is empty", path=nbest)
    return written
