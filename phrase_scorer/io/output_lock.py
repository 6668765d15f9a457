"""The lock that keeps two runs from writing the same output at the same time
(:class:`OutputLock`, ``OUT.lock``), and the locks this process holds."""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import re
from stat import S_ISREG
from typing import Dict, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import (create_new, file_key, new_temporary, no_follow, remove_if_same,
                                     require_output_folder)
from phrase_scorer.io.descriptors import writes_directly
from phrase_scorer.io.os_errors import describe_os_error
from phrase_scorer.io.paths import PathLike


LOCK_MAGIC = b"phrase-scorer output lock\n"  # the first line of every lock this tool writes


_OWN_LOCK = re.compile(re.escape(LOCK_MAGIC) + rb"pid [0-9]{1,10}\n\Z")


def _is_own_lock(content: bytes) -> bool:
    """Whether a lock file's bytes are exactly what this tool writes: ``LOCK_MAGIC`` and
    ``pid N``; a file that only begins so, or anything else, is not the tool's."""
    return _OWN_LOCK.match(content) is not None


class OutputLock:
    """An exclusive, advisory lock on ``PATH.lock`` held while a run writes ``PATH``.

    The lock is released by the operating system when the process dies, so a killed run never
    blocks the ``--resume`` that follows it. A second run (another process) is refused with one
    line naming ``PATH``. Within one process the lock is re-entrant: a writer that claims an
    output its command already holds (:func:`phrase_scorer.io.outputs.check_output` took it, and
    the writer takes it again around its own work) shares the held lock, which is released when
    the last of them lets go. ``-``, a character device and a FIFO take no lock (no file is made
    beside them).

    The lock file is this tool's own or it is not touched: it is made whole under a temporary
    name and linked into place (so it never exists without its first line, ``LOCK_MAGIC``); a
    file already at ``PATH.lock`` is taken over only when it is a regular file (not a link) that
    holds a lock this tool wrote and no process holds (a run that was killed); anything else
    there is refused with one line, and never opened for writing, truncated or removed. At the
    end the lock file is removed only while it is still the one this run held.

    ``wait``: a second run waits for the first to let go instead of being refused (two EMS test
    sets building one reranker: the second then reuses what the first built).
    """

    def __init__(self, path: PathLike, *, wait: bool = False) -> None:
        self.path = os.fspath(path)
        self.lock_path = self.path + ".lock"
        self.wait = wait
        self._fd: Optional[int] = None
        self._users = 0  # acquisitions of this held lock not released yet (the holder's)
        self._holder: Optional["OutputLock"] = None  # the lock this one shares (the same file, held before)
        self._pid = 0
        self._key: Optional[Tuple[int, int]] = None

    @property
    def held(self) -> bool:
        return self._fd is not None or self._holder is not None

    def fileno(self) -> Optional[int]:
        """The descriptor that holds the lock (None when none is held here). A child process
        given a copy keeps the lock held until it ends, even past this process's death; it must
        not unlock it, only close it."""
        return self._holder.fileno() if self._holder is not None else self._fd

    def _refuse(self, problem: str) -> PhraseScorerError:
        return PhraseScorerError(f"{self.lock_path} {problem}, not a lock of this tool", path=self.path,
                                 hint=f"move {self.lock_path} away, or choose another output")

    def _create(self) -> Optional[int]:
        """The new lock file, made whole and linked into place; None when a file is there."""
        content = LOCK_MAGIC + f"pid {os.getpid()}\n".encode()
        fd, temporary = new_temporary(self.lock_path)
        try:
            os.write(fd, content)
            try:
                os.link(temporary, self.lock_path)
            except FileExistsError:
                os.close(fd)
                return None
            except OSError:  # a file system without hard links: create it exclusively instead
                try:
                    os.close(fd)
                    fd = create_new(self.lock_path, 0o644)
                except FileExistsError:
                    return None
                os.write(fd, content)
            os.close(fd)
            return os.open(self.lock_path, os.O_RDONLY | no_follow())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _open_existing(self) -> Optional[int]:
        """The lock file already there, opened for reading without following a link, when it is
        this tool's; None when it went away meanwhile."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | no_follow() | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse("is a symbolic link") from None
            raise describe_os_error(exc, self.lock_path) from None
        info = os.fstat(fd)
        if not S_ISREG(info.st_mode):
            os.close(fd)
            raise self._refuse("is not a regular file")
        content = os.read(fd, 256)
        if not _is_own_lock(content):
            os.close(fd)
            raise self._refuse("holds something else")
        return fd

    def acquire(self) -> None:
        if self.held:
            raise RuntimeError(f"{self.lock_path} is already acquired through this object")
        if writes_directly(self.path):  # stdout, a device or a pipe: no lock file beside it
            return
        key = os.path.abspath(self.lock_path)
        holder = _HELD.get(key)
        if holder is not None and holder._pid == os.getpid():  # this command holds it already
            holder._users += 1
            self._holder = holder
            return
        require_output_folder(self.path)
        vanished = 0  # lock files gone between making and opening them: a folder that keeps none ends it
        while True:
            try:
                fd = self._create()
                if fd is None:
                    fd = self._open_existing()
            except FileNotFoundError:
                fd = None
                vanished += 1
                if vanished > 100:  # /proc's folders, say: they accept no new file
                    raise PhraseScorerError("cannot create the output's lock file in this folder",
                                            path=self.lock_path, hint="write the output to a folder of files") from None
            except PermissionError:
                folder = os.path.dirname(os.path.abspath(self.path))
                raise PhraseScorerError("cannot create files in the output folder (permission denied)", path=folder,
                                        hint="write the output to a folder you may write in") from None
            if fd is None:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise PhraseScorerError(
                    "another phrase-scorer run is writing this output",
                    path=self.path,
                    hint=f"wait for it to finish, or choose another output; lock file {self.lock_path}",
                ) from None
            # The holder before us unlinks the file as it releases it; if we locked such an
            # orphaned file, try again on the file that now stands under the name.
            try:
                same = file_key(os.lstat(self.lock_path)) == file_key(os.fstat(fd))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        self._key = file_key(os.fstat(fd))
        self._users = 1
        self._pid = os.getpid()
        _HELD[key] = self

    def release(self) -> None:
        if self._holder is not None:
            holder, self._holder = self._holder, None
            holder._let_go(all_users=False)
        elif self._fd is not None:
            self._let_go(all_users=False)

    def _let_go(self, *, all_users: bool) -> None:
        self._users = 0 if all_users else self._users - 1
        if self._users > 0 or self._fd is None:
            return
        if _HELD.get(os.path.abspath(self.lock_path)) is self:
            del _HELD[os.path.abspath(self.lock_path)]
        if self._pid == os.getpid():  # not a forked child's copy: the file is ours to remove
            remove_if_same(self.lock_path, self._key)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "OutputLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# The output locks this process holds, by the lock file's absolute path.
_HELD: Dict[str, OutputLock] = {}


def held_output_locks() -> list:
    """The output locks this process holds now."""
    return list(_HELD.values())


def release_output_locks(keep=()) -> None:
    """Let go of every output lock this process still holds but those in ``keep`` (at the end of a
    command, and at exit): an output claimed by a writer that never released it is free once its
    command ends."""
    for lock in list(_HELD.values()):
        if any(lock is kept for kept in keep):
            continue
        if lock._pid == os.getpid():
            lock._let_go(all_users=True)
        else:  # a forked child's copy of its parent's lock: the parent's to release
            _HELD.pop(os.path.abspath(lock.lock_path), None)


atexit.register(release_output_locks)
