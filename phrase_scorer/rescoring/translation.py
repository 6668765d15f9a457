"""New text translated by the whole tuned system: Moses' n-best lists, rescored, reranked.

::

    source, a chunk of sentences at a time
      --the user's Moses, -n-best-list N distinct (N and the decoder flags the reranker records)--> n-best list
      --the reranker's models (checked by the SHA-256 of their weights), each hypothesis scored by a
        model only while it can still be its sentence's best (rescoring/bounded.py;
        on a CPU by default) or every hypothesis by every model (on a GPU by default), and the
        reranker's weights--> one line per sentence

``phrase-scorer translate-system --moses moses.tuned.ini --reranker RERANKER`` runs it. A chunk's files
live in its own folder of the working directory (``chunk-K/``) only while the chunk is
translated, so a long input never has all its n-best lists on disk. Moses decodes the next chunk
in a background thread while the models rescore this one (:func:`decoded_chunks`), at most one
chunk ahead, so at most two chunks' files exist at a time and the run takes about the longer of
Moses' and the models' times instead of their sum; ``pipeline=False`` runs them one after the
other, to the same bytes. A model feature the reranker weights 0 changes no choice: its model is
neither loaded nor run, and the weights are applied without it (:func:`unweighted_models`).

The output is written as the resumable outputs of annotate and rescore are: atomically, with a
resume record after each chunk (``--resume`` continues after the last finished chunk, to the
bytes an uninterrupted run writes) and a signature ``OUT.json``. An empty input line is not
decoded (the models cannot score a translation of nothing); it gets an empty output line, so line
k of the output always translates line k of the input.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple

from phrase_scorer import __version__
from phrase_scorer.config import (
    MOSES_NBEST_FACTOR, RescoreExperimentOptions, ScoringOptions, TranslateSystemOptions, default_bound,
)
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.descriptors import writes_directly
from phrase_scorer.io.file_identity import file_sha256
from phrase_scorer.io.inputs import refuse_single_pass, text_lines
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni, text_loaded_features
from phrase_scorer.io.outputs import model_files
from phrase_scorer.moses.installation import MosesInstallation, write_lines
from phrase_scorer.rescoring.reranker import Reranker
from phrase_scorer.moses.streaming import NBestStream
from phrase_scorer.moses.system import check_features, check_system
from phrase_scorer.rescoring.weights import Weights, apply_weights
from phrase_scorer.runtime.programs import fresh_directory
from phrase_scorer.runtime.heap import steady_heap
from phrase_scorer.runtime.progress import step_bar
from phrase_scorer.records import Signature, as_recorded
from phrase_scorer.runtime.job import OutputJob, Resumable, input_identity

log = logging.getLogger(__name__)


@dataclass
class RerankedTranslation:
    output: str
    sentences: int
    chunks: int
    seconds: float
    # PHASES and WAITING -> seconds: Moses' (from asking for each chunk's lists to having them), those of
    # rescoring and reranking, and those the models waited for Moses; Moses minus WAITING is the
    # time of Moses' hidden behind the models'
    phase_seconds: Dict[str, float] = field(default_factory=dict)
    signature_line: str = ""  # what made the output, as one line to quote (records.signature_line)


PHASES = ("Moses", "rescoring", "reranking")  # where a chunk's time goes
WAITING = "waiting for Moses"  # the part of Moses' time the rescoring did not hide


def unweighted_models(reranker: Reranker) -> List[str]:
    """The reranker's model features whose weights are all exactly 0 (every model of an
    ensemble): they change no sentence's choice, so their models need not run."""
    return [name for name in reranker.weights.unweighted() if name in reranker.models]


def unrecorded_decoder_options(reranker: Reranker) -> Optional[str]:
    """What to tell the user when ``reranker`` records no decoder options (tuned on n-best lists
    it was given without being told how they were made): Moses then decodes with the moses.ini's
    settings and its own ``-n-best-factor`` (MOSES_NBEST_FACTOR), and lists made with another
    factor (``rescore-experiment``'s) hold other hypotheses than the weights were tuned on. None when
    it records them (an empty string included: the lists were made with Moses' defaults)."""
    if reranker.decoder_flags is not None:
        return None
    return Text(f"{reranker.path or 'the reranker'} records no decoder options: Moses decodes its "
                f"{reranker.nbest_size}-best lists with the moses.ini's settings and its own -n-best-factor "
                f"({MOSES_NBEST_FACTOR}); if the dev lists were decoded otherwise (rescore-experiment decodes with "
                f"a factor of {RescoreExperimentOptions.nbest_factor}), tune it again with rerank's ",
                setting("decoder_flags", verb="rerank"), " saying how")


def check_reranker_system(reranker: Reranker, ini: PathLike) -> None:
    """Refuse a moses.ini whose lists would not be those ``reranker`` was tuned on: other dense
    features (one it weights missing, one it does not know added, another number of values), or
    another system (the weights it records differ); see :mod:`phrase_scorer.moses.system`."""
    check_features(reranker.weights.layout, reranker.ignore_features, list(reranker.models), ini, reranker.path)
    if reranker.system is None:
        log.info("%s records no system it was tuned for: its features are checked against %s, not its weights",
                 reranker.path or "the reranker", os.fspath(ini))
    check_system(reranker.system, ini, reranker.path)


def reranker_models(reranker: Reranker, device: Any = "cpu") -> Tuple[list, bool]:
    """The models behind the reranker's added features, in the order of its weights, each checked
    to be the bytes the reranker was tuned with; and whether the features are per token. A feature
    weighted 0 (:func:`unweighted_models`) is left out: its models are neither loaded nor run."""
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.rescoring.rescore import FeatureModel

    models, normalize = [], set()
    unweighted = unweighted_models(reranker)
    for name, _ in reranker.weights.layout:
        record = reranker.models.get(name)
        if record is None or name in reranker.ignore_features:
            continue  # one of the decoder's features
        if name in unweighted:
            log.info("feature %s is weighted 0: its model is not run and the reranker is applied without it", name)
            continue
        ensemble = isinstance(record["directory"], list)
        directories = record["directory"] if ensemble else [record["directory"]]
        digests = record["weights_sha256"] if ensemble else [record["weights_sha256"]]
        for directory, digest in zip(directories, digests):
            loaded = load_model(directory, device)
            if loaded.weights_sha256 != digest:
                raise PhraseScorerError(
                    f"the model of feature {name} changed since the reranker was tuned (weights sha256 "
                    f"{loaded.weights_sha256[:12]}..., tuned with {digest[:12]}...)", path=directory,
                    hint="use the model the reranker was tuned with, or tune a new reranker")
            models.append(FeatureModel(name, loaded, reverse=bool(record["reverse"]), ensemble=ensemble))
        normalize.add(bool(record.get("normalize", False)))
    if len(normalize) > 1:
        raise PhraseScorerError("the reranker's features mix log p and log p per token", path=reranker.path,
                                hint="tune a reranker on a list rescored in one run")
    return models, normalize == {True}


def source_chunks(source: PathLike, size: int, skip: int) -> Iterator[List[str]]:
    """The source's lines (without newlines), ``size`` at a time, after the first ``skip``."""
    chunk: List[str] = []
    for number, text in text_lines(source):
        if number <= skip:
            continue
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@dataclass
class DecodedChunk:
    """A chunk of source lines after Moses: which lines were decoded (the non-empty ones), and the
    folder that holds their n-best list ``chunk.nbest`` (None when no line was)."""

    index: int  # the chunk's number in the source: chunk-<index>/
    lines: List[str]
    kept: List[int]
    directory: Optional[Path]
    seconds: float = 0.0  # from asking Moses for the chunk's lists to having them


def kept(lines: Sequence[str]) -> List[int]:
    """The lines Moses decodes: the non-empty ones."""
    return [i for i, line in enumerate(lines) if line.strip()]


def kept_sentences(source: PathLike, size: int, skip: int) -> Iterator[str]:
    """The lines Moses decodes, of every chunk after the first ``skip`` lines, in order."""
    for lines in source_chunks(source, size, skip):
        yield from (lines[i] for i in kept(lines))


def decode_chunk(index: int, lines: Sequence[str], work: Path, *, stream: NBestStream) -> DecodedChunk:
    """Moses' n-best lists of the non-empty ``lines`` (the next sentences of ``stream``), in
    ``work/chunk-<index>/``."""
    decoded = kept(lines)
    if not decoded:
        return DecodedChunk(index, list(lines), decoded, None)
    directory = work / f"chunk-{index}"
    directory.mkdir()
    write_lines(directory / "chunk.src", [lines[i] for i in decoded])
    started = time.monotonic()
    stream.write_next(len(decoded), directory / "chunk.nbest")
    return DecodedChunk(index, list(lines), decoded, directory, time.monotonic() - started)


def decoded_chunks(chunks: Iterator[Tuple[int, List[str]]], decode_one: Callable[[int, List[str]], DecodedChunk], *,
                   ahead: bool) -> Generator[Tuple[DecodedChunk, float], None, None]:
    """Each (index, lines) of ``chunks`` decoded by ``decode_one``, in order, with the seconds the
    caller waited for it. ``ahead``: as soon as a chunk is handed over, the next one is decoded in
    a background thread while the caller works on this one; never more than one chunk ahead, so
    at most two chunks' files exist at a time. An error of the thread is raised here, in the
    caller's thread, when the caller asks for that chunk: after the chunks before it are written,
    as without ``ahead``. Closing the iterator (the caller failed, or was interrupted) waits for
    the decoding under way to end, so nothing writes in the working directory after the run."""
    if not ahead:
        for index, lines in chunks:
            started = time.monotonic()
            decoded = decode_one(index, lines)
            yield decoded, time.monotonic() - started
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="phrase-scorer-moses") as thread:
        first = next(chunks, None)
        pending = thread.submit(decode_one, *first) if first is not None else None
        while pending is not None:
            started = time.monotonic()
            decoded = pending.result()
            waited = time.monotonic() - started
            following = next(chunks, None)
            pending = thread.submit(decode_one, *following) if following is not None else None
            yield decoded, waited


def rerank_chunk(chunk: DecodedChunk, *, weights: Weights, ignore: Sequence[str], models: list, normalize: bool,
                 scoring_options: ScoringOptions, phase_seconds: Dict[str, float], bound: bool = True) -> bytes:
    """One line per line of the chunk: the reranked translation of each non-empty line, empty for
    an empty one; the chunk's folder is removed. The seconds of rescoring (with the models, the
    choice included) and reranking (without models: the weights alone) are added to
    ``phase_seconds``. ``bound``: a model scores a hypothesis only while it can still be its
    sentence's best (:mod:`phrase_scorer.rescoring.bounded`)."""
    from phrase_scorer.rescoring.bounded import Reranking, best_hypotheses

    best: List[str] = [""] * len(chunk.lines)
    if chunk.directory is not None:
        work = chunk.directory
        source, nbest, chosen = work / "chunk.src", work / "chunk.nbest", work / "chunk.best"
        started = time.monotonic()
        if models:
            reranking = Reranking(weights, ignore, models, normalize, scoring_options)
            chosen_lines = best_hypotheses(nbest, source, reranking, bound=bound)
            phase_seconds[PHASES[1]] = phase_seconds.get(PHASES[1], 0.0) + time.monotonic() - started
        else:
            written = apply_weights(nbest, weights, chosen, ignore)
            chosen_lines = chosen.read_text(encoding="utf-8").split("\n")[:written]
            phase_seconds[PHASES[2]] = phase_seconds.get(PHASES[2], 0.0) + time.monotonic() - started
        chosen_lines += [""] * (len(chunk.kept) - len(chosen_lines))  # sentences after the list's last id
        for i, line in zip(chunk.kept, chosen_lines):
            best[i] = line
        shutil.rmtree(work)
    return "".join(line + "\n" for line in best).encode("utf-8")


@dataclass(frozen=True)
class TunedSystem:
    """The whole tuned system ``translate-system`` runs: the Moses installation, the tuned
    moses.ini it decodes with, and the reranker file tuned on its n-best lists (``rerank``'s
    OUTPUT.json or build-reranker's reranker.json)."""

    moses: MosesInstallation
    ini: PathLike
    reranker: PathLike


def translate_reranked(source: PathLike, output: PathLike, system: TunedSystem, *,
                       options: TranslateSystemOptions = TranslateSystemOptions(),
                       scoring_options: Optional[ScoringOptions] = None, device: Any = "cpu", resume: bool = False,
                       overwrite: bool = False) -> RerankedTranslation:
    """Translate ``source`` (tokenised as for the Moses system, one sentence per line) with the
    tuned ``system`` (its moses.ini and reranker) into ``output``, one line per input line, run as
    ``options`` say (``pipeline``: Moses decodes the next chunk while the models rescore this one;
    ``bound`` None: the device's own, ``config.default_bound``); a
    ``scoring_options.batch_tokens`` of None is the device's own (``default_batch_tokens``)."""
    import torch

    from phrase_scorer.runtime.device import resolve_precision
    from phrase_scorer.scoring.batch_scorer import default_batch_tokens
    from phrase_scorer.scoring.int8_output import int8_engine

    refuse_single_pass(source, "the source", "Moses and the reranking read it each in turn, a chunk at a time")
    moses, ini, reranker = system.moses, system.ini, system.reranker
    output = os.fspath(output)
    chunk_sentences, working_dir = options.chunk_sentences, options.working_dir
    if working_dir is None and writes_directly(output):  # nothing is made beside a descriptor, device or pipe
        raise PhraseScorerError("the output is written in place (standard output, a descriptor, a device or a pipe), "
                                "and the working folder would go beside it", path=output,
                                hint=Text("write to a named file, or give a ", setting("working_dir"), " of its own"))
    scoring_options = scoring_options or ScoringOptions()
    where = torch.device(device)
    precision = resolve_precision(where, scoring_options.precision)  # refused before Moses starts
    batch_tokens = scoring_options.batch_tokens or default_batch_tokens(where)
    scoring_options = replace(scoring_options, batch_tokens=batch_tokens)  # recorded as the number it is
    bound = default_bound(where.type) if options.bound is None else options.bound
    tuned = Reranker.read(reranker)
    if not tuned.decoder.get("nbest_size"):
        raise PhraseScorerError("the reranker does not record the n-best size it was tuned with", path=reranker,
                                hint="tune it again with this version's rerank")
    unrecorded = unrecorded_decoder_options(tuned)
    if unrecorded:
        log.warning("%s", unrecorded)
    check_reranker_system(tuned, ini)  # before any model loads and Moses decodes
    parsed_at_start = text_loaded_features(MosesIni.read(ini))
    if parsed_at_start:  # the models wait for it: the first chunk's lists come after it
        log.info("Moses parses the text files of %s on one core before its first sentence; binarised, they "
                 "load at once (docs/moses.md, 'Rescoring in production')", ", ".join(parsed_at_start))
    models, normalize = reranker_models(tuned, device)
    weights = tuned.weights.without(unweighted_models(tuned))  # the same choices on lists without them
    inputs = [("the source", source), ("the moses.ini", ini), ("the reranker", reranker)]
    for m in models:
        inputs += model_files(m.loaded.directory)
    program = moses.decoder(options.decoder)
    # What makes the output: a resumed run must have the same. ``pipeline`` is not among them: it
    # changes when Moses runs, never what any chunk's lines are, so a run may resume either way.
    settings = as_recorded({
        "source": input_identity(source),
        "moses.ini sha256": file_sha256(ini),
        "decoder": os.fspath(program),
        "reranker sha256": file_sha256(reranker),
        "models": [m.describe() for m in models],  # those that run: not the features weighted 0
        "scoring": {**asdict(scoring_options), "precision": precision,
                    **({"int8_engine": int8_engine()} if precision == "int8" else {})},
        "chunk_sentences": chunk_sentences,
        # the models score other subsets of the hypotheses in other batches: a score's last digits may move
        "bound": bound,
        "package_version": __version__,
    })
    started = time.monotonic()
    chunks = 0
    phase_seconds: Dict[str, float] = {}
    with OutputJob(output, inputs, overwrite=overwrite, resume=resume,
                   resumable=Resumable(settings, source=settings["source"]["path"])) as job:
        done_lines = job.done_lines
        work = fresh_directory(Path(working_dir or output + ".work").resolve(), verb="translate")
        numbered = enumerate(source_chunks(source, chunk_sentences, done_lines), done_lines // chunk_sentences)
        # one Moses for the whole run (its tables load once), stopped before the decoding thread
        # is waited for, so that a failure does not wait for the chunk Moses is decoding
        stream = NBestStream(program, ini, kept_sentences(source, chunk_sentences, done_lines),
                             size=tuned.decoder["nbest_size"], threads=options.decoder_threads or os.cpu_count() or 1,
                             flags=tuned.decoder.get("decoder_flags") or "", log_path=work / "moses.log")
        decode_one = partial(decode_chunk, work=work, stream=stream)
        with step_bar("translating", None, initial=done_lines, unit="sentence") as progress, \
                closing(decoded_chunks(numbered, decode_one, ahead=options.pipeline)) as decoded, closing(stream), \
                steady_heap():  # the lists of a chunk in flight: collect them less often
            for chunk, waited in decoded:
                phase_seconds[PHASES[0]] = phase_seconds.get(PHASES[0], 0.0) + chunk.seconds
                phase_seconds[WAITING] = phase_seconds.get(WAITING, 0.0) + waited
                job.write(len(chunk.lines), rerank_chunk(
                    chunk, weights=weights, ignore=tuned.ignore_features, models=models, normalize=normalize,
                    scoring_options=scoring_options, phase_seconds=phase_seconds, bound=bound))
                chunks += 1
                progress.update(len(chunk.lines))
                log.info("translated %d sentences", job.lines_done)
        if job.lines_done == 0:
            raise PhraseScorerError("the source is empty", path=source)
        record = Signature.build("phrase-scorer translate --moses --reranker", settings, output=output,
                                 lines=job.lines_done, **{"moses.ini": os.path.abspath(ini),
                                                          "reranker": os.path.abspath(reranker)})
        job.commit(record)
        shutil.rmtree(work, ignore_errors=True)
    return RerankedTranslation(output, job.lines_done, chunks, time.monotonic() - started, phase_seconds,
                               record.line())
