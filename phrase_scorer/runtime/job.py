"""The one way a command writes its output: :class:`OutputJob`.

Every verb that writes a file, and every library function behind one, writes through a job::

    with OutputJob(output, inputs, overwrite=overwrite) as job:
        job.write(lines, data)           # as many times as needed
        job.commit(signature)            # or job.commit() for an output without a signature

A job owns everything between the command's options and the finished file:

* **The guard and the lock.** Entering the job checks the output against the command's inputs
  and claims it (:func:`phrase_scorer.io.outputs.check_output`: never an input or a link to
  one, an existing output only with ``overwrite``, one run at a time through ``OUT.lock``).
* **The temporary file.** The output is written under a temporary name and renamed into place
  by :meth:`commit` (:class:`~phrase_scorer.io.atomic.AtomicOutput`), keeping the permission bits
  of the file it replaces. ``-``, a character device and a FIFO are written directly.
* **Resuming** (``resumable``). The output is written to ``OUT.part``; after each
  :meth:`write` the job records, in ``OUT.part.json`` (a :class:`ResumeRecord`), how many
  input lines are done, how many bytes they took, the SHA-256 of those bytes and the settings
  that make the output. ``--resume`` checks the record's settings against the command's
  (:func:`phrase_scorer.records.refuse_changed`: inputs by their bytes), checks the bytes of
  ``OUT.part`` against the recorded SHA-256, cuts it to the recorded size and goes on; each
  write is a whole chunk, and chunk boundaries do not depend on where a run stopped, so the
  result is byte-identical to an uninterrupted run.
* **The signature** ``OUT.json`` (:class:`~phrase_scorer.records.Signature`), written when the
  output is in place, after the resume record is removed.
* **Failure.** Leaving the block with an exception removes the temporary file, unless it is a
  ``OUT.part`` that ``--resume`` can continue (some chunks finished, and the failure does not
  come from an input, which would fail the same check on resume: the record holds the inputs'
  bytes); the error says which.

Its rule for the files beside the output: a file this run did not create is never opened for
writing, truncated or removed. ``OUT.part`` and the lock are created exclusively, never through
a link; an ``OUT.part`` left by an earlier run is removed only when its resume record names that
very file (device and inode), and a resume record only when it is one this tool wrote; anything
else in their place is refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from stat import S_ISREG
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Sequence, Union

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import AtomicOutput, file_key, open_own, remove_if_same, write_text_atomically
from phrase_scorer.io.compression import gzip_member
from phrase_scorer.io.descriptors import writes_directly
from phrase_scorer.io.file_identity import file_identity, hash_identities
from phrase_scorer.io.paths import STDIO, PathLike, is_gzip_name, part_path
from phrase_scorer.io.outputs import (
    ATOMIC_COMPANIONS, RESUMABLE_COMPANIONS, Input, OutputClaim, OutputKind, check_output, refuse_existing,
)
from phrase_scorer.records import Signature, refuse_changed
from phrase_scorer.runtime.resources import exhausted

log = logging.getLogger(__name__)

RESUME_RECORD_VERSION = 2  # 2: the partial output's SHA-256 and the file it is (device, inode)


def input_identity(path: PathLike) -> Dict[str, Any]:
    """An input as settings record it: by its bytes (:func:`~phrase_scorer.io.file_identity.file_identity`),
    so that a copy, a touched file or the same file at another path resumes; stdin by its name."""
    return {"path": STDIO} if os.fspath(path) == STDIO else file_identity(path)


def record_path(output: PathLike) -> Path:
    """Where the resume record of ``output`` is kept: ``OUT.part.json``."""
    return Path(str(part_path(output)) + ".json")


@dataclass
class ResumeRecord:
    """What an interrupted resumable run had finished, kept in ``OUT.part.json``: the input lines
    done, the bytes of ``OUT.part`` they took and those bytes' SHA-256, the file ``OUT.part`` is
    (device, inode: whether an ``OUT.part`` found later is the one this record describes), and
    the settings that make the output."""

    lines_done: int
    bytes_done: int
    part_sha256: str
    part_device: int
    part_inode: int
    settings: Dict[str, Any] = field(default_factory=dict)
    version: int = RESUME_RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def read(cls, path: Path) -> Optional["ResumeRecord"]:
        """The record at ``path``; None when there is none. A file there that is not a record
        this tool wrote (a link, another file, a record of an older version) is an error
        naming it: it is neither trusted nor removed."""
        try:
            fd = open_own(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _not_a_record(path, "is a symbolic link or not a regular file" if exc.errno != 13
                                else "cannot be read") from None
        with os.fdopen(fd, "rb") as f:
            raw = f.read(1 << 24)
        try:
            data = json.loads(raw.decode("utf-8"))
            record = cls(**{key: data[key] for key in ("lines_done", "bytes_done", "part_sha256", "part_device",
                                                       "part_inode", "settings", "version")})
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise _not_a_record(path, "is not a resume record of this version of phrase-scorer") from None
        numbers = (record.lines_done, record.bytes_done, record.part_device, record.part_inode, record.version)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers) or \
                not isinstance(record.settings, dict) or not isinstance(record.part_sha256, str) or \
                record.version != RESUME_RECORD_VERSION:
            raise _not_a_record(path, "is damaged or of another version")
        return record


@dataclass(frozen=True)
class Resumable:
    """What makes an output resumable: the settings that make its bytes (as its resume record
    holds them), and the input whose failure means its partial output cannot be resumed."""

    settings: Dict[str, Any]
    source: Optional[PathLike] = None


def _not_a_record(path: PathLike, problem: str) -> PhraseScorerError:
    return PhraseScorerError(f"{problem}: not a resume record this run can trust", path=path,
                             hint=Text("move it away (and the partial output beside it), then run the command again "
                                       "without ", setting("resume")))


class OutputJob:
    """One command writing one output (see the module docstring).

    ``inputs`` are the command's inputs as (what, path) pairs; ``kind`` names the output in
    messages and the setting that lets an existing one be replaced, and with ``regular_only``
    refuses ``-``, devices and pipes (outputs with files beside them). ``resumable`` makes the
    output resumable (:class:`Resumable`: the settings that make its bytes, and its source).
    ``lock=False`` checks without claiming (a torchrun rank whose output the main rank writes).
    ``companions``: the suffixes of the files written beside the output (default: a resumable
    output's, else only its temporary file; ``SIGNED_COMPANIONS`` for one signed by OUT.json).
    """

    def __init__(self, output: PathLike, inputs: Iterable[Input] = (), *, overwrite: bool = False,
                 resume: bool = False, resumable: Optional[Resumable] = None, kind: OutputKind = OutputKind(),
                 lock: bool = True, companions: Optional[Sequence[str]] = None) -> None:
        self.output = os.fspath(output)
        if not self.output:
            raise PhraseScorerError(f"{kind.what} has an empty name", hint="give a file name, or - for standard output")
        self.inputs = list(inputs)
        self.overwrite = overwrite
        self.resume = resume
        self.resumable = resumable is not None
        self.settings = resumable.settings if resumable is not None else {}
        source = resumable.source if resumable is not None else None
        self.source = os.fspath(source) if source is not None else None
        self.kind = kind
        self.lock = lock
        if companions is None:
            companions = RESUMABLE_COMPANIONS if self.resumable else ATOMIC_COMPANIONS
        self.companions = tuple(companions)
        self.gzipped = is_gzip_name(self.output)  # the one rule: a name ending in .gz is written gzipped
        self.claim: Optional[OutputClaim] = None
        self.out: Optional[AtomicOutput] = None
        self._written = 0  # bytes this run wrote
        self.lines_done = 0
        self.recorded_lines = 0  # lines the resume record on disk holds
        self._record: Optional[Path] = None  # OUT.part.json, for a resumable output written to a file
        self._hash = hashlib.sha256()

    # --- entering: guard, lock, resume -------------------------------------------------------

    def __enter__(self) -> "OutputJob":
        self.claim = check_output(self.output, self.inputs, overwrite=self.overwrite, companions=self.companions,
                                  kind=self.kind, resume=self.resume and self.resumable, lock=self.lock)
        try:
            self.out = self._open()
        except BaseException:
            self.claim.release()
            raise
        return self

    @property
    def direct(self) -> bool:
        """Whether the output is written in place (``-``, a device, a pipe)."""
        return writes_directly(self.output)

    def _open(self) -> AtomicOutput:
        if self.resume and self.resumable and (
                self.direct or any(_streamed(path) for path in (self.source, *(path for _, path in self.inputs)))):
            raise PhraseScorerError(Text(setting("resume"),
                                         " needs named input and output files, not '-', a device or a pipe"))
        if not self.resumable or self.direct:
            return AtomicOutput(self.output)
        self._record = record_path(self.output)
        part = part_path(self.output)
        record = ResumeRecord.read(self._record)
        if self.resume and record is not None and record.lines_done > 0 and os.path.lexists(part):
            return self._continue(record, part)
        if self.resume:  # no record, or one of a run killed before its first chunk
            log.warning("nothing to resume for %s (no interrupted run left a record): starting afresh", self.output)
        if os.path.lexists(self.output):
            if not self.overwrite:
                refuse_existing(self.output, what=self.kind.what, option=self.kind.option)
            log.info("%s exists and will be replaced when the new output is complete", self.output)
        self._clear_stale(record, part)
        hash_identities(self.settings)  # the resume record names the inputs by their hash
        out = AtomicOutput(self.output, part=part, keep_on_failure=True)
        try:
            self._write_record(out)  # the record names the part before it takes its name: a kill leaves
            out.publish()            # either a file named as this run's, removed by the next, or a resumable part
        except BaseException:
            out.keep_on_failure = False
            out.abort()
            raise
        return out

    def _clear_stale(self, record: Optional[ResumeRecord], part: Path) -> None:
        """Remove what an earlier run of this command left: its record, and ``OUT.part`` when the
        record names that very file. Anything else at ``OUT.part`` is not this tool's to remove."""
        if os.path.lexists(part):
            key = file_key(os.lstat(part))
            if record is None or key != (record.part_device, record.part_inode):
                raise PhraseScorerError("a file is in the way of the partial output, and no resume record of this "
                                        "tool names it", path=part,
                                        hint="move it away (it may be yours), or choose another output")
            remove_if_same(part, key)
        if record is not None:
            assert self._record is not None
            remove_if_same(self._record, file_key(os.lstat(self._record)))

    def _continue(self, record: ResumeRecord, part: Path) -> AtomicOutput:
        """Go on from ``record``: the same settings, and ``OUT.part`` holding the bytes it recorded."""
        hint = Text("run again without ", setting("resume"))
        refuse_changed(record.settings, self.settings, path=part, hint=hint)
        out = AtomicOutput(self.output, part=part, append=True, keep_on_failure=True)
        try:
            if (out._key or (0, 0)) != (record.part_device, record.part_inode):
                raise PhraseScorerError("the partial output is not the file its resume record describes",
                                        path=part, hint=hint)
            if os.fstat(out.file.fileno()).st_nlink != 1:  # cutting it would cut every other name too
                raise PhraseScorerError("the partial output has other names (hard links): refusing to cut it",
                                        path=part, hint=Text("remove the other names, or ", hint))
            out.file.seek(0)
            remaining = record.bytes_done
            while remaining:
                block = out.file.read(min(remaining, 1 << 20))
                if not block:
                    raise PhraseScorerError("the partial output is shorter than its resume record says", path=part,
                                            hint=hint)
                self._hash.update(block)
                remaining -= len(block)
            if self._hash.hexdigest() != record.part_sha256:
                raise PhraseScorerError("the partial output's bytes changed since its resume record was written",
                                        path=part, hint=hint)
            out.file.truncate(record.bytes_done)
            out.file.seek(record.bytes_done)
        except BaseException:  # kept as it was: its record still names it
            out.abort()
            raise
        self.lines_done = self.recorded_lines = record.lines_done
        log.info("resuming after %d lines (%d bytes already written)", record.lines_done, record.bytes_done)
        return out

    @property
    def done_lines(self) -> int:
        """The input lines a resumed run skips (0 for a fresh one)."""
        return self.recorded_lines if self.resume else 0

    # --- writing ---------------------------------------------------------------------------------

    def write(self, lines: int, data: bytes) -> None:
        """Write ``data``, the finished output of ``lines`` input lines, as one chunk; a resumable
        output records it (``--resume`` goes on after it)."""
        assert self.out is not None, "write inside the job's with block"
        self.out.write(data)
        self._written += len(data)
        self.lines_done += lines
        if self._record is not None:
            self._hash.update(data)
            self.out.flush()
            self._write_record(self.out)

    def write_text(self, lines: int, data: bytes) -> None:
        """:meth:`write` text, gzipped as one member when the output's name ends in ``.gz``
        (writers that compress in their own threads, annotate's and rescore's, ask
        :attr:`gzipped` and call :meth:`write`)."""
        self.write(lines, gzip_member(data) if self.gzipped else data)

    def _write_record(self, out: AtomicOutput) -> None:
        assert self._record is not None and out._key is not None
        record = ResumeRecord(self.lines_done, out.tell(), self._hash.hexdigest(), *out._key, self.settings)
        write_text_atomically(self._record, record.to_json())
        self.recorded_lines = self.lines_done

    @property
    def temporary(self) -> Optional[Path]:
        """The file being written (None when written in place): a signature hashes it before the commit."""
        return self.out.tmp_path if self.out is not None else None

    def flush(self) -> None:
        assert self.out is not None
        self.out.flush()

    def commit(self, signature: Optional[Signature] = None) -> None:
        """Put the output in place, drop the resume record, and write ``signature`` beside it
        (not for ``-``, a device or a pipe)."""
        assert self.out is not None
        if self.gzipped and self._written == 0 and self.recorded_lines == 0:
            self.out.write(gzip_member(b""))  # no bytes is not a gzip file: one empty member is
        self.out.commit()
        if self._record is not None:
            remove_if_same(self._record, _key_or_none(self._record))
        if signature is not None and not self.direct:
            signature.write(self.output)

    # --- leaving ---------------------------------------------------------------------------------

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.out is not None and not self.out.committed:
                self._fail(exc)
        finally:
            if self.claim is not None:
                self.claim.release()

    def _fail(self, exc: Optional[BaseException]) -> None:
        """Keep ``OUT.part`` when ``--resume`` can continue it, else remove it and its record;
        a :class:`PhraseScorerError` is raised again saying which (memory, disk space, open files or
        processes running out too: :func:`~phrase_scorer.runtime.resources.exhausted`)."""
        assert self.out is not None
        if exc is not None and not isinstance(exc, PhraseScorerError):
            exc = exhausted(exc, self.out.tmp_path) or exc
        if self._record is None:
            self.out.abort()
            return
        from_input = isinstance(exc, PhraseScorerError) and self._names_an_input(exc.path)
        resumable = self.recorded_lines > 0 and not from_input
        self.out.keep_on_failure = resumable
        self.out.abort()
        if not resumable:
            remove_if_same(self._record, _key_or_none(self._record))
        if isinstance(exc, PhraseScorerError) and exc.path != self._record:
            part = self.out.tmp_path
            note: Union[Text, str]
            if resumable:
                note = Text(f"{part} is kept with the first {self.recorded_lines:,} lines done: run the same "
                            "command with ", setting("resume", True))
            else:
                reason = "the input must change first" if from_input else "no chunk was finished"
                note = f"{part} is removed: nothing can be resumed from it ({reason})"
            hint = Text(exc.hint, "; ", note) if exc.hint else note
            raise PhraseScorerError(exc.message, path=exc.path, line=exc.line, hint=hint) from None

    def _names_an_input(self, path: Optional[PathLike]) -> bool:
        """Whether an error naming ``path`` comes from one of the inputs (the source or any other
        the job was given): the resume that follows reads the same bytes (the record names them)
        and would fail the same check, so the partial output is not kept for it."""
        if path is None:
            return False
        named = os.path.abspath(path)
        return any(given is not None and os.path.abspath(given) == named
                   for given in (self.source, *(p for _, p in self.inputs)))


def _streamed(path: Optional[PathLike]) -> bool:
    """Whether an input is ``-``, a pipe or a device: bytes a resumed run can neither read again
    nor check against its record."""
    if path is None:
        return False
    if os.fspath(path) == STDIO:
        return True
    try:
        return not S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # missing: its reader names it


def _key_or_none(path: Path):
    try:
        return file_key(os.lstat(path))
    except OSError:
        return None
