"""Rescoring Moses n-best lists: the models' log-probabilities as new dense features.

Each line ``id ||| hypothesis ||| features ||| total [||| ...]`` of an n-best list gets one
feature per model appended to its features field, in Moses' ``Name= value`` form::

    0 ||| un homme  ||| LM0= -40.8 ... TranslationModel0= -5.3 -12.1 -5.9 -8.3 RNN0= -17.2736 ||| -3.10178

The value is the natural-log log p(hypothesis | source sentence) under the model (Moses keeps its
features in the log domain in n-best lists), or, with ``normalize``, that divided by the number
of predicted tokens (the words and ``</s>``). A *reverse* model, trained on target -> source
sentence pairs, gives log p(source sentence | hypothesis) instead. Values are rounded to the 6
significant digits Moses prints its own feature values with, and written with ``%g``. Every
other byte of the line is kept: id, hypothesis, the features already there, total, the fields
after it (segmentation, alignment) and the newline.

The work runs in the :class:`~phrase_scorer.runtime.workers.Pipeline` annotate uses: a reader thread cuts
the list into windows of whole sentences (about ``window_lines`` lines) and looks up word ids in
each model's vocabularies; the main thread asks :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer` for
log p, one call per model and window, so each source sentence is encoded once for all its
hypotheses and the hypotheses' shared prefixes are decoded once; a writer thread appends the
features and writes the window as one chunk with a resume record. Output is atomic, resumable
(``resume``) and signed (``OUT.json``); an existing output is replaced only with ``overwrite``
(or by the ``resume`` that continues it), never when it is one of the inputs
(:mod:`phrase_scorer.io.outputs`).

The n-best list must be grouped by sentence id, in increasing order (as Moses writes it); the
source file has line k + 1 for sentence id k, and exactly as many lines as the largest id + 1.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer import __version__
from phrase_scorer.scoring.columns import check_finite, per_token
from phrase_scorer.config import FORWARD_FEATURE_PREFIX, REVERSE_FEATURE_PREFIX, RescoreOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.files import (
    GZIP_LIBRARY,
    STDIO,
    PathLike,
    gzip_member,
    is_gzip_name,
    text_lines,
)
from phrase_scorer.io.outputs import model_files
from phrase_scorer.io.nbest import NBestEntry, NBestReader, check_sentence_order, moses_rounded
from phrase_scorer.runtime.workers import Pipeline
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.records import Signature, SignedModel, as_recorded
from phrase_scorer.runtime.job import OutputJob, input_identity

log = logging.getLogger(__name__)

# A dense Moses feature name: no '_' (the extractor reads a name with '_' as a sparse feature).
FEATURE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
VALUE_FORMAT = "%g: 6 significant digits, as Moses prints feature values"


@dataclass
class FeatureModel:
    """A model and the feature it adds. ``reverse``: it scores the source given the hypothesis.
    Models of an ``ensemble`` share their feature ``name``: its value is the mean of their log p."""

    name: str
    loaded: Any  # a LoadedModel
    reverse: bool = False
    ensemble: bool = False

    def describe(self) -> Dict[str, Any]:
        """The model as the signature names it (:class:`~phrase_scorer.records.SignedModel`)."""
        return SignedModel.of(self.loaded, name=self.name, reverse=self.reverse, ensemble=self.ensemble).to_json()


def feature_names(models: Sequence[FeatureModel]) -> List[str]:
    """The features the models add, in order: one per model, one per ensemble."""
    return list(dict.fromkeys(m.name for m in models))


def feature_members(models: Sequence[FeatureModel]) -> List[List[int]]:
    """For each feature of :func:`feature_names`, the indices of the models it averages."""
    names = feature_names(models)
    return [[i for i, m in enumerate(models) if m.name == name] for name in names]


def feature_models(forward: Sequence[PathLike], reverse: Sequence[PathLike] = (), names: Sequence[str] = (),
                   reverse_names: Sequence[str] = (), device: Any = "cpu", ensemble: Optional[str] = None,
                   reverse_ensemble: Optional[str] = None) -> List[FeatureModel]:
    """Load the models, forward ones first, naming their features ``names`` / ``reverse_names``
    (by default RNN0, RNN1, ... and RNNReverse0, ...); or, with ``ensemble`` (``reverse_ensemble``),
    all forward (reverse) models as one feature of that name, the mean of their log p."""
    from phrase_scorer.model_dir import load_model

    for dirs, given, option, together, together_option in (
            (forward, names, setting("names"), ensemble, setting("ensemble")),
            (reverse, reverse_names, setting("reverse_names"), reverse_ensemble, setting("reverse_ensemble"))):
        if together is not None and given:
            raise PhraseScorerError(Text(option, " and ", together_option,
                                         " both name the features of the same models"),
                                    hint=Text("give ", together_option, " NAME alone: its models add one feature"))
        if together is not None and len(dirs) < 2:
            raise PhraseScorerError(Text(together_option, f" {together} needs two models or more, got {len(dirs)}"),
                                    hint="an ensemble averages the log p of several models")
        if given and len(given) != len(dirs):
            raise PhraseScorerError(Text(f"{len(given)} ", option, f" for {len(dirs)} models"),
                                    hint=Text("give ", option, " once per model, in order"))
    names = ([ensemble] * len(forward) if ensemble is not None
             else list(names) or [f"{FORWARD_FEATURE_PREFIX}{i}" for i in range(len(forward))])
    reverse_names = ([reverse_ensemble] * len(reverse) if reverse_ensemble is not None
                     else list(reverse_names) or [f"{REVERSE_FEATURE_PREFIX}{i}" for i in range(len(reverse))])
    check_feature_names(list(dict.fromkeys(names)) + list(dict.fromkeys(reverse_names)))
    return ([FeatureModel(n, load_model(d, device), ensemble=ensemble is not None) for n, d in zip(names, forward)]
            + [FeatureModel(n, load_model(d, device), reverse=True, ensemble=reverse_ensemble is not None)
               for n, d in zip(reverse_names, reverse)])


def ensembles_by_name(models: Sequence[FeatureModel]) -> List[FeatureModel]:
    """A name given to several models (``rescore-experiment -m Ens=A -m Ens=B``) makes them an
    ensemble: one feature, the mean of their log p (:func:`check_ensembles` refuses mixed directions)."""
    counts = Counter(m.name for m in models)
    return [replace(m, ensemble=counts[m.name] > 1) for m in models]


def check_ensembles(models: Sequence[FeatureModel]) -> None:
    """Models share a feature only as an ensemble of the same direction."""
    for members in feature_members(models):
        group = [models[i] for i in members]
        if len(group) > 1 and not all(m.ensemble for m in group):
            raise PhraseScorerError(f"feature name {group[0].name} is given twice",
                                    hint=Text("give each model its own ", setting("names")))
        if len({m.reverse for m in group}) > 1:
            raise PhraseScorerError(f"ensemble {group[0].name} mixes forward and reverse models",
                                    hint="average models of one direction")


def check_feature_names(names: Sequence[str]) -> None:
    """Names Moses and its optimisers read as distinct dense features."""
    for name in names:
        if not FEATURE_NAME.fullmatch(name):
            raise PhraseScorerError(f"feature name {name!r} is not letters and digits starting with a letter",
                                    hint="Moses reads a name with '_' as a sparse feature; use e.g. RNN0")
    seen = set()
    for name in names:
        if name in seen:
            raise PhraseScorerError(f"feature name {name} is given twice",
                                    hint=Text("give each model its own ", setting("names")))
        seen.add(name)


@dataclass
class NBestWindow:
    """Whole sentences of the n-best list, with word ids per model (filled by the reader thread)."""

    index: int
    first_line: int
    lines: List[NBestEntry]
    inputs: List[Tuple[List[List[int]], List[List[int]]]]  # per model: (source ids, target ids) per line
    scores: List[np.ndarray] = field(default_factory=list)  # per model: the feature value per line


class SourceSentences:
    """The source file, read forward as the n-best list asks for sentence ids."""

    def __init__(self, path: PathLike, nbest: PathLike) -> None:
        self.path = path
        self.nbest = nbest
        self._lines = text_lines(path, hint="give the source sentences as UTF-8 text, one per line")
        self.lines_read = 0

    def words(self, sentence_id: int, nbest_line: int) -> List[str]:
        """The words of source line ``sentence_id + 1``; ids must increase from call to call."""
        text = None
        while self.lines_read <= sentence_id:
            text = self._next()
            if text is None:
                raise PhraseScorerError(
                    f"sentence id {sentence_id} needs source line {sentence_id + 1}, but {self._name()} has only "
                    f"{self.lines_read} lines", path=self.nbest, line=nbest_line,
                    hint="give the source sentences the n-best list was decoded from, one per line")
        return split_words(text)

    def check_all_read(self, last_id: int) -> None:
        """The source must not have lines beyond the n-best list's last sentence."""
        if self._next() is not None:
            raise PhraseScorerError(
                f"{self._name()} has more lines than the n-best list has sentences (its last sentence id is {last_id})",
                path=self.path, line=self.lines_read,
                hint="give the source sentences the n-best list was decoded from, one per line")

    def _next(self) -> Optional[str]:
        line = next(self._lines, None)
        if line is None:
            return None
        self.lines_read = line[0]
        return line[1]

    def _name(self) -> str:
        return "<stdin>" if os.fspath(self.path) == STDIO else os.fspath(self.path)

    def close(self) -> None:
        self._lines.close()


@dataclass
class RescoreResult:
    output: str
    lines: int
    sentences: int
    features: List[str]
    signature: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stats: List[Any] = field(default_factory=list)  # per model, the scorer's ScoringStats


def rescore(
    nbest: PathLike,
    source: PathLike,
    output: PathLike,
    models: Sequence[FeatureModel],
    options: RescoreOptions = RescoreOptions(),
    scoring_options: Optional[ScoringOptions] = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> RescoreResult:
    """Append each model's feature to every line of ``nbest``, writing ``output`` atomically.

    An existing ``output`` is replaced only with ``overwrite``, or when ``resume`` continues the
    run that is making it."""
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    if not models:
        raise PhraseScorerError("no model given", hint=Text("pass ", setting("models", "MODEL", short=True),
                                                            " (and/or ", setting("reverse_models", "MODEL"), ")"))
    check_ensembles(models)
    names = feature_names(models)
    check_feature_names(names)
    scoring_options = scoring_options or ScoringOptions()
    output = os.fspath(output)
    inputs = [("the n-best list", nbest), ("the source", source)]
    for m in models:
        inputs += model_files(m.loaded.directory)
    if os.fspath(nbest) == STDIO and os.fspath(source) == STDIO:
        raise PhraseScorerError("the n-best list and the source cannot both be read from stdin")
    compress = output != STDIO and is_gzip_name(output)
    scorers = [BatchScorer(m.loaded.model, scoring_options) for m in models]
    settings = {
        "input": input_identity(nbest),
        "source": input_identity(source),
        "models": [m.describe() for m in models],
        "options": asdict(options),
        "scoring": [scorer.describe() for scorer in scorers],  # device, precision, batches per model
        "gzip": GZIP_LIBRARY if compress else False,  # another library writes other bytes
        "package_version": __version__,
    }
    settings = as_recorded(settings)  # as the resume record will hold it
    started = time.monotonic()
    with OutputJob(output, inputs, overwrite=overwrite, resume=resume, resumable=True, settings=settings,
                   source=settings["input"]["path"]) as job:
        done_lines = job.done_lines
        reader = NBestReader(nbest, skip=done_lines)
        sources = SourceSentences(source, nbest)
        writer = FeatureWriter(job, options, compress, names, feature_members(models))
        counts = {"sentences": 0}

        def work(window: NBestWindow) -> NBestWindow:
            for scorer, (src_ids, tgt_ids, tgt_words) in zip(scorers, window.inputs):
                log_probs = scorer.score(src_ids, tgt_ids)
                check_finite(log_probs, settings["input"]["path"], window.first_line)
                window.scores.append(per_token(log_probs, tgt_words) if options.normalize else log_probs)
            window.inputs = []  # the ids are not needed any more
            return window

        try:
            with progress_bar("rescoring", reader) as progress:
                Pipeline().run(
                    lambda put: read_windows(reader, sources, models, options.window_lines, done_lines, put,
                                             progress, counts),
                    work,
                    writer.write_window,
                )
        finally:
            sources.close()
        total_lines = job.lines_done
        if total_lines == 0:
            raise PhraseScorerError("the n-best list is empty", path=nbest)
        job.flush()  # the signature records the bytes' size and SHA-256
        record = Signature.build(
            "phrase-scorer rescore", settings, output=output, lines=total_lines, content=job.temporary,
            features=names,
            value="log p per predicted token (words + </s>)" if options.normalize else "log p (natural log)",
            value_format=VALUE_FORMAT)
        job.commit(record)
    log.info("rescored %d lines with %s", total_lines, ", ".join(names))
    return RescoreResult(output=output, lines=total_lines, sentences=counts["sentences"], features=names,
                         signature=record.to_json(), seconds=time.monotonic() - started,
                         stats=[scorer.stats for scorer in scorers])


def read_windows(reader: NBestReader, sources: SourceSentences, models: Sequence[FeatureModel], window_lines: int,
                 first_line: int, put, progress, counts: Dict[str, Any]) -> None:
    """Reader thread body: cut the list into windows of whole sentences and look up word ids."""
    names = {m.name for m in models}
    lines: List[NBestEntry] = []
    sentence_words: List[List[str]] = []  # per line: the source words (one list per sentence, shared)
    index = 0
    first = first_line + 1
    last_id = -1
    words: List[str] = []

    def flush() -> bool:
        nonlocal lines, sentence_words, index, first
        progress.advance(len(lines))
        inputs = [model_inputs(m, lines, sentence_words, sources.path, reader.path) for m in models]
        ok = put(NBestWindow(index, first, lines, inputs))
        index += 1
        first += len(lines)
        lines, sentence_words = [], []
        return ok

    for entry in reader:
        if entry.sentence_id != last_id:
            check_sentence_order(entry, last_id, reader.path)
            if len(lines) >= window_lines and not flush():
                return
            words = sources.words(entry.sentence_id, entry.line_number)
            last_id = entry.sentence_id
            counts["sentences"] += 1
        taken = names.intersection(label for label, _ in entry.features)
        if taken:
            raise PhraseScorerError(f"the line already has a feature {sorted(taken)[0]}=", path=reader.path,
                                    line=entry.line_number,
                                    hint=Text("choose other names with ", setting("names"), "/",
                                              setting("reverse_names")))
        lines.append(entry)
        sentence_words.append(words)
    if lines and not flush():
        return
    if last_id >= 0:
        sources.check_all_read(last_id)


def model_inputs(model: FeatureModel, lines: List[NBestEntry], sentence_words: List[List[str]],
                 source_path: PathLike, nbest_path: PathLike) -> Tuple[List[List[int]], List[List[int]], np.ndarray]:
    """(source ids, target ids, target words) per line for ``model``: source sentence and
    hypothesis, or the reverse. Each distinct source sentence is looked up once. The words of
    the side the model predicts (not its ids: a subword model's pieces) divide log p for
    ``--normalize``, so a per-word score means the same for every vocabulary."""
    loaded = model.loaded
    cache: Dict[int, List[int]] = {}
    sentence_side = loaded.target_vocab if model.reverse else loaded.source_vocab
    hypothesis_side = loaded.source_vocab if model.reverse else loaded.target_vocab
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


class FeatureWriter:
    """Writer thread body: appends the features to each line of a window and writes it as one chunk."""

    def __init__(self, job: OutputJob, options: RescoreOptions, compress: bool, names: Sequence[str],
                 members: Sequence[Sequence[int]]) -> None:
        self.job = job
        self.options = options
        self.compress = compress
        self.names = list(names)
        self.members = [list(m) for m in members]  # per feature, the models it averages

    def format(self, window: NBestWindow) -> bytes:
        parts = []
        features = [window.scores[m[0]] if len(m) == 1
                    else np.mean(np.stack([window.scores[i] for i in m]).astype(np.float64), axis=0)
                    for m in self.members]  # per feature: (lines,)
        for i, entry in enumerate(window.lines):
            for name, values in zip(self.names, features):
                entry.features.append((name, [moses_rounded(float(values[i]))]))
            parts.append(entry.to_line().encode("utf-8"))
        return b"".join(parts)

    def write_window(self, window: NBestWindow) -> None:
        data = self.format(window)
        if self.compress:
            data = gzip_member(data, self.options.compress_level)
        self.job.write(len(window.lines), data)
