"""Writing an output whole or not at all, and the files made beside it.

:class:`AtomicOutput` writes to a temporary file beside the target and renames it into place
only when everything has been written, so a failure never leaves a half-written file under the
final name. Standard output, a character device and a FIFO are written directly
(:mod:`phrase_scorer.io.descriptors`; :mod:`phrase_scorer.io.outputs` decides what may be written
over). A file beside an output is created exclusively and never through a link
(:func:`create_new`, :func:`new_temporary`), removed only while it is the file this run made
(:func:`remove_if_same`), or, left by a killed run, while its name shows it is the tool's and its
writer is gone (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import stat
import sys
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO, Dict, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.descriptors import open_direct, writes_directly
from phrase_scorer.io.os_errors import describe_os_error
from phrase_scorer.io.paths import STDIO, PathLike


def require_output_folder(path: PathLike) -> None:
    """Fail, naming the folder, when the folder ``path`` is to be written in does not exist."""
    folder = Path(os.path.abspath(path)).parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise PhraseScorerError(f"the output folder {what}", path=folder,
                                hint=f"create it first (mkdir -p {folder}) or write elsewhere")


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def no_follow() -> int:
    """The flags that open a path only when it is not a symbolic link, and not into a child process."""
    return getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_new(path: PathLike, mode: int = 0o666) -> int:
    """Create ``path`` for writing and return its descriptor; never an existing file.

    The one way a command makes a file beside its output (a ``.part``, a lock, a record's
    temporary file): ``O_EXCL`` with ``O_NOFOLLOW``, so that a file already there, or a symbolic
    link planted there, is never opened, truncated or followed (:class:`FileExistsError`)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | no_follow(), mode)


def open_own(path: PathLike) -> int:
    """Open an existing regular file for reading and writing without following a link (a
    symbolic link raises :class:`OSError`, ELOOP); for companions this tool made earlier."""
    fd = os.open(path, os.O_RDWR | no_follow())
    if not S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file", os.fspath(path))
    return fd


RENAME_NOREPLACE = 1  # renameat2's flags (linux/fs.h)
RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def rename_with(first: PathLike, second: PathLike, flags: int) -> bool:
    """Linux ``renameat2(first, second, flags)`` in one step: True when done, False where the
    system cannot (not Linux, an old C library, a file system without the flag); any other failure
    raises (``FileExistsError`` for ``RENAME_NOREPLACE`` onto a name that is taken)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), flags) == 0:
        return True
    number = ctypes.get_errno()
    if number in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(number, os.strerror(number), os.fspath(second))


def move_to_free_name(first: PathLike, second: PathLike) -> None:
    """Give the file ``first`` the name ``second``, which must be free (``FileExistsError`` when it
    is not: nothing there is ever replaced); in one step where the system can, else by a second
    name and the removal of the first."""
    if not rename_with(first, second, RENAME_NOREPLACE):
        os.link(first, second, follow_symlinks=False)
        os.unlink(first)


def file_key(info: os.stat_result) -> Tuple[int, int]:
    """A file as the operating system knows it: (device, inode)."""
    return info.st_dev, info.st_ino


def remove_if_same(path: PathLike, key: Optional[Tuple[int, int]]) -> None:
    """Remove ``path`` only when it is still the file this run created (``key``, from
    :func:`file_key`): a file put there since, or a link, is left alone."""
    if key is None:
        return
    try:
        info = os.lstat(path)
    except OSError:
        return
    if file_key(info) == key and S_ISREG(info.st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks after boot, /proc/PID/stat's 22nd field); None
    when no such process runs (or the system has no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _runs(pid: int) -> bool:
    """Whether a process ``pid`` runs (for a writer whose start time was not known)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _boot() -> str:
    """This boot of the machine, short (process ids and start times repeat after a reboot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().replace(b"-", b"").strip()[:8].decode("ascii")
    except (OSError, UnicodeDecodeError):
        return "0" * 8


_WRITERS: Dict[int, str] = {}


def writer_tag() -> str:
    """Which run makes a temporary file, as its name carries it: ``wPID-START-BOOT`` (the process,
    when it started, the boot), so that the next run can tell a file whose writer is gone."""
    pid = os.getpid()
    if pid not in _WRITERS:
        _WRITERS[pid] = f"w{pid}-{_process_start(pid) or 0}-{_boot()}"
    return _WRITERS[pid]


# NAME.wPID-START-BOOT.XXXXXXXX.part: a temporary file of NAME (new_temporary)
_TEMPORARY = re.compile(r"(.+)\.w([0-9]{1,10})-([0-9]{1,20})-([0-9a-f]{8})\.[0-9a-f]{8}\.part")


def remove_stale_temporaries(path: PathLike, *, every_name: bool = False) -> list:
    """Remove the temporary files of ``path`` that killed runs left (``NAME.wPID-START-BOOT.XXXXXXXX.part``,
    :func:`new_temporary`) while they are provably this tool's and abandoned: the name says which
    process made it, and that process no longer runs (no process of that id started then, in this
    boot); the file is a regular file (not a link) with no other name, owned by this user. Anything
    else beside ``path`` is left alone, as is a temporary file of a run still writing. With
    ``every_name``, ``path`` is a folder and those of every file in it are removed (a folder only
    the tool writes in, such as a model's ``recent``). Returns the paths removed. The caller holds
    the lock of ``path`` (:func:`phrase_scorer.io.outputs.check_output`) or of the folder."""
    path = os.path.abspath(path)
    folder, name = (path, None) if every_name else os.path.split(path)
    removed: list = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or (name is not None and match.group(1) != name):
            continue
        pid, started, boot = int(match.group(2)), int(match.group(3)), match.group(4)
        if boot == _boot() and (_process_start(pid) == started if started else _runs(pid)):
            continue  # its writer still runs
        try:
            info = os.lstat(entry.path)
        except OSError:
            continue
        if not S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
            continue
        remove_if_same(entry.path, file_key(info))
        removed.append(entry.path)
    return removed


def new_temporary(path: PathLike) -> Tuple[int, str]:
    """A new file beside ``path`` to write it under before the rename:
    ``NAME.wPID-START-BOOT.XXXXXXXX.part`` (the run that writes it, :func:`writer_tag`, then a random part;
    created exclusively: no file there is ever written over). Returns its descriptor and name.
    A run killed before its rename leaves it; the next run writing ``path`` removes it
    (:func:`remove_stale_temporaries`)."""
    name = os.path.basename(os.path.abspath(path))
    for _ in range(100):
        candidate = os.path.join(os.path.dirname(os.fspath(path)),
                                 f"{name}.{writer_tag()}.{os.urandom(4).hex()}.part")
        try:
            return create_new(candidate), candidate
        except FileExistsError:
            continue
    raise PhraseScorerError("cannot create a temporary file beside the output", path=path)  # pragma: no cover


def keep_mode_of(target: PathLike, fd: int) -> None:
    """Give the new file ``fd`` the permission bits of the regular file it will replace at
    ``target`` (a 0600 output stays 0600; set-id bits are not carried over); a new output, or one
    replacing a link, keeps the umask's."""
    try:
        info = os.lstat(target)
    except OSError:
        return
    if S_ISREG(info.st_mode):  # not through a link: replacing a link replaces the link alone
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o777)


class AtomicOutput:
    """Write a file under a temporary name and rename it into place on :meth:`commit`.

    Use as a context manager: leaving the block without :meth:`commit` (an error, Ctrl-C) removes
    the temporary file unless ``keep_on_failure`` is set (the caller keeps it for a later run to
    resume from: :mod:`phrase_scorer.runtime.job` decides). ``-`` writes to stdout directly;
    a character device or FIFO is opened and written directly too (``direct``), never renamed over.

    The temporary file is created exclusively and never through a link: a new
    ``NAME.wPID-START-BOOT.XXXXXXXX.part`` (:func:`new_temporary`); for a resumable output, that
    file is moved to ``part`` (``OUT.part``, which the caller has made free first) by
    :meth:`publish` once its resume record names it, or ``part`` is opened as the caller's own
    with ``append`` (:mod:`phrase_scorer.runtime.job`). The file that replaces an existing one takes its
    permission bits (:func:`keep_mode_of`); what is removed on failure is only the file this
    object created or was given.
    """

    def __init__(self, path: PathLike, *, append: bool = False, keep_on_failure: bool = False,
                 part: Optional[PathLike] = None) -> None:
        self.path = os.fspath(path)
        self.to_stdout = self.path == STDIO
        self.direct = writes_directly(self.path)
        self.keep_on_failure = keep_on_failure
        self.committed = False
        self._part = None if part is None or append else Path(part)  # where publish() moves a fresh part
        self._key: Optional[Tuple[int, int]] = None
        self.tmp_path: Optional[Path] = None
        if self.to_stdout:
            self.file: BinaryIO = sys.stdout.buffer
        elif self.direct:
            self.file = open_direct(self.path)
        else:
            require_output_folder(self.path)
            try:
                if part is None or not append:  # a fresh part is published at its name by publish()
                    fd, name = new_temporary(self.path)
                    self.tmp_path = Path(name)
                else:
                    self.tmp_path = Path(part)
                    fd = open_own(part)
            except FileExistsError:
                raise PhraseScorerError("a file is in the way of the partial output", path=part,
                                        hint="it was not left by this command: move it away or choose another "
                                             "output") from None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise PhraseScorerError("the partial output is a symbolic link: refusing to follow it", path=part,
                                            hint="remove the link or choose another output") from None
                raise describe_os_error(exc, self.tmp_path or self.path) from None
            self._key = file_key(os.fstat(fd))
            self.file = os.fdopen(fd, "r+b" if append else "wb")
            if append:
                self.file.seek(0, os.SEEK_END)

    def write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            raise describe_os_error(exc, self.tmp_path or self.path) from None

    def flush(self) -> None:
        """Flush to the operating system and to disk (a checkpoint for resuming)."""
        try:
            self.file.flush()
            if not self.direct:
                os.fsync(self.file.fileno())
        except OSError as exc:
            raise describe_os_error(exc, self.tmp_path or self.path) from None

    def tell(self) -> int:
        return self.file.tell()

    def commit(self) -> None:
        if self.direct:
            self.flush()
            if not self.to_stdout:
                self.file.close()
            self.committed = True
            return
        self.flush()
        assert self.tmp_path is not None  # set whenever the output is not written directly
        keep_mode_of(self.path, self.file.fileno())
        self.file.close()
        os.replace(self.tmp_path, self.path)
        fsync_dir(Path(self.path).parent)
        self.committed = True

    def publish(self) -> None:
        """Move a fresh resumable part to its name (``OUT.part``) once its resume record names it:
        a run killed before leaves only a file named as this run's (:func:`remove_stale_temporaries`),
        never an ``OUT.part`` that no record names. A file at that name is never replaced."""
        assert self._part is not None and self.tmp_path is not None, "publish a fresh part once"
        try:
            move_to_free_name(self.tmp_path, self._part)
        except FileExistsError:
            raise PhraseScorerError("a file is in the way of the partial output", path=self._part,
                                    hint="it was not left by this command: move it away or choose another "
                                         "output") from None
        self.tmp_path, self._part = self._part, None

    def abort(self) -> None:
        if self.to_stdout or self.committed:
            return
        try:
            self.file.close()
        except OSError:
            pass
        if self.direct:
            return
        if not self.keep_on_failure:
            assert self.tmp_path is not None  # set whenever the output is not written directly
            remove_if_same(self.tmp_path, self._key)

    def __enter__(self) -> "AtomicOutput":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()


def write_text_atomically(path: PathLike, text: str) -> None:
    """Write a small text file (JSON, ini) atomically."""
    write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: PathLike, data: bytes) -> None:
    """Write a small file atomically."""
    with AtomicOutput(path) as out:
        out.write(data)
        out.commit()
