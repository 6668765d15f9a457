"""The one rule for what a command may write over.

Every verb that writes a file checks its output here before it writes anything:

* An output is refused when it is the same file as one of the command's inputs, or when one of
  the files written beside it (``OUT.part``, ``OUT.part.json``, ``OUT.json``, ``OUT.lock``) is.
  Files are compared by device and inode after following links, so a symbolic or hard link to
  an input, or another spelling of its path, is caught as well as the same name.
* ``-`` (standard output), an open descriptor named through links (``/dev/stdout``,
  ``/dev/fd/N``, a link to either: whatever file it is, even a regular file a shell redirected it
  to) and an existing character device or FIFO (``/dev/null``, a named pipe, or a link to one)
  are written to directly: never renamed over, locked, resumed or signed, and nothing is made
  beside them (:func:`~phrase_scorer.io.descriptors.named_descriptor`).
  Any other kind of file that is not a regular file (a block device, a socket) is refused.
* An existing output is replaced only when the caller says so (``--overwrite``), except where
  ``--resume`` continues it (checked by the resumable writers, which know whether it does).
  So is a signature ``OUT.json`` that stands without its ``OUT`` (a file the user keeps there,
  such as a tuned reranker), for the writers that sign their output: ``--overwrite`` replaces it.
* One run at a time writes an output: :func:`check_output` also claims it, by taking the lock
  ``OUT.lock`` (:class:`~phrase_scorer.io.output_lock.OutputLock`) before it looks for an existing
  output, and a second run aimed at it while the first holds it is refused with one line naming
  it, before it writes anything. The claim is the checked output's: ``with check_output(...):``
  releases it when the block ends, and whatever a command still holds is released when the
  command ends (:mod:`phrase_scorer.cli.group`), or by the operating system when it dies. Under
  torchrun the main rank claims the output for the job (it is the one that writes it). Holding
  the lock, the claim removes the temporary files of the output that killed runs left, those
  provably the tool's and abandoned (:func:`~phrase_scorer.io.atomic.remove_stale_temporaries`).

:func:`check_output` applies the rule; :func:`writes_directly` tells the writers whether a path
is written in place.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import remove_stale_temporaries
from phrase_scorer.io.descriptors import stat_or_none, named_descriptor, own_descriptor, writes_directly
from phrase_scorer.io.output_lock import OutputLock
from phrase_scorer.io.paths import STDIO, PathLike
from phrase_scorer.io.model_layout import MODEL_FILES, RECENT_WEIGHTS

log = logging.getLogger(__name__)

__all__ = ["OutputKind", "check_output", "model_files", "refuse_existing", "same_file", "writes_directly"]

# What the writers put beside OUT (see phrase_scorer.io.atomic and phrase_scorer.io.output_lock): the file
# written before the rename, the resume record, the signature and the lock.
RESUMABLE_COMPANIONS = (".part", ".part.json", ".json", ".lock")
ATOMIC_COMPANIONS = (".part",)
SIGNED_COMPANIONS = (*ATOMIC_COMPANIONS, ".json")  # an output signed by its OUT.json, not resumable

# An input as (what it is, its path): ("the phrase table", "pt.gz").
Input = Tuple[str, Optional[PathLike]]


@dataclass(frozen=True)
class OutputKind:
    """What an output is to the rule: how messages name it, the setting that replaces an existing
    one, and whether it must be a regular file."""

    what: str = "the output"  # the output in messages: "the report", "the tuned moses.ini"
    option: str = "overwrite"  # the setting that lets an existing one be replaced
    # refuse '-', character devices and FIFOs too: outputs that are files by nature (a tuned
    # moses.ini, decoder output kept beside its log)
    regular_only: bool = False


def same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name the same existing file (after following links)."""
    if STDIO in (os.fspath(a), os.fspath(b)):
        return False
    first, second = stat_or_none(a), stat_or_none(b)
    return first is not None and second is not None and (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def display(path: PathLike) -> str:
    return "<stdout>" if os.fspath(path) == STDIO else os.fspath(path)


def check_output(output: PathLike, inputs: Iterable[Input], *, overwrite: bool = False,
                 companions: Sequence[str] = ATOMIC_COMPANIONS, kind: OutputKind = OutputKind(),
                 resume: bool = False, lock: bool = True):
    """Refuse ``output`` unless it may be written (see the module docstring), and claim it.

    ``inputs`` are the command's inputs as (what, path) pairs (a None path, or ``-``, is
    skipped); ``companions`` the suffixes of the files written beside ``output`` (``.json``
    among them: the writer signs its output, and an ``OUT.json`` without ``OUT`` is replaced only
    with ``overwrite``); ``overwrite`` lets an existing regular file be replaced; ``resume`` leaves
    an existing output to a resumable writer, which checks it once it knows whether ``--resume``
    continues it; ``kind`` names the output in messages (``what``), the setting that replaces it
    (``option``), and with ``regular_only`` refuses ``-``, character devices and FIFOs too.

    Returns the :class:`OutputClaim` (one that holds nothing for ``-``, a device or a pipe): use
    it as ``with check_output(...):`` around the writing. A refused output is not claimed.
    ``lock=False`` checks without claiming: only for a process that does not write the output
    itself (the ranks of a torchrun job other than the main one, whose output the main rank writes).
    """
    output = os.fspath(output)
    what, option = kind.what, kind.option
    if kind.regular_only and writes_directly(output):
        raise PhraseScorerError(f"{what} must be a regular file (files are written beside it)", path=display(output),
                                hint="give a file name")
    claim = OutputClaim()
    if output == STDIO:
        return claim
    given = [(name, os.fspath(path)) for name, path in inputs if path is not None and os.fspath(path) != STDIO]
    for suffix in ("", *companions):
        written = output + suffix
        for name, path in given:
            if same_file(written, path):
                alias = "" if os.path.abspath(written) == os.path.abspath(path) else " (through a link)"
                whose = f"{what} {output}" if not suffix else f"{written}, written beside {what} {output},"
                raise PhraseScorerError(
                    f"{whose} is the same file as {name} {path}{alias}: writing it would overwrite the input",
                    hint=f"write {what} elsewhere")
    if named_descriptor(output) is not None:
        own_descriptor(output)  # one of this process's: open, and for writing
        return claim  # written through the descriptor (a link to it is never replaced): nothing beside it
    info = stat_or_none(output)
    if info is not None:
        mode = info.st_mode
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return claim  # written in place: no lock, nothing beside it
        if stat.S_ISDIR(mode):
            raise PhraseScorerError(f"{what} is a directory", path=output, hint="give a file name")
        if not stat.S_ISREG(mode):
            found = ("a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                     else "not a regular file")
            raise PhraseScorerError(f"{what} is {found}; refusing to write to it", path=output,
                                    hint=f"write {what} to a regular file, a character device or a pipe")
    if lock:  # before looking for an existing output: a run that finished meanwhile is seen
        claim.lock = OutputLock(output)
        claim.lock.acquire()
        for stale in [*remove_stale_temporaries(output), *remove_stale_temporaries(claim.lock.lock_path)]:
            log.info("removed %s, left by a run that was killed", stale)  # what killed runs left beside it, provably
    try:
        if os.path.lexists(output):  # a dangling link too: the rename would replace it
            if not (overwrite or resume):
                refuse_existing(output, what=what, option=option)
        elif ".json" in companions and os.path.lexists(output + ".json") and not overwrite:
            raise PhraseScorerError(f"the file written beside {what} {output} already exists", path=output + ".json",
                                    hint=Text("pass ", setting(option, True), " to replace it, or choose another name"))
    except PhraseScorerError:
        claim.release()
        raise
    return claim


class OutputClaim:
    """An output :func:`check_output` let through, and the lock held on it (None where none is
    taken: ``-``, a device, a pipe, a rank that does not write) until :meth:`release`."""

    def __init__(self) -> None:
        self.lock: Optional[OutputLock] = None

    def release(self) -> None:
        lock, self.lock = self.lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> "OutputClaim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def refuse_existing(output: PathLike, *, what: str = "the output", option: str = "overwrite") -> None:
    """Refuse an existing ``output``: ``option`` is the setting that would replace it."""
    raise PhraseScorerError(f"{what} already exists", path=output,
                            hint=Text("pass ", setting(option, True), " to replace it, or choose another name"))


def model_files(directory: Optional[PathLike]) -> list:
    """The files of a model directory (its config, vocabularies, weights, checkpoint, log and the
    weights of its last validations), as inputs for :func:`check_output`: a command that reads a
    model must not write over it. Other files kept there (a translation written beside the model)
    are not the model's."""
    if directory is None or not os.path.isdir(directory):
        return []
    files = [os.path.join(directory, name) for name in MODEL_FILES]
    recent = os.path.join(directory, RECENT_WEIGHTS)
    if os.path.isdir(recent):
        files += [entry.path for entry in os.scandir(recent) if entry.is_file()]
    return [("a file of the model", path) for path in files if os.path.isfile(path)]
