"""A folder output replaced whole: the new folder is built beside the old one and swapped in
when it is complete (:class:`FolderReplacement`).

``train -o DIR --overwrite`` of a folder that holds a model builds the new model in
``DIR.new`` and leaves ``DIR`` as it was, so that a reader of ``DIR`` finds the old model, whole,
until the new one is finished, and a run that fails or is killed meanwhile loses nothing. The
swap exchanges the two folders in one step (Linux ``renameat2`` with ``RENAME_EXCHANGE``): a
reader finds the old model or the new one, never neither. Files of the user's kept in ``DIR``
beside the model (a translation, notes) move into the new folder; the old model is then removed.

``DIR.new`` is known as this tool's by its mark, ``DIR.new/.phrase-scorer-replacing``: a file
created exclusively when the folder is made, holding exactly :func:`mark_text` of ``DIR``. Where the
mark stands says how far a killed run got, and the next run (under ``DIR``'s lock) goes on from
there (:meth:`FolderReplacement.recover`):

* the mark in ``DIR.new``: the new folder is being built. ``--resume`` continues it; a run that
  replaces ``DIR`` again removes it, and so does any run where it holds nothing to continue (the
  caller says what that is). A ``DIR.new`` holding anything else (a file that is not one of the
  folder's, a link) is never removed: it is named, for the user to move away.
* the mark in ``DIR``: the swap was made. The old folder (at ``DIR.new``, or at
  ``DIR/.phrase-scorer-replaced`` where the file system cannot exchange two folders and the
  old one was moved inside the new before it was renamed into place) gives back the user's
  files it still holds, is removed, and the mark goes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Callable

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import RENAME_EXCHANGE, create_new, fsync_dir, rename_with

log = logging.getLogger(__name__)

MARK = ".phrase-scorer-replacing"  # in DIR.new while it is built, in DIR once swapped in
REPLACED = ".phrase-scorer-replaced"  # the old folder, moved inside the new one (no exchange possible)
SUFFIX = ".new"


def mark_text(target: Path) -> bytes:
    """What the mark of a folder replacing ``target`` holds, exactly."""
    return (json.dumps({"format": "phrase-scorer folder replacement", "version": 1, "replaces": os.fspath(target)})
            + "\n").encode("utf-8")


def _is_mark(path: Path, target: Path) -> bool:
    """Whether ``path`` is a regular file (not a link) holding exactly the mark of ``target``."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 4096:
            return False
        return path.read_bytes() == mark_text(target)
    except OSError:
        return False


def _real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def exchange(first: Path, second: Path) -> bool:
    """Exchange two folders' names in one step; False where the system cannot (not Linux, an old
    C library, a file system without ``RENAME_EXCHANGE``)."""
    return rename_with(first, second, RENAME_EXCHANGE)


class FolderReplacement:
    """The replacement of the folder ``target`` by one built at ``target.new`` (see the module
    docstring). ``own_entry(name)`` says whether an entry of such a folder is one the tool makes
    there (the model's files and folders, their temporary files): the rest is the user's."""

    def __init__(self, target: Path, own_entry: Callable[[str], bool]) -> None:
        self.target = Path(os.path.abspath(target))
        self.building = self.target.with_name(self.target.name + SUFFIX)
        self.own_entry = own_entry

    # --- what a killed run left -----------------------------------------------------------------

    def refuse_a_build(self) -> None:
        """Refuse ``target`` when it is itself the folder where another folder's replacement is
        built (``OTHER.new``, marked for ``OTHER``): a run writing it would race the one building it."""
        if self.target.name.endswith(SUFFIX) and _real_folder(self.target):
            other = self.target.with_name(self.target.name[: -len(SUFFIX)])
            if _is_mark(self.target / MARK, other):
                raise PhraseScorerError(f"is where the folder that replaces {other} is built", path=self.target,
                                        hint=Text("choose another folder; continue that run with ",
                                                  setting("resume", True), " into ", os.fspath(other)))

    @property
    def pending(self) -> bool:
        """Whether ``target.new`` is a replacement being built (its mark in place)."""
        return _real_folder(self.building) and _is_mark(self.building / MARK, self.target)

    def recover(self) -> None:
        """Finish a swap a killed run began (the mark in ``target``, or the old folder moved
        inside the new one); a no-op when there is none."""
        if not _real_folder(self.target) and self.pending and _real_folder(self.building / REPLACED):
            os.rename(self.building, self.target)  # the old folder was moved inside: the new goes into place
            fsync_dir(self.target.parent)
        if not (_real_folder(self.target) and _is_mark(self.target / MARK, self.target)):
            return
        for old in (self.target / REPLACED, self.building):
            if _real_folder(old) and not _is_mark(old / MARK, self.target):
                self._give_back(old)
                self._remove(old, marked=False)
        (self.target / MARK).unlink()
        fsync_dir(self.target)

    def foreign(self, folder: Path, *, marked: bool) -> list:
        """The entries of ``folder`` that are not the tool's (a link counts as the user's)."""
        found = []
        for entry in os.scandir(folder):
            if marked and entry.name == MARK:
                continue
            if entry.is_symlink() or not self.own_entry(entry.name):
                found.append(entry.name)
        return sorted(found)

    def _remove(self, folder: Path, *, marked: bool) -> None:
        strange = self.foreign(folder, marked=marked)
        if strange:
            raise PhraseScorerError(f"holds {', '.join(strange[:3])}{', ...' if len(strange) > 3 else ''}, which "
                                    "phrase-scorer did not make there: refusing to remove it", path=folder,
                                    hint="move those files away, then run the command again")
        shutil.rmtree(folder)

    def _give_back(self, old: Path) -> None:
        """Move the user's entries of the old folder ``old`` into ``target``."""
        for name in self.foreign(old, marked=False):
            if name in (MARK, REPLACED) or os.path.lexists(self.target / name):
                continue  # never over a file of the new folder: left where it is, and named
            try:
                os.rename(old / name, self.target / name)
            except OSError:  # a mount point, say: left where it is, and named when the old folder is not removed
                continue

    def discard(self) -> None:
        """Remove ``target.new``, provably this tool's (its mark, and nothing but the tool's entries)."""
        if not self.pending:
            return
        self._remove(self.building, marked=True)
        fsync_dir(self.target.parent)

    # --- building and swapping -------------------------------------------------------------------

    def begin(self) -> Path:
        """Make ``target.new`` with its mark (a ``target.new`` of a killed run is removed first
        if it is provably this tool's, else refused); returns it."""
        if os.path.lexists(self.building):
            if not self.pending:
                raise PhraseScorerError("is in the way of the folder that replaces the output, and is not one "
                                        "phrase-scorer made", path=self.building,
                                        hint="move it away, or choose another output folder")
            self.discard()
        try:
            os.mkdir(self.building)
            fd = create_new(self.building / MARK, 0o644)
        except OSError as exc:
            raise PhraseScorerError(f"cannot create the folder the new one is built in ({exc.strerror or exc})",
                                    path=self.building, hint="make the folder above it writable, or choose another "
                                                             "output folder") from None
        try:
            os.write(fd, mark_text(self.target))
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(self.target.parent)
        return self.building

    def commit(self) -> None:
        """Put the finished ``target.new`` in place of ``target``: exchanged in one step, the
        user's files of the old folder moved into the new one, the old folder removed."""
        if not _real_folder(self.target) and os.path.lexists(self.target):
            raise PhraseScorerError("is no longer a folder: the new one is kept beside it", path=self.target,
                                    hint=Text("move it away, then run the command again with ",
                                              setting("resume", True)))
        try:
            if not _real_folder(self.target):
                os.rename(self.building, self.target)
            elif not exchange(self.target, self.building):
                os.rename(self.target, self.building / REPLACED)  # a reader finds no folder until the next rename
                os.rename(self.building, self.target)
        except OSError as exc:  # another file system (a mount point), permissions
            raise PhraseScorerError(f"cannot put the new folder in its place ({exc.strerror or exc})",
                                    path=self.target,
                                    hint=f"it is complete in {self.building}: move it there by hand") from None
        fsync_dir(self.target.parent)
        log.info("%s replaced by the new one", self.target)
        self.recover()
