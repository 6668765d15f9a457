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

The work runs as annotate's does: a reader thread cuts the list into windows of whole sentences
(about ``window_lines`` lines), reading only each line's sentence id, and attaches the source
sentences; worker processes (:mod:`phrase_scorer.rescoring.nbest_work`) parse and check the lines,
look up word ids in each model's vocabularies and plan the scorer's batches; the main thread runs
each model's plans on :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer`, so each source
sentence is encoded once for all its hypotheses and the hypotheses' shared prefixes are decoded
once; the workers append the features and compress the window, and a writer thread writes it
as one chunk with a resume record. Output is atomic, resumable
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
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


from phrase_scorer import __version__
from phrase_scorer.config import (
    FORWARD_FEATURE_PREFIX, REVERSE_FEATURE_PREFIX, RescoreOptions, RunOptions, ScoringOptions,
)
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.compression import GZIP_LIBRARY
from phrase_scorer.io.inputs import ReadProgress, open_input, read_failure, text_lines
from phrase_scorer.io.paths import STDIO, PathLike, is_gzip_name
from phrase_scorer.io.outputs import model_files
from phrase_scorer.io.nbest import check_id_order, sentence_id_of
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.records import Signature, SignedModel, as_recorded
from phrase_scorer.rescoring.nbest_work import ModelSide, NBestWork, RawNBestWindow
from phrase_scorer.runtime.distributed import cores_per_process
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.runtime.workers import Pipeline, WorkerPool, default_workers
from phrase_scorer.scoring.batch_plan import PlanSettings
from phrase_scorer.runtime.job import OutputJob, Resumable, input_identity

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

    def side(self, plan_settings: Optional[PlanSettings] = None) -> ModelSide:
        """What the host work needs of the model (:class:`~phrase_scorer.rescoring.nbest_work.ModelSide`)."""
        return ModelSide(self.name, self.reverse, self.loaded.source_vocab, self.loaded.target_vocab, plan_settings)


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


class SourceSentences:
    """The source file, read forward as the n-best list asks for sentence ids."""

    def __init__(self, path: PathLike, nbest: PathLike) -> None:
        self.path = path
        self.nbest = nbest
        self._lines = text_lines(path, hint="give the source sentences as UTF-8 text, one per line")
        self.lines_read = 0

    def words(self, sentence_id: int, nbest_line: int) -> List[str]:
        """The words of source line ``sentence_id + 1``; ids must increase from call to call."""
        text = self.through(sentence_id, nbest_line)
        assert text is not None  # ids increase from call to call: the line is a new one
        return split_words(text)

    def through(self, sentence_id: int, nbest_line: int) -> Optional[str]:
        """Read on to source line ``sentence_id + 1`` and return it (None when it was read
        before); a source too short for the id is an error naming the list's line."""
        text = None
        while self.lines_read <= sentence_id:
            text = self._next()
            if text is None:
                raise PhraseScorerError(
                    f"sentence id {sentence_id} needs source line {sentence_id + 1}, but {self._name()} has only "
                    f"{self.lines_read} lines", path=self.nbest, line=nbest_line,
                    hint="give the source sentences the n-best list was decoded from, one per line")
        return text

    def check_all_read(self, last_id: int, nbest_line: int) -> None:
        """The source must have exactly the lines of the n-best list's sentences: line
        ``last_id + 1`` (the list's line ``nbest_line`` asks for it) and none after it."""
        self.through(last_id, nbest_line)
        extra = self._next()
        if extra is not None:
            empty = " (an empty line: remove the empty lines at its end)" if not extra.strip() else ""
            raise PhraseScorerError(
                f"{self._name()} has more lines than the n-best list has sentences (its last sentence id is "
                f"{last_id}){empty}", path=self.path, line=self.lines_read,
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


def check_models_read(nbest: PathLike, source: PathLike, models: Sequence[FeatureModel]) -> None:
    """Refuse a model that reads or predicts another language than the list's (a reverse model
    given as a forward one or the other way round, a model of another language pair):
    each model's vocabularies against the source's first lines and the first hypothesis of as many
    of the list's sentences (:func:`~phrase_scorer.model_dir.check_model_reads`). A stream (stdin,
    a pipe) is read once, by the rescoring, and is not checked."""
    from itertools import islice

    from phrase_scorer.io.nbest import group_by_sentence, read_nbest
    from phrase_scorer.model_dir import SAMPLE_LINES, check_model_reads, shown_path, text_sample

    if not all(os.fspath(path) != STDIO and os.path.isfile(path) for path in (nbest, source)):
        return
    hypotheses: List[str] = []
    try:
        for _, entries in islice(group_by_sentence(read_nbest(nbest)), SAMPLE_LINES):
            hypotheses.extend(entries[0].hypothesis.split())
    except PhraseScorerError:
        pass  # the sample ends at a bad line; the rescoring names the list's first one
    samples = (text_sample(source), (f"the hypotheses of {shown_path(nbest)}", hypotheses))
    for model in models:
        role = f"the {'reverse ' if model.reverse else ''}model of feature {model.name}"
        check_model_reads(model.loaded.directory, role, reverse=model.reverse, samples=samples, loaded=model.loaded)


@dataclass
class RescoreResult:
    output: str
    lines: int
    sentences: int
    features: List[str]
    signature: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    stats: List[Any] = field(default_factory=list)  # per model, the scorer's ScoringStats

    def signature_line(self) -> str:
        """What made the list, as one line to quote beside a score (:func:`~phrase_scorer.records.signature_line`)."""
        return Signature.from_json(self.signature, self.output + ".json").line()


def rescore(
    nbest: PathLike,
    source: PathLike,
    output: PathLike,
    models: Sequence[FeatureModel],
    options: RescoreOptions = RescoreOptions(),
    scoring_options: Optional[ScoringOptions] = None,
    *,
    run: RunOptions = RunOptions(),
) -> RescoreResult:
    """Append each model's feature to every line of ``nbest``, writing ``output`` atomically.

    An existing ``output`` is replaced only with ``run.overwrite``, or when ``run.resume``
    continues the run that is making it. ``run.workers`` processes parse, look up, plan and
    format the windows (None: as many as the cores allow, at most 8; 0: none, all in this
    process)."""
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
    check_models_read(nbest, source, models)
    compress = output != STDIO and is_gzip_name(output)
    scorers = [BatchScorer(m.loaded.model, scoring_options) for m in models]
    workers = run.workers if run.workers is not None else default_workers(cores_per_process())
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
    with OutputJob(output, inputs, overwrite=run.overwrite, resume=run.resume,
                   resumable=Resumable(settings, source=settings["input"]["path"])) as job:
        done_lines = job.done_lines
        sources = SourceSentences(source, nbest)
        sides = [m.side(scorer.plan_settings() if workers else None) for m, scorer in zip(models, scorers)]
        handler_args = (os.fspath(nbest), os.fspath(source), sides, options, compress, names, feature_members(models))
        counts = {"sentences": 0}
        pipeline = Pipeline(depth=max(2, workers + 1))
        reading = ReadProgress()  # the list's bytes read, for the progress bar

        try:
            with WorkerPool(NBestWork, handler_args, ["prepare", "finish"], workers, pipeline.stopping) as pool, \
                    progress_bar("rescoring", reading) as progress:

                def read(put) -> None:
                    sinks = WindowSinks(lambda window: pool.submit("prepare", window.index, window), put, progress)
                    read_raw_windows(nbest, done_lines, sources, options.window_lines, reading, counts, sinks)

                def work(item: Tuple[int, Any]) -> Tuple[int, Any]:
                    index, lines = item
                    if isinstance(lines, BaseException):  # a reading error, after the windows before it
                        raise lines
                    prepared = pool.result("prepare", index)
                    pool.submit("finish", index, [
                        scorer.score_plans(inputs.plans, len(inputs.source_ids)) if inputs.plans is not None
                        else scorer.score(inputs.source_ids, inputs.target_ids)
                        for scorer, inputs in zip(scorers, prepared)])
                    return item

                def write(item: Tuple[int, Any]) -> None:
                    job.write(item[1], pool.result("finish", item[0]))

                pipeline.run(read, work, write)
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


@dataclass(frozen=True)
class WindowSinks:
    """Where :func:`read_raw_windows` sends what it reads: each window to a worker (``submit``),
    (index, lines) in order to the writer (``put``, False once the pipeline stops), and the lines
    to the progress bar."""

    submit: Callable[[RawNBestWindow], Any]
    put: Callable[[Tuple[int, Any]], bool]
    progress: Any  # a progress bar (advance(lines))


def read_raw_windows(nbest: PathLike, skip: int, sources: "SourceSentences", window_lines: int,
                     reading: "ReadProgress", counts: Dict[str, Any], sinks: WindowSinks) -> None:
    """Reader thread body: cut the list's raw lines (after the first ``skip``) into windows of
    whole sentences of about ``window_lines`` lines, reading only each line's sentence id,
    attach the sentences' source words, ``sinks.submit`` each window to a worker and
    ``sinks.put`` (index, lines) in order. An error (a sentence out of order, a source too short,
    a file that cannot be read) is put after the windows before it, as (index, the error), so
    that an error in an earlier line, which a worker finds, is the one raised."""
    lines: List[bytes] = []
    sentences: Dict[int, List[str]] = {}
    index = 0
    first = skip + 1
    last_id = -1
    last_id_line = 0  # the list's line where ``last_id`` begins
    number = skip

    def flush() -> bool:
        nonlocal lines, sentences, index, first
        sinks.submit(RawNBestWindow(index, first, lines, sentences))
        sinks.progress.advance(len(lines))
        ok = sinks.put((index, len(lines)))
        index += 1
        first += len(lines)
        lines, sentences = [], {}
        return ok

    try:
        try:
            with open_input(nbest) as source:
                reading.follow(source)
                for number, data in enumerate(source, 1):
                    sentence_id = sentence_id_of(data, nbest, number)
                    if sentence_id != last_id:
                        check_id_order(sentence_id, last_id, nbest, number)
                        last_id, last_id_line = sentence_id, number
                        if number <= skip:  # done before: its source line is read past, not looked up
                            continue
                        if len(lines) >= window_lines and not flush():
                            return
                        sentences[sentence_id] = sources.words(sentence_id, number)
                        counts["sentences"] += 1
                    if number > skip:
                        lines.append(data)
        except (EOFError, OSError, ValueError) as exc:
            raise read_failure(exc, nbest, number) from None
        if last_id >= 0:  # the whole list's ids, those a resumed run skipped included
            sources.check_all_read(last_id, last_id_line)
    except PhraseScorerError as exc:
        if lines and not flush():
            return
        sinks.put((index, exc))
        return
    if lines:
        flush()


