"""The host work of ``rescore`` on one window of an n-best list, done in a worker process.

Two stages per window, both in the same worker (see :class:`~phrase_scorer.runtime.workers.WorkerPool`):

    prepare:  raw lines -> checked entries -> per model: source and target ids, and the plans of
              its scorer's batches (sent to the scorer, which then only launches their work)
    finish:   per model log p -> the features' values (checked, per token with ``normalize``)
              -> each line with its features appended -> one gzip member

Between the stages the worker keeps the window's entries, so only ids and plans go to the
scorer and only scores come back. The main process reads the raw lines, cuts them into windows
of whole sentences (reading only each line's sentence id) and looks up the source sentences;
the workers do every other per-line step. This module imports neither torch nor the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import RescoreOptions
from phrase_scorer.data.padding import IdRows
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.compression import gzip_member
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import NBestEntry, entry_of, moses_rounded
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.scoring.batch_plan import BatchPlan, PlanSettings, plan_window
from phrase_scorer.scoring.columns import check_finite, per_token
from phrase_scorer.vocab import Vocabulary


@dataclass(frozen=True)
class ModelSide:
    """What the host work needs of a feature's model: which way it reads (``reverse``: the
    source sentence given the hypothesis), its vocabularies, and the plan settings of its
    scorer (None: the scorer plans its batches itself)."""

    name: str
    reverse: bool
    source_vocab: Vocabulary
    target_vocab: Vocabulary
    plan_settings: Optional[PlanSettings] = None


@dataclass
class RawNBestWindow:
    """Whole sentences of an n-best list as read: ``lines`` (raw, line ends included), the
    number of the first, and each sentence's source words by sentence id."""

    index: int
    first_line: int
    lines: List[bytes]
    sentences: Dict[int, List[str]]


@dataclass
class ModelInputs:
    """A window's pairs for one model: ids, and the plans of its batches when planned here."""

    source_ids: IdRows
    target_ids: IdRows
    plans: Optional[List[BatchPlan]] = None


def model_inputs(model: ModelSide, lines: Sequence[NBestEntry], sentence_words: Sequence[List[str]],
                 source_path: PathLike, nbest_path: PathLike) -> Tuple[List[List[int]], List[List[int]], np.ndarray]:
    """(source ids, target ids, target words) per line for ``model``: source sentence and
    hypothesis, or the reverse. Each distinct source sentence is looked up once. The words of
    the side the model predicts (not its ids: a subword model's pieces) divide log p for
    ``--normalize``, so a per-word score means the same for every vocabulary."""
    cache: Dict[int, List[int]] = {}
    sentence_side = model.target_vocab if model.reverse else model.source_vocab
    hypothesis_side = model.source_vocab if model.reverse else model.target_vocab
    from_sentence, from_hypothesis, predicted_words = [], [], []
    for entry, words in zip(lines, sentence_words):
        ids = cache.get(id(words))
        if ids is None:
            ids = cache[id(words)] = sentence_side.encode(words)
            if not ids and not model.reverse:
                raise PhraseScorerError(f"the source sentence is empty; model {model.name} cannot score a translation "
                                        "of nothing", path=source_path, line=entry.sentence_id + 1,
                                        hint="remove empty lines from the input before decoding")
        from_sentence.append(ids)
        hypothesis = split_words(entry.hypothesis)
        from_hypothesis.append(hypothesis_side.encode(hypothesis))
        predicted_words.append(len(words) if model.reverse else len(hypothesis))
        if model.reverse and not from_hypothesis[-1]:
            raise PhraseScorerError(f"the hypothesis is empty; the reverse model {model.name} cannot condition on it",
                                    path=nbest_path, line=entry.line_number,
                                    hint="rescore this list with forward models only")
    predicted = np.array(predicted_words, np.int64)
    return (from_hypothesis, from_sentence, predicted) if model.reverse else (from_sentence, from_hypothesis, predicted)


def with_features(entries: Sequence[NBestEntry], names: Sequence[str], values: Sequence[np.ndarray]) -> bytes:
    """The lines of ``entries`` with feature ``names[j]`` = ``values[j][i]`` appended to line i
    (rounded to Moses' 6 significant digits), every other byte as read."""
    parts = []
    for i, entry in enumerate(entries):
        for name, feature in zip(names, values):
            entry.features.append((name, [moses_rounded(float(feature[i]))]))
        parts.append(entry.to_line().encode("utf-8"))
    return b"".join(parts)


class NBestWork:
    """A worker's handler: :meth:`prepare` and :meth:`finish` a window (see the module docstring).

    ``members``: for each feature of ``names``, the models whose log p it averages."""

    def __init__(self, nbest_path: str, source_path: str, models: Sequence[ModelSide], options: RescoreOptions,
                 compress: bool, names: Sequence[str], members: Sequence[Sequence[int]]) -> None:
        self.nbest_path = nbest_path
        self.source_path = source_path
        self.models = list(models)
        self.options = options
        self.compress = compress
        self.names = list(names)
        self.members = [list(m) for m in members]
        self._taken = frozenset(m.name for m in models)
        self._kept: Dict[int, tuple] = {}  # window index -> what finish needs

    def prepare(self, index: int, window: RawNBestWindow) -> List[ModelInputs]:
        entries: List[NBestEntry] = []
        words: List[List[str]] = []
        for number, data in enumerate(window.lines, window.first_line):
            entry = entry_of(data, self.nbest_path, number)
            taken = self._taken.intersection(label for label, _ in entry.features)
            if taken:
                raise PhraseScorerError(f"the line already has a feature {sorted(taken)[0]}=", path=self.nbest_path,
                                        line=number, hint=Text("choose other names with ", setting("names"), "/",
                                                               setting("reverse_names")))
            entries.append(entry)
            words.append(window.sentences[entry.sentence_id])
        inputs, predicted = [], []
        for model in self.models:
            source_ids, target_ids, words_predicted = model_inputs(model, entries, words, self.source_path,
                                                                   self.nbest_path)
            sources, targets = IdRows.of(source_ids), IdRows.of(target_ids)
            plans = list(plan_window(model.plan_settings, sources, targets)) if model.plan_settings else None
            inputs.append(ModelInputs(sources, targets, plans))
            predicted.append(words_predicted)
        self._kept[index] = (entries, predicted, window.first_line)
        return inputs

    def finish(self, index: int, log_probs: Sequence[np.ndarray]) -> bytes:
        entries, predicted, first_line = self._kept.pop(index)
        scores = []
        for model_log_probs, words_predicted in zip(log_probs, predicted):
            check_finite(model_log_probs, self.nbest_path, first_line)
            scores.append(per_token(model_log_probs, words_predicted) if self.options.normalize else model_log_probs)
        values = [scores[m[0]] if len(m) == 1 else np.mean(np.stack([scores[i] for i in m]).astype(np.float64), axis=0)
                  for m in self.members]  # per feature: (lines,)
        data = with_features(entries, self.names, values)
        return gzip_member(data, self.options.compress_level) if self.compress else data
