"""The files Moses' extractor makes of a dev n-best list, and Moses' BLEU computed from them.

``copy_checked`` copies the dev list as the optimisers need it (ids grouped in increasing order,
the same dense features on every line); the extractor writes ``features.dat`` and ``scores.dat``,
read back by :func:`read_mert_data`; :func:`reranked_bleu` is Moses' corpus BLEU of the list
reranked by some weights, as the optimisers compute it.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import (
    Layout,
    check_sentence_order,
    checked_dense_rows,
    dense_feature_vector,
    dense_layout,
    describe_layout,
    group_by_sentence,
    read_nbest,
    without_features,
)
from phrase_scorer.rescoring.weights import best_of, weighted_sum

log = logging.getLogger(__name__)


BLEU_ORDER = 4  # Moses' BleuScorer: n-grams up to 4, statistics (matches, total) per order, then the reference length



@dataclass
class DevList:
    layout: Layout
    sentences: int  # largest id + 1
    gram: np.ndarray  # X'X of the dense features, for the fit to the totals
    moment: np.ndarray  # X'y
    totals_square: float  # y'y
    lines: int
    largest_list: int = 0  # most hypotheses of one sentence: the n-best size the lists were decoded with



def copy_checked(nbest: PathLike, copy: Path, ignore: Sequence[str] = ()) -> DevList:
    """Copy ``nbest`` to ``copy`` as plain text, without the features in ``ignore``, checking
    that its ids are grouped in increasing order and that every line has the same dense
    features, as the optimisers need.

    Accumulates what the least-squares fit to the totals needs, with features and totals taken
    relative to their sentence's mean: a total also holds features Moses leaves out of n-best
    lists (the unknown-word penalty, -100 per word passed through), which are the same for every
    hypothesis of a sentence."""
    layout: Optional[Layout] = None
    gram = moment = None
    totals_square = 0.0
    last_id = -1
    count = largest = 0
    with open(copy, "wb") as out:
        for _, entries in group_by_sentence(without_features(e, ignore) for e in read_nbest(nbest)):
            for entry in entries:
                found = dense_layout(entry)
                if layout is None:
                    layout = found
                    if not layout:
                        raise PhraseScorerError("the n-best list has no dense features", path=nbest,
                                                line=entry.line_number)
                elif found != layout:
                    raise PhraseScorerError(
                        f"the dense features are {describe_layout(found)}, not {describe_layout(layout)} as on the "
                        "first line", path=nbest, line=entry.line_number,
                        hint="every line must carry the same features, in the same order")
                check_sentence_order(entry, last_id, nbest)
                last_id = entry.sentence_id
                out.write(entry.to_line().encode("utf-8"))
            assert layout is not None  # set by the list's first entry
            features = checked_dense_rows(entries, [dense_feature_vector(e) for e in entries], layout, nbest)  # (H, D)
            totals = np.array([e.total for e in entries])  # (H,)
            features -= features.mean(0)
            totals -= totals.mean()
            if gram is None:
                gram, moment = np.zeros((features.shape[1],) * 2), np.zeros(features.shape[1])
            gram += features.T @ features
            moment += features.T @ totals
            totals_square += float(totals @ totals)
            count += len(entries)
            largest = max(largest, len(entries))
    if count == 0:
        raise PhraseScorerError("the n-best list is empty", path=nbest)
    assert layout is not None and gram is not None and moment is not None  # set by the first sentence
    return DevList(layout, last_id + 1, gram, moment, totals_square, count, largest)



@dataclass
class MertData:
    """The extractor's files for the dev list: per sentence, its hypotheses' dense features and
    BLEU statistics."""

    features: List[np.ndarray]  # per sentence (H, D)
    stats: List[np.ndarray]  # per sentence (H, 2 * BLEU_ORDER + 1)



_BEGIN = re.compile(r"^(FEATURES|SCORES)_TXT_BEGIN_0 (\S+) (\d+) (\d+)", re.ASCII)



def read_blocks(path: Path, width: int) -> Iterator[Tuple[str, np.ndarray]]:
    """(sentence index, (H, width) values) for each block of a text features.dat or scores.dat;
    sparse features after the first ``width`` values are ignored."""
    with open(path, encoding="utf-8") as f:
        number = 0
        for line in f:
            number += 1
            match = _BEGIN.match(line)
            if not match:
                raise PhraseScorerError("expected a *_TXT_BEGIN_0 header", path=path, line=number,
                                        hint="the extractor's output looks damaged")
            index, rows, columns = match.group(2), int(match.group(3)), int(match.group(4))
            if columns != width:
                raise PhraseScorerError(f"{columns} values per hypothesis, expected {width}", path=path, line=number)
            block = np.empty((rows, width))
            for r in range(rows):
                number += 1
                block[r] = [float(v) for v in next(f).split()[:width]]
            number += 1
            next(f)  # *_TXT_END_0
            yield index, block



def read_mert_data(features_path: Path, scores_path: Path, dimensions: int) -> MertData:
    features, stats = [], []
    for (f_index, f_block), (s_index, s_block) in zip(read_blocks(features_path, dimensions),
                                                      read_blocks(scores_path, 2 * BLEU_ORDER + 1)):
        if f_index != s_index or len(f_block) != len(s_block):
            raise PhraseScorerError(f"sentence {f_index} of the features does not match "
                                    f"sentence {s_index} of the scores", path=scores_path)
        features.append(f_block)
        stats.append(s_block)
    return MertData(features, stats)



def moses_bleu(stats: np.ndarray) -> float:
    """Corpus BLEU from summed statistics, as Moses' BleuScorer computes it (x 100)."""
    log_bleu = 0.0
    for n in range(BLEU_ORDER):
        matches, total = stats[2 * n], stats[2 * n + 1]
        if matches == 0:
            return 0.0
        log_bleu += math.log(matches) - math.log(total)
    log_bleu /= BLEU_ORDER
    brevity = 1.0 - stats[2 * BLEU_ORDER] / stats[1]
    if brevity < 0.0:
        log_bleu += brevity
    return 100.0 * math.exp(log_bleu)



def reranked_bleu(data: MertData, weights: Sequence[float]) -> float:
    """BLEU (x 100) of the dev list's best hypotheses under ``weights``, chosen as
    :func:`apply_weights` chooses them (:func:`weighted_sum`, :func:`best_of`)."""
    w = np.asarray(weights, np.float64)
    total = np.zeros(2 * BLEU_ORDER + 1)
    for features, stats in zip(data.features, data.stats):
        total += stats[best_of(weighted_sum(features, w))]
    return moses_bleu(total)

