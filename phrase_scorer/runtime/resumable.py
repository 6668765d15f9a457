"""Resumable outputs: written chunk by chunk, recorded after each, continued by ``--resume``.

``annotate``, ``rescore`` and ``translate --moses`` write their output this way. The output is
written to ``OUT.part``; after each chunk the writer (:class:`ChunkWriter`) records, in
``OUT.part.json``, how many input lines are done, how many bytes they took and the settings that
make the output. ``--resume`` truncates ``OUT.part`` to that size, skips those lines and carries
on; since each chunk is complete (a gzip member, or plain text) and chunk boundaries do not
depend on where the run stopped, the result is byte-identical to an uninterrupted run. A resumed
run must have the settings the record holds (:func:`phrase_scorer.records.refuse_changed`). At
the end ``OUT.part`` is renamed to ``OUT`` and a signature, ``OUT.json``, records what made it.
An existing ``OUT`` is replaced only with ``overwrite`` (or by a ``--resume`` that continues its
run), and never when it is one of the inputs (:mod:`phrase_scorer.io.outputs`); standard output,
a character device or a FIFO is written directly, without a resume record or a signature.
``--resume`` with no record to resume from (a run killed before its first chunk, or no run at
all) starts afresh and says so. A failed run keeps ``OUT.part`` only when ``--resume`` can
continue it, and says which (:func:`keep_or_remove_partial`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError, setting
from phrase_scorer.io.files import (
    STDIO, AtomicOutput, PathLike, file_identity, hash_identities, part_path, write_text_atomically,
)
from phrase_scorer.io.outputs import refuse_existing, writes_directly
from phrase_scorer.records import Signature, refuse_changed

log = logging.getLogger(__name__)


def input_identity(path: PathLike) -> Dict[str, Any]:
    """An input as settings record it: by its bytes (:func:`~phrase_scorer.io.files.file_identity`),
    so that a copy, a touched file or the same file at another path resumes; stdin by its name."""
    return {"path": STDIO} if os.fspath(path) == STDIO else file_identity(path)




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
        note = f"{part} is kept with the first {done:,} lines done: run the same command with {setting('resume', True)}"
    else:
        progress_path.unlink(missing_ok=True)
        reason = "the input must change first" if from_input else "no chunk was finished"
        note = f"{part} is removed: nothing can be resumed from it ({reason})"
    hint = f"{exc.hint}; {note}" if exc.hint else note
    return PhraseScorerError(exc.message, path=exc.path, line=exc.line, hint=hint)


def start_resumable(source: PathLike, output: str, settings: Dict[str, Any], resume: bool, *,
                    overwrite: bool) -> Tuple[int, int, Optional[Path]]:
    """Before a resumable run writes ``output`` (under its :class:`OutputLock`): the input lines
    and output bytes already done (0, 0 unless resuming), and the resume record's path (None
    for stdout, a device or a pipe). ``resume`` with no record to resume from starts afresh and
    says so; a fresh run removes a stale record. An existing ``output`` that the run does not
    continue is replaced only with ``overwrite``."""
    to_stdout = writes_directly(output)
    done_lines, done_bytes = 0, 0
    progress_path = Path(str(part_path(output)) + ".json") if not to_stdout else None
    record = None
    if resume:
        if to_stdout or os.fspath(source) == STDIO:
            raise PhraseScorerError(f"{setting('resume')} needs named input and output files, "
                                    "not '-', a device or a pipe")
        record = read_resume_record(progress_path, settings)
        if record is None:
            log.warning("nothing to resume for %s (no interrupted run left a record): starting afresh", output)
        else:
            done_lines, done_bytes = record
            log.info("resuming after %d lines (%d bytes already written)", done_lines, done_bytes)
    if not to_stdout and os.path.lexists(output) and record is None:
        if not overwrite:
            refuse_existing(output)
        log.info("%s exists and will be replaced when the new output is complete", output)
    if record is None and progress_path is not None and progress_path.exists():
        progress_path.unlink()
    if progress_path is not None:  # the resume record will name the inputs by their hash
        hash_identities(settings)
    return done_lines, done_bytes, progress_path


def resumable_output(output: str, done_bytes: int, progress_path: Optional[Path]) -> AtomicOutput:
    """``output``'s temporary file, kept on failure for a later resume while its resume record
    ``progress_path`` exists (a run that finished no chunk leaves nothing behind); a resumed run
    (one with ``done_bytes`` already written) cuts it to those bytes and writes on from there."""
    out = AtomicOutput(output, append=done_bytes > 0, keep_on_failure=progress_path is not None,
                       resume_record=progress_path)
    if done_bytes:
        out.file.truncate(done_bytes)
        out.file.seek(done_bytes)
    return out


def finish_resumable(output: str, progress_path: Optional[Path], signature: Signature) -> None:
    """After the output is committed: drop the resume record and write the signature, OUT.json."""
    if progress_path is not None:
        progress_path.unlink(missing_ok=True)
        signature.write(output)


def read_resume_record(progress_path: Path, settings: Dict[str, Any]) -> Optional[Tuple[int, int]]:
    """(lines done, bytes written) of the interrupted run, or None when no run left a record
    (a run killed before its first chunk leaves none: it starts afresh)."""
    part = Path(str(progress_path)[: -len(".json")])
    if not progress_path.exists() or not part.exists():
        return None
    try:
        record = json.loads(progress_path.read_text())
        lines, size, saved = int(record["lines_done"]), int(record["bytes_done"]), record["settings"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PhraseScorerError(f"resume record is damaged ({exc})", path=progress_path,
                                hint=f"run again without {setting('resume')}") from None
    refuse_changed(saved, settings, path=part, hint=f"run again without {setting('resume')}")
    if part.stat().st_size < size:
        raise PhraseScorerError("the partial output is shorter than its resume record says", path=part,
                                hint=f"run again without {setting('resume')}")
    return lines, size


class ChunkWriter:
    """Writer thread body: writes a window's finished bytes as one chunk, records progress.

    Subclasses that format their own windows (rescore) turn a window into bytes in ``format``
    and hand it to :meth:`write_window`."""

    def __init__(self, out: AtomicOutput, progress_path: Optional[Path], settings: Dict[str, Any],
                 lines_done: int) -> None:
        self.out = out
        self.progress_path = progress_path
        self.settings = settings
        self.lines_done = lines_done

    def write(self, lines: int, data: bytes) -> None:
        self.out.write(data)
        self.lines_done += lines
        if self.progress_path is not None:
            self.out.flush()
            record = {"lines_done": self.lines_done, "bytes_done": self.out.tell(), "settings": self.settings}
            write_text_atomically(self.progress_path, json.dumps(record) + "\n")
