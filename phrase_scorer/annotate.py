"""The streaming pipeline around :class:`BatchScorer`: ``score`` and ``annotate``.

Three threads overlap the work, so the model never waits on I/O::

    reader thread:  read + gunzip + parse + look up ids   -> windows of lines
    main thread:    BatchScorer (torch releases the GIL)   -> log p per line
    writer thread:  format + gzip + write, one chunk per window, with a resume record

A window is ``window_lines`` lines; memory holds a few windows at a time whatever the table's
size. The output keeps every line, in order, and every field but the score field byte for byte.

Column encoding. Moses takes the natural log of every phrase-table column when it loads the table
and floors it at -100 (see docs/moses.md). So the model's column holds p(y|x) = exp(log p), and
the unknown-word column holds exp(n_unk), n_unk being the number of words outside the model's
shortlists; Moses then sees log p(y|x) and n_unk as features. A log p below -100 is written as
exp(-100) (about 3.7e-44), which Moses reads as its own floor, -100; values never reach 0, NaN
or a negative number. All values are printed with 9 significant digits.

Resuming. The output is written to ``OUT.part``; after each chunk the writer records, in
``OUT.part.json``, how many input lines are done and how many bytes they took. ``--resume``
truncates ``OUT.part`` to that size, skips those lines and carries on; since each chunk is a
complete gzip member (or plain text) and chunk boundaries do not depend on where the run
stopped, the result is byte-identical to an uninterrupted run. A resumed run must use the same
input, model, options, device and precision (a chunk scored in bf16 next to one in fp32 would
differ silently). At the end ``OUT.part`` is renamed to ``OUT`` and a signature, ``OUT.json``,
records what made the table, the device and precision of the scores included.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from phrase_scorer import __version__
from phrase_scorer.config import AnnotateOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import (
    STDIO,
    AtomicOutput,
    OutputLock,
    PathLike,
    gzip_member,
    is_gzip_name,
    part_path,
    write_text_atomically,
)
from phrase_scorer.io.phrase_table import PhraseTableReader, TableLine
from phrase_scorer.progress import progress_bar
from phrase_scorer.resume import refuse_changed_settings

log = logging.getLogger(__name__)

LOG_FLOOR = -100.0  # Moses floors the log of every column here (LOWEST_SCORE in moses/TypeDef.h)


# --- windows of lines ---------------------------------------------------------------------------


@dataclass
class Window:
    """A run of consecutive lines with their word ids (filled by the reader thread)."""

    index: int
    first_line: int
    lines: List[TableLine]
    source_ids: List[List[int]]
    target_ids: List[List[int]]
    unknown: np.ndarray  # per line, for the unk column
    log_probs: Optional[np.ndarray] = None


class Pipeline:
    """Runs ``produce`` (reader) and ``consume`` (writer) in threads around the caller's loop.

    Exceptions in either thread stop the whole pipeline and are raised in the caller's thread.
    """

    DONE = object()

    def __init__(self, depth: int = 2) -> None:
        self.inbox: "queue.Queue" = queue.Queue(maxsize=depth)
        self.outbox: "queue.Queue" = queue.Queue(maxsize=depth)
        self.error: Optional[BaseException] = None
        self.stopping = threading.Event()

    def _put(self, q: "queue.Queue", item) -> bool:
        while not self.stopping.is_set():
            try:
                q.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: "queue.Queue"):
        while True:
            try:
                return q.get(timeout=0.2)
            except queue.Empty:
                if self.stopping.is_set():
                    return self.DONE
                if self.error is not None:
                    return self.DONE

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # handed to the main thread
                if self.error is None:
                    self.error = exc
                self.stopping.set()

        return run

    def run(self, produce: Callable[[Callable[[Any], bool]], None], work: Callable[[Any], Any], consume: Callable[[Any], None]) -> None:
        def reader() -> None:
            produce(lambda item: self._put(self.inbox, item))
            self._put(self.inbox, self.DONE)

        def writer() -> None:
            while True:
                item = self._get(self.outbox)
                if item is self.DONE:
                    return
                consume(item)

        threads = [
            threading.Thread(target=self._guard(reader), name="phrase-scorer-reader", daemon=True),
            threading.Thread(target=self._guard(writer), name="phrase-scorer-writer", daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            while True:
                item = self._get(self.inbox)
                if item is self.DONE:
                    break
                if not self._put(self.outbox, work(item)):
                    break
            if self.error is None:
                self._put(self.outbox, self.DONE)
                threads[1].join()
        except BaseException:
            self.stopping.set()
            raise
        finally:
            self.stopping.set()
            for t in threads:
                t.join(timeout=10)
        if self.error is not None:
            raise self.error


def read_windows(reader: PhraseTableReader, loaded, options_window: int, unk_side: str, put, progress) -> None:
    """Reader thread body: cut the table into windows and look up the word ids."""
    src_vocab, tgt_vocab = loaded.source_vocab, loaded.target_vocab
    lines: List[TableLine] = []
    index = 0
    first = reader.skip + 1

    def flush() -> bool:
        nonlocal lines, index, first
        src_ids = [src_vocab.encode(line.source_words) for line in lines]
        tgt_ids = [tgt_vocab.encode(line.target_words) for line in lines]
        unknown = np.zeros(len(lines), np.int64)
        if unk_side in ("source", "both"):
            unknown += np.fromiter((src_vocab.count_unknown(l.source_words) for l in lines), np.int64, len(lines))
        if unk_side in ("target", "both"):
            unknown += np.fromiter((tgt_vocab.count_unknown(l.target_words) for l in lines), np.int64, len(lines))
        ok = put(Window(index, first, lines, src_ids, tgt_ids, unknown))
        index += 1
        first += len(lines)
        lines = []
        return ok

    for line in reader:
        lines.append(line)
        if len(lines) == options_window:
            progress.advance(len(lines))
            if not flush():
                return
    if lines:
        progress.advance(len(lines))
        flush()


# --- annotate -----------------------------------------------------------------------------------


@dataclass
class AnnotateResult:
    output: str
    lines: int
    num_scores_before: Optional[int]
    num_scores_after: Optional[int]
    signature: Dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def input_identity(path: PathLike) -> Dict[str, Any]:
    if os.fspath(path) == STDIO:
        return {"path": STDIO}
    stat = os.stat(path)
    return {"path": os.path.abspath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def annotation_settings(table: PathLike, output: PathLike, loaded, options: AnnotateOptions,
                        scoring: Dict[str, str]) -> Dict[str, Any]:
    """What makes an annotated table: its input, model, options, where and in which precision it
    was scored (``BatchScorer.describe()``) and its format, as JSON holds them.

    The resume record and the signature ``OUT.json`` both carry these; equal settings mean an
    equal output.
    """
    settings = {
        "input": input_identity(table),
        "model": {"directory": os.path.abspath(loaded.directory), "weights_sha256": loaded.weights_sha256,
                  "config": loaded.config.to_dict()},
        "options": asdict(options),
        "scoring": scoring,  # device and precision: a resumed run must not mix them
        "gzip": os.fspath(output) != STDIO and is_gzip_name(output),
        "package_version": __version__,
    }
    return json.loads(json.dumps(settings))  # as JSON reads them back (tuples -> lists)


def finished_annotation(table: PathLike, output: PathLike, loaded, options: AnnotateOptions,
                        scoring: Dict[str, str]) -> Optional[Dict[str, Any]]:
    """The signature of ``output`` if it is a finished annotation of ``table`` with these
    settings (so making it again would give the same bytes), else None."""
    signature_path = Path(os.fspath(output) + ".json")
    if not os.path.isfile(output) or not signature_path.is_file():
        return None
    try:
        signature = json.loads(signature_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(signature, dict) or signature.get("output") != os.path.abspath(output):
        return None
    settings = annotation_settings(table, output, loaded, options, scoring)
    if any(signature.get(key) != value for key, value in settings.items()):
        return None
    return signature


def annotate(
    table: PathLike,
    output: PathLike,
    loaded,
    options: AnnotateOptions = AnnotateOptions(),
    scoring_options=None,
    *,
    resume: bool = False,
) -> AnnotateResult:
    """Append the model's columns to every line of ``table``, writing ``output`` atomically."""
    from phrase_scorer.scoring import BatchScorer

    scoring_options = scoring_options or ScoringOptions()
    output = os.fspath(output)
    to_stdout = output == STDIO
    if not to_stdout and os.fspath(table) != STDIO and os.path.abspath(table) == os.path.abspath(output):
        raise PhraseScorerError("the output would overwrite the input table", path=output)
    compress = not to_stdout and is_gzip_name(output)
    scorer = BatchScorer(loaded.model, scoring_options)
    settings = annotation_settings(table, output, loaded, options, scorer.describe())
    started = time.monotonic()
    with OutputLock(output):
        done_lines, done_bytes, progress_path = start_resumable(table, output, settings, resume)
        with resumable_output(output, resume, done_bytes) as out:
            reader = PhraseTableReader(table, min_fields=3, check_scores=True, skip=done_lines)
            writer = ChunkWriter(out, progress_path, settings, options, compress, done_lines)

            def work(window: Window) -> Window:
                window.log_probs = scorer.score(window.source_ids, window.target_ids)
                return window

            try:
                with progress_bar("annotating", reader) as progress:
                    Pipeline().run(
                        lambda put: read_windows(reader, loaded, options.window_lines, options.unk_side, put, progress),
                        work,
                        writer.write,
                    )
            except PhraseScorerError as exc:
                if to_stdout:
                    raise
                raise keep_or_remove_partial(exc, out, progress_path, settings["input"]["path"]) from None
            except KeyboardInterrupt:
                if progress_path is not None and not progress_path.exists():
                    out.keep_on_failure = False  # not one chunk finished: nothing to resume from
                raise
            total_lines = writer.lines_done
            if total_lines == 0:
                raise PhraseScorerError("the phrase table is empty", path=table)
            num_scores = reader.num_scores if reader.num_scores is not None else writer.num_scores
            signature = {
                "tool": "phrase-scorer annotate",
                **settings,
                "output": os.path.abspath(output) if not to_stdout else STDIO,
                "lines": total_lines,
                "columns": list(options.columns),
                "num_scores_before": num_scores,
                "num_scores_after": (num_scores or 0) + len(options.columns),
                "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            out.commit()
        finish_resumable(output, progress_path, signature)
    return AnnotateResult(
        output=output,
        lines=total_lines,
        num_scores_before=signature["num_scores_before"],
        num_scores_after=signature["num_scores_after"],
        signature=signature,
        seconds=time.monotonic() - started,
    )


def keep_or_remove_partial(exc: PhraseScorerError, out: AtomicOutput, progress_path: Path,
                           input_path: str) -> PhraseScorerError:
    """Decide whether the partial output of a failed run is kept, and say so in the error.

    It is kept when ``--resume`` can continue it: some chunks are finished (their record exists)
    and the failure does not come from the input. An input that must be changed (a truncated gzip
    file, a malformed line) fails ``--resume``'s input check anyway, so its partial output is removed.
    """
    part = out.tmp_path
    from_input = exc.path is not None and input_path in (exc.path, os.path.abspath(exc.path))
    resumable = progress_path.exists() and not from_input
    out.keep_on_failure = resumable
    if resumable:
        done = json.loads(progress_path.read_text())["lines_done"]
        note = f"{part} is kept with the first {done:,} lines done: run the same command with --resume"
    else:
        progress_path.unlink(missing_ok=True)
        reason = "the input must change first" if from_input else "no chunk was finished"
        note = f"{part} is removed: nothing can be resumed from it ({reason})"
    hint = f"{exc.hint}; {note}" if exc.hint else note
    return PhraseScorerError(exc.message, path=exc.path, line=exc.line, hint=hint)

def start_resumable(source: PathLike, output: str, settings: Dict[str, Any], resume: bool) -> Tuple[int, int, Optional[Path]]:
    """Before a resumable run writes ``output`` (under its :class:`OutputLock`): the input lines
    and output bytes already done (0, 0 unless ``resume``), and the resume record's path (None
    for stdout). A fresh run removes a stale record."""
    to_stdout = output == STDIO
    done_lines, done_bytes = 0, 0
    progress_path = Path(str(part_path(output)) + ".json") if not to_stdout else None
    if resume:
        if to_stdout or os.fspath(source) == STDIO:
            raise PhraseScorerError("--resume needs named input and output files, not '-'")
        done_lines, done_bytes = read_resume_record(progress_path, settings)
        log.info("resuming after %d lines (%d bytes already written)", done_lines, done_bytes)
    elif progress_path is not None and progress_path.exists():
        progress_path.unlink()
    if not to_stdout and os.path.exists(output) and not resume:
        log.info("%s exists and will be replaced when the new output is complete", output)
    return done_lines, done_bytes, progress_path


def resumable_output(output: str, resume: bool, done_bytes: int) -> AtomicOutput:
    """``output``'s temporary file, kept on failure for a later resume, cut to ``done_bytes``
    when resuming."""
    out = AtomicOutput(output, append=resume, keep_on_failure=output != STDIO)
    if resume:
        out.file.truncate(done_bytes)
        out.file.seek(done_bytes)
    return out


def finish_resumable(output: str, progress_path: Optional[Path], signature: Dict[str, Any]) -> None:
    """After the output is committed: drop the resume record and write the signature, OUT.json."""
    if progress_path is not None:
        progress_path.unlink(missing_ok=True)
        write_text_atomically(output + ".json", json.dumps(signature, indent=2) + "\n")


def read_resume_record(progress_path: Path, settings: Dict[str, Any]) -> Tuple[int, int]:
    part = Path(str(progress_path)[: -len(".json")])
    if not progress_path.exists() or not part.exists():
        raise PhraseScorerError("nothing to resume: no interrupted run of this output", path=part,
                                hint="run again without --resume")
    try:
        record = json.loads(progress_path.read_text())
        lines, size, saved = int(record["lines_done"]), int(record["bytes_done"]), record["settings"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PhraseScorerError(f"resume record is damaged ({exc})", path=progress_path, hint="run again without --resume") from None
    refuse_changed_settings(saved, settings, path=part, hint="run again without --resume")
    if part.stat().st_size < size:
        raise PhraseScorerError("the partial output is shorter than its resume record says", path=part,
                                hint="run again without --resume")
    return lines, size


def check_finite(log_probs: np.ndarray, path: PathLike, first_line: int) -> None:
    """Refuse a NaN or infinite score; ``first_line`` is the input line of ``log_probs[0]``."""
    if not np.isfinite(log_probs).all():
        bad = int(np.flatnonzero(~np.isfinite(log_probs))[0])
        raise PhraseScorerError("the model gave a non-finite score", path=path, line=first_line + bad,
                                hint="the model weights are damaged")


def per_token(log_probs: np.ndarray, target_ids) -> np.ndarray:
    """log p divided by the number of predicted tokens, the target words and ``</s>``."""
    lengths = np.fromiter((len(t) + 1 for t in target_ids), np.float64, len(target_ids))
    return log_probs / lengths


class ChunkWriter:
    """Writer thread body: formats a window, writes it as one chunk, records progress."""

    def __init__(self, out: AtomicOutput, progress_path: Optional[Path], settings: Dict[str, Any],
                 options: AnnotateOptions, compress: bool, lines_done: int) -> None:
        self.out = out
        self.progress_path = progress_path
        self.settings = settings
        self.options = options
        self.compress = compress
        self.lines_done = lines_done
        self.num_scores: Optional[int] = None

    def format(self, window: Window) -> bytes:
        opts = self.options
        log_probs = window.log_probs
        check_finite(log_probs, self.settings["input"]["path"], window.first_line)
        if opts.length_normalize:
            log_probs = per_token(log_probs, window.target_ids)
        probs = np.exp(np.maximum(log_probs, LOG_FLOOR))
        counts = np.exp(window.unknown.astype(np.float64))
        parts = []
        for i, line in enumerate(window.lines):
            values = []
            for column in opts.columns:
                values.append("%.9g" % (probs[i] if column == "prob" else counts[i]))
            parts.append(line.with_scores_appended(" ".join(values).encode("ascii")))
        return b"".join(parts)

    def write(self, window: Window) -> None:
        data = self.format(window)
        if self.compress:
            data = gzip_member(data, self.options.compress_level)
        self.out.write(data)
        self.lines_done += len(window.lines)
        if self.progress_path is not None:
            self.out.flush()
            record = {"lines_done": self.lines_done, "bytes_done": self.out.tell(), "settings": self.settings}
            write_text_atomically(self.progress_path, json.dumps(record) + "\n")


# --- score --------------------------------------------------------------------------------------


def score_file(source: PathLike, output: PathLike, loaded, scoring_options=None, window_lines: int = 20000) -> int:
    """Write one natural-log log p(y|x) per line of ``source`` (``src ||| tgt`` lines or a whole
    phrase table), in order. Returns the number of lines."""
    from phrase_scorer.scoring import BatchScorer

    scorer = BatchScorer(loaded.model, scoring_options or ScoringOptions())
    reader = PhraseTableReader(source, min_fields=2, check_scores=False)
    lines = 0
    with AtomicOutput(output) as out:

        def work(window: Window) -> Window:
            window.log_probs = scorer.score(window.source_ids, window.target_ids)
            return window

        def write(window: Window) -> None:
            nonlocal lines
            out.write("".join("%.9g\n" % v for v in window.log_probs).encode("ascii"))
            lines += len(window.lines)

        with progress_bar("scoring", reader) as progress:
            Pipeline().run(lambda put: read_windows(reader, loaded, window_lines, "target", put, progress), work, write)
        out.commit()
    return lines
