"""The streaming pipeline of ``annotate`` around :class:`BatchScorer`.

``annotate`` spreads a window's host work over worker processes and keeps the model busy::

    reader thread:    read + gunzip, cut windows of whole lines (no parsing)   [this process]
    worker processes: parse + check + look up ids                              [annotate_work]
    main thread:      BatchScorer (torch releases the GIL)   -> log p per line [this process]
    worker processes: columns + format + gzip, one gzip member per window      [annotate_work]
    writer thread:    write the members in input order, with a resume record   [this process]

That is the layout on a GPU, and on a CPU where the scorer runs on several threads. Where it
runs on one (a model too small to gain from more), each worker also scores its windows, with
one thread (:func:`scoring_in_workers`), and the main process only reads and writes, so that no
one process's per-line work caps the run. The batches are a window's either way, and so are the
scores.

A window is ``window_lines`` lines (window k is lines k * window_lines + 1 onwards, however the
run started); the queues hold a few windows per worker whatever the table's size. The output
keeps every line, in order, and every field but the score field byte for byte. The column
encoding is described in :mod:`phrase_scorer.scoring.annotate_work`.

Under torchrun each rank annotates a contiguous run of whole windows into a shard file and rank
0 joins the shards (:func:`annotate_sharded`), byte for byte what one process writes.

Resuming: the output is resumable (:mod:`phrase_scorer.runtime.job`). A resumed run must use the
same input, model, options, device, precision and gzip library (a chunk scored in bf16 next to
one in fp32 would differ silently): :func:`annotation_settings` defines them once, for the
resume record, the signature and the check that an output is already finished; ``--resume`` of
an output already finished by the same command does nothing.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from phrase_scorer import __version__
from phrase_scorer.runtime import distributed
from phrase_scorer.scoring.columns import column_encoding
from phrase_scorer.config import AnnotateOptions, RunOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.compression import GZIP_LIBRARY
from phrase_scorer.io.paths import STDIO, PathLike, is_gzip_name
from phrase_scorer.io.outputs import (
    RESUMABLE_COMPANIONS, SIGNED_COMPANIONS, check_output, model_files, refuse_existing, writes_directly,
)
from phrase_scorer.runtime.workers import Pipeline, WorkerPool, default_workers
from phrase_scorer.io.table_windows import RawWindows, count_lines, first_score_count
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.records import Signature, SignedModel, as_recorded, describe_difference, finished
from phrase_scorer.runtime.job import OutputJob, Resumable, input_identity

log = logging.getLogger(__name__)


# --- annotate -----------------------------------------------------------------------------------


@dataclass
class AnnotateResult:
    output: str
    lines: int
    num_scores_before: Optional[int]
    num_scores_after: Optional[int]
    signature: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    already_finished: bool = False  # --resume found the output finished by the same command


def annotation_settings(table: PathLike, output: PathLike, loaded, options: AnnotateOptions,
                        scoring: Dict[str, Any]) -> Dict[str, Any]:
    """What makes an annotated table: its input, model, options, where and in which precision it
    was scored (``BatchScorer.describe()``) and its format (gzip and the library that compressed
    it: another library writes other bytes), as JSON holds them.

    The resume record (of a whole run or of one shard) and the signature ``OUT.json`` both carry
    these; equal settings mean an equal output.
    """
    compress = os.fspath(output) != STDIO and is_gzip_name(output)
    settings = {
        "input": input_identity(table),
        "model": SignedModel.of(loaded).to_json(),
        "options": asdict(options),
        "scoring": scoring,  # device and precision: a resumed run must not mix them
        "gzip": GZIP_LIBRARY if compress else False,
        "package_version": __version__,
    }
    return as_recorded(settings)


def finished_annotation(table: PathLike, output: PathLike, loaded, options: AnnotateOptions,
                        scoring: Dict[str, Any]) -> Optional[Signature]:
    """The signature of ``output`` if it is a finished annotation of ``table`` with these
    settings (so making it again would give the same bytes), else None."""
    return finished(output, annotation_settings(table, output, loaded, options, scoring))


def annotate(
    table: PathLike,
    output: PathLike,
    loaded,
    options: AnnotateOptions = AnnotateOptions(),
    scoring_options=None,
    *,
    run: RunOptions = RunOptions(),
    constant_log_prob: Optional[float] = None,
) -> AnnotateResult:
    """Append the model's columns to every line of ``table``, writing ``output`` atomically.

    An existing ``output`` is replaced only with ``run.overwrite``, or when ``run.resume``
    continues the run that is making it (see :mod:`phrase_scorer.io.outputs` for what is never
    written over).

    ``run.workers`` processes do the host work (None: as many as the cores allow, 0: none, all in
    this process). Under torchrun every rank annotates its shard and rank 0 joins the shards
    (:func:`annotate_sharded`). ``constant_log_prob`` replaces the model by a constant, to
    measure the host pipeline alone (benchmarks only; the signature says so).
    """
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    scoring_options = scoring_options or ScoringOptions()
    output = os.fspath(output)
    resume, overwrite = run.resume, run.overwrite
    with check_output(output, [("the phrase table", table), *model_files(loaded.directory)], overwrite=overwrite,
                      resume=resume, companions=RESUMABLE_COMPANIONS, lock=distributed.world().is_main):
        compress = output != STDIO and is_gzip_name(output)
        scorer = BatchScorer(loaded.model, scoring_options)
        current = distributed.world()
        workers = run.workers if run.workers is not None else default_workers(distributed.cores_per_process(current))
        in_workers = scoring_in_workers(loaded, scorer, workers) if constant_log_prob is None else None
        settings = annotation_settings(table, output, loaded, options, scorer.describe())
        if constant_log_prob is not None:
            settings["model"]["scores"] = (f"constant log p = {constant_log_prob} "
                                           "(host-pipeline benchmark, not the model)")
        job = AnnotateJob(table, loaded, options, scorer, settings, compress, workers, constant_log_prob, in_workers)
        if current.is_distributed:
            return annotate_sharded(job, output, current, resume=resume, overwrite=overwrite)
        if resume and job.finished(output, settings):
            return job.result_of(output, already_finished=True)
        return job.run(output, resume=resume, overwrite=overwrite)


def scoring_in_workers(loaded, scorer, workers: int):
    """Where the model scores: in the worker processes (a
    :class:`~phrase_scorer.scoring.annotate_work.WorkerScoring`) when the scorer runs on a CPU with one
    thread (a model too small to split, :func:`phrase_scorer.runtime.threads.default_threads`, or
    ``--threads 1``) and there are workers: each worker then scores its own windows with one
    thread, the same scores, and the main process only reads and writes. Else (a GPU, several
    threads, or no workers) in the main process (None)."""
    from phrase_scorer.scoring.annotate_work import WorkerScoring

    if scorer.device.type != "cpu" or workers == 0 or scorer.describe()["threads"] != 1:
        return None
    return WorkerScoring(os.path.abspath(loaded.directory), loaded.weights_sha256, scorer.options)


@dataclass
class AnnotateJob:
    """One ``annotate`` command: what to read, the model, its scorer and the options, and the
    settings that make its output (:func:`annotation_settings`; the same on every rank)."""

    table: PathLike
    loaded: Any
    options: AnnotateOptions
    scorer: Any  # a BatchScorer
    settings: Dict[str, Any]
    compress: bool
    workers: int
    constant_log_prob: Optional[float] = None
    in_workers: Any = None  # a WorkerScoring when the workers score (:func:`scoring_in_workers`)

    def finished(self, output: str, settings: Dict[str, Any]) -> bool:
        """True when ``output`` is already finished with ``settings`` (a job re-run with
        --resume after it had finished has nothing to do)."""
        done = finished(output, settings) is not None
        if done:
            log.info("%s is already finished (its signature matches this command): nothing to do", output)
        return done

    def signature(self, output: str, lines: int, num_scores: Optional[int], **extra) -> Signature:
        return Signature.build("phrase-scorer annotate", self.settings, output=output, lines=lines,
                               columns=list(self.options.columns),
                               column_values=column_encoding(self.options, self.loaded.target_vocab.UNKNOWN_UNIT),
                               num_scores_before=num_scores,
                               num_scores_after=(num_scores or 0) + len(self.options.columns), **extra)

    def result_of(self, output: str, seconds: float = 0.0, already_finished: bool = False) -> AnnotateResult:
        signature = Signature.read(output)
        assert signature is not None and signature.lines is not None  # the finished output's, with its lines
        return AnnotateResult(output=output, lines=signature.lines,
                              num_scores_before=signature.get("num_scores_before"),
                              num_scores_after=signature.get("num_scores_after"), signature=signature.to_json(),
                              seconds=seconds, already_finished=already_finished)

    def run(self, output: str, *, resume: bool = False, overwrite: bool = False,
            lines: Optional[Tuple[int, int]] = None, settings: Optional[Dict[str, Any]] = None) -> AnnotateResult:
        """Annotate lines ``lines`` = [start, stop) (None: all) into ``output``; see the module
        docstring for the resume record. ``settings`` replaces the job's in the record and the
        signature (a shard's record names its shard)."""
        settings = settings or self.settings
        started = time.monotonic()
        first, stop = lines if lines is not None else (0, None)
        with OutputJob(output, [("the phrase table", self.table), *model_files(self.loaded.directory)],
                       overwrite=overwrite, resume=resume,
                       resumable=Resumable(settings, source=settings["input"]["path"]), lock=True) as out:
            windows = RawWindows(self.table, self.options.window_lines, first + out.done_lines, stop)
            num_scores = self._stream(windows, out)
            total_lines = out.lines_done
            if total_lines == 0 and lines is None:
                raise PhraseScorerError("the phrase table is empty", path=self.table)
            signature = self.signature(output, total_lines, num_scores)
            if "shard" in settings:
                signature.fields["shard"] = settings["shard"]
            out.commit(signature)
        return AnnotateResult(
            output=output,
            lines=total_lines,
            num_scores_before=signature.get("num_scores_before"),
            num_scores_after=signature.get("num_scores_after"),
            signature=signature.to_json(),
            seconds=time.monotonic() - started,
        )

    def _stream(self, windows: RawWindows, writer: OutputJob) -> Optional[int]:
        """Read, prepare (workers), score (here, or in the workers: :func:`scoring_in_workers`),
        finish (workers) and write every window, in order. Returns the table's score count (None
        if no window was read)."""
        from phrase_scorer.scoring.annotate_work import WindowWork

        def score(prepared) -> np.ndarray:
            if self.constant_log_prob is not None:
                return np.full(len(prepared.source_ids), self.constant_log_prob)
            if prepared.plans is not None:  # planned by the worker that prepared the window
                return self.scorer.score_plans(prepared.plans, len(prepared.source_ids))
            return self.scorer.score(prepared.source_ids, prepared.target_ids)

        pipeline = Pipeline(depth=max(2, self.workers + 1))
        plans_in_workers = self.workers > 0 and self.constant_log_prob is None and not self.in_workers
        handler_args = (os.fspath(self.table), self.loaded.source_vocab, self.loaded.target_vocab,
                        self.options, self.compress, self.in_workers,
                        self.scorer.plan_settings() if plans_in_workers else None)
        num_scores: List[Optional[int]] = [None]
        stages = ["annotate"] if self.in_workers else ["prepare", "finish"]

        with WorkerPool(WindowWork, handler_args, stages, self.workers, pipeline.stopping) as pool, \
                progress_bar("annotating", windows) as progress:

            def read(put) -> None:
                # the table's first line sets the score count, also for a run that starts after it
                # (a resumed run, a shard): it holds its lines to the count a fresh run would
                expected = first_table_score_count(windows) if windows.start > 0 else None
                for window in windows:
                    if pipeline.stopping.is_set():  # stopped while this thread waited for input
                        return
                    if expected is None:
                        expected = first_score_count(window)
                    pool.submit(stages[0], window.index, window, expected)
                    progress.advance(window.lines)
                    if not put((window.index, window.lines)):
                        return

            def work(item):
                if self.in_workers:  # the workers score: nothing to do here
                    return item
                prepared = pool.result("prepare", item[0])
                if num_scores[0] is None:
                    num_scores[0] = prepared.num_scores
                pool.submit("finish", item[0], score(prepared))
                return item

            def write(item) -> None:
                if self.in_workers:
                    window_scores, data = pool.result("annotate", item[0])
                    if num_scores[0] is None:
                        num_scores[0] = window_scores
                else:
                    data = pool.result("finish", item[0])
                writer.write(item[1], data)

            pipeline.run(read, work, write)
        return num_scores[0]


def first_table_score_count(windows: RawWindows) -> Optional[int]:
    """The score count of the first line of the table ``windows`` reads (None: no score field, or
    an empty table)."""
    reader = iter(RawWindows(windows.path, 1, 0, 1))
    try:
        first = next(reader, None)
    finally:
        reader.close()  # type: ignore[attr-defined]  # a generator: its file closes now
    return first_score_count(first) if first is not None else None


def shard_output(output: str, rank: int, size: int) -> str:
    return f"{output}.shard-{rank + 1:05d}-of-{size:05d}"


def annotate_sharded(job: AnnotateJob, output: str, current, *, resume: bool = False,
                     overwrite: bool = False) -> AnnotateResult:
    """Every rank annotates its shard of whole windows into its own file (resumable on its own);
    rank 0 then joins the shards, in order, into ``output``: byte-identical to one process.

    Every rank's settings must be the same (:func:`annotation_settings`: the same input, model,
    options, device and precision), or the shards would not make one table. The shard files sit
    beside ``output``, so ranks on several machines need a shared file system. Every rank
    returns the joined output's result."""
    if writes_directly(output) or os.fspath(job.table) == STDIO:
        raise PhraseScorerError("a sharded run (torchrun) needs named input and output files, "
                                "not '-', a device or a pipe")
    started = time.monotonic()
    with distributed.joined():
        ranks_settings = distributed.all_gather_object(job.settings)
        if any(s != job.settings for s in ranks_settings):
            other = next(r for r, s in enumerate(ranks_settings) if s != job.settings)
            raise PhraseScorerError(
                f"rank {other}'s annotation settings differ from rank {current.rank}'s: "
                f"{describe_difference(ranks_settings[other], job.settings)}", path=output,
                hint="every rank needs the same input, model, options, kind of device and precision")
        done = resume and job.finished(output, job.settings)
        if distributed.all_gather_object(done) != [done] * current.size:
            raise PhraseScorerError("the ranks disagree on whether the output is finished", path=output,
                                    hint="do all machines see the same files?")
        if done:
            if current.is_main:  # a join killed before it removed the shards
                remove_shards([shard_output(output, r, current.size) for r in range(current.size)])
            return job.result_of(output, already_finished=True)
        if os.path.lexists(output) and not overwrite:  # the join would replace it
            refuse_existing(output)
        total = distributed.broadcast_object(count_lines(job.table) if current.is_main else None)
        start, stop = distributed.shard_lines(total, job.options.window_lines, current.rank, current.size)
        part = shard_output(output, current.rank, current.size)
        settings = {**job.settings, "shard": {"rank": current.rank, "ranks": current.size, "lines": [start, stop]}}
        failure = None
        try:
            if not (resume and job.finished(part, settings)):  # a shard of an earlier run is replaced, nothing else
                job.run(part, resume=resume, overwrite=own_shard(part), lines=(start, stop), settings=settings)
        except Exception as exc:  # reported to the other ranks, then raised
            failure = exc
        failures = distributed.all_gather_object(None if failure is None else str(failure))
        if failure is not None:
            raise failure
        if any(failures):
            raise PhraseScorerError(f"rank {next(i for i, f in enumerate(failures) if f)} failed: "
                                    f"{next(f for f in failures if f)}", path=output)
        if current.is_main:
            join_shards(job, output, [shard_output(output, r, current.size) for r in range(current.size)])
        distributed.all_gather_object(None)  # every rank returns after the join
    result = job.result_of(output, time.monotonic() - started)
    return result


def join_shards(job: AnnotateJob, output: str, parts: List[str]) -> None:
    """Concatenate the shard files into ``output`` (atomically), write its signature, remove
    the shards."""
    signatures, lines = [], 0
    for part in parts:
        signature = Signature.read(part)
        assert signature is not None and signature.lines is not None  # each shard is signed, with its lines
        signatures.append(signature)
        lines += signature.lines
    counts = [(s.get("num_scores_before"), s.get("shard")["lines"][0] + 1) for s in signatures if s.lines]
    num_scores = counts[0][0] if counts else None
    for count, first_line in counts:
        if count != num_scores:
            raise PhraseScorerError(f"found {count} scores where the first line has {num_scores}", path=job.table,
                                    line=first_line,
                                    hint="every line of a phrase table needs the same number of scores")
    with OutputJob(output, [("the phrase table", job.table)], overwrite=True, companions=SIGNED_COMPANIONS) as out:
        for p in parts:
            with open(p, "rb") as f:
                while block := f.read(1 << 22):
                    out.write(0, block)
        if lines == 0:
            raise PhraseScorerError("the phrase table is empty", path=job.table)
        out.commit(job.signature(output, lines, num_scores, ranks=len(parts)))
    remove_shards(parts)


def own_shard(path: str) -> bool:
    """Whether ``path`` is a shard an annotate run wrote: its signature names a shard and still
    describes its bytes. Anything else at a shard's name is not this tool's to replace or remove."""
    try:
        signature = Signature.read(path)
        return (signature is not None and "shard" in signature.fields and os.path.isfile(path)
                and not os.path.islink(path) and signature.output == os.path.abspath(path)
                and signature.describes(path) is not False)
    except (PhraseScorerError, OSError):
        return False


def remove_shards(parts: List[str]) -> None:
    """Remove the shards (and their signatures) that annotate wrote; leave anything else."""
    for p in parts:
        if own_shard(p):
            for path in (p + ".json", p):
                Path(path).unlink(missing_ok=True)
