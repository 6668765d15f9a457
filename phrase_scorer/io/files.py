"""Opening, writing and locking files the way every command needs them.

* :func:`open_input` reads plain or gzip files (detected by their magic bytes, not their name)
  or standard input (``-``), and reports how many raw bytes it has consumed so that progress bars
  can show an ETA.
* :class:`AtomicOutput` writes to a ``.part`` file beside the target and renames it into place
  only when everything has been written, so a failure never leaves a half-written file under the
  final name. Standard output, a character device and a FIFO are written directly (see
  :mod:`phrase_scorer.io.outputs`, which also decides what may be written over).
* :class:`GzipMembers` writes gzip output as a series of independent members (one per chunk), which
  zcat, Python and Moses' own reader all read as one stream, and which makes an interrupted write
  resumable at a chunk boundary.
* :class:`OutputLock` keeps two runs from writing the same output at the same time.

Gzip goes through ISA-L (``isal``) where it is installed: on a phrase table it decompresses about
1.5 times as fast as the standard library's zlib, and compresses at its level 3 about six times as
fast as zlib's level 6 (figures in docs/benchmarks.md), and writes plain gzip. Without it the standard library is used.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import fcntl
import gzip
import io
import os
import re
import sys
import stat
from stat import S_ISREG
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO, Dict, Iterator, Mapping, Optional, Tuple, Union

from phrase_scorer.errors import PhraseScorerError, Text

fast_gzip: ModuleType
try:  # ISA-L: the fast gzip (see the module docstring)
    from isal import igzip as fast_gzip
    from isal import isal_zlib

    GZIP_LIBRARY = "isal"
    GZIP_ERRORS: tuple = (zlib.error, isal_zlib.error)
    MAX_COMPRESS_LEVEL = 3
except ImportError:  # pragma: no cover - isal is a dependency; this keeps a bare install working
    fast_gzip = gzip
    GZIP_LIBRARY = "zlib"
    GZIP_ERRORS = (zlib.error,)
    MAX_COMPRESS_LEVEL = 9

PathLike = Union[str, os.PathLike]

GZIP_MAGIC = b"\x1f\x8b"
STDIO = "-"


def _stat(path: PathLike) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def writes_directly(path: PathLike) -> bool:
    """True for ``-``, for an open descriptor named through its links (``/dev/stdout``,
    ``/dev/fd/3``, ``/proc/self/fd/1`` or a link to one of them, whatever file the descriptor is:
    :func:`named_descriptor`) and for an existing character device or FIFO (after following
    links): written in place, since renaming a finished file over them would replace the link,
    the device or the pipe itself."""
    if os.fspath(path) == STDIO or named_descriptor(path) is not None:
        return True
    info = _stat(path)
    return info is not None and (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode))


# An open descriptor as the operating system names it: /proc/PID/fd/N (/proc/self, /dev/fd and
# /dev/stdout lead there), or a thread's /proc/PID/task/TID/fd/N.
_DESCRIPTOR = re.compile(r"/proc/(?:self|thread-self|[0-9]+)(?:/task/[0-9]+)?/fd/([0-9]+)")
_MAX_LINKS = 40  # as the kernel's limit on the links followed in one path


def named_descriptor(path: PathLike) -> Optional[str]:
    """The ``/proc/PID/fd/N`` entry that ``path`` reaches through its chain of links, or None.

    ``/dev/stdout`` is a link to ``/proc/self/fd/1``, itself a link to whatever file descriptor 1
    is: a terminal, a pipe, a socket or the regular file a shell redirected it to. Such a path
    names the descriptor, not a file to replace: an output given so is written through it
    (:func:`open_direct`), never renamed over (which would replace the link itself) and nothing
    is made beside it. Each link is read in turn (the folders above it resolved), so a chain of
    links ending there is found too; the kernel's "magic" links under /proc are not followed."""
    if not isinstance(path, (str, os.PathLike)) or os.fspath(path) in ("", STDIO):
        return None
    current = os.path.abspath(os.fspath(path))
    for _ in range(_MAX_LINKS):
        name = os.path.basename(current)
        if name in ("", ".", ".."):
            return None
        try:
            folder = os.path.realpath(os.path.dirname(current))
        except (OSError, ValueError):
            return None
        current = os.path.join(folder, name)
        if _DESCRIPTOR.fullmatch(current):
            return current
        try:
            target = os.readlink(current)
        except (OSError, ValueError):
            return None  # not a link (or not there): the end of the chain
        current = os.path.join(folder, target)
    return None


def own_descriptor(path: PathLike) -> Optional[int]:
    """The number of this process's descriptor that ``path`` names (:func:`named_descriptor`),
    checked open for writing; None when ``path`` names none of this process's descriptors. A
    descriptor that is not open, or open for reading only (``/dev/stdin``), is an error naming
    the path: checked where the output is checked, before any work."""
    entry = named_descriptor(path)
    if entry is None or not entry.startswith(f"/proc/{os.getpid()}/"):
        return None
    match = _DESCRIPTOR.fullmatch(entry)
    assert match is not None
    number = int(match.group(1))
    try:
        flags = fcntl.fcntl(number, fcntl.F_GETFL)
    except OSError:
        raise PhraseScorerError(f"names file descriptor {number}, which is not open", path=path,
                                hint="give a file name, or - for standard output") from None
    if flags & os.O_ACCMODE == os.O_RDONLY:
        raise PhraseScorerError(f"names file descriptor {number}, which is open for reading only", path=path,
                                hint="give a file name, or - for standard output")
    return number


def open_direct(path: PathLike) -> BinaryIO:
    """Open an output written in place (:func:`writes_directly`, not ``-``) for writing.

    A descriptor of this process (``/dev/stdout``) is written through a duplicate of it, at its
    own offset, so that ``> file`` and ``>> file`` keep their meaning and a socket works; one of
    another process is opened for appending, never truncated; a device or a FIFO is opened as it
    is. A descriptor that is not open, or not open for writing, is an error naming the path."""
    path = os.fspath(path)
    entry = named_descriptor(path)
    number = own_descriptor(path)
    if number is not None:
        fd = os.dup(number)
        os.set_inheritable(fd, False)
        return os.fdopen(fd, "wb")
    try:
        if entry is not None:
            return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)), "wb")
        return open(path, "wb")
    except OSError as exc:
        raise describe_os_error(exc, path) from None



class CountingReader(io.RawIOBase):
    """Wraps a raw binary file and counts the bytes read through it."""

    def __init__(self, raw: Any) -> None:  # a raw file (FileIO, stdin's), or stdin's buffer: what has readinto
        self._raw = raw
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        self.bytes_read += n or 0
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class InputFile:
    """A binary line source over a plain or gzip file, or stdin.

    ``size`` is the raw (possibly compressed) size when known, ``bytes_read`` how much of it has
    been consumed: together they give a progress fraction.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        self.size: Optional[int] = None
        if self.path == STDIO:
            raw = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
        else:
            try:
                raw = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                raise PhraseScorerError("no such file", path=self.path) from None
            except IsADirectoryError:
                raise PhraseScorerError("is a directory, expected a file", path=self.path) from None
            except PermissionError:
                raise PhraseScorerError("permission denied", path=self.path) from None
            self.size = os.fstat(raw.fileno()).st_size
        self._counter = CountingReader(raw)
        buffered = io.BufferedReader(self._counter, buffer_size=1 << 20)
        self.compressed = buffered.peek(2)[:2] == GZIP_MAGIC
        if self.compressed:
            self.stream: io.BufferedReader[Any] = io.BufferedReader(fast_gzip.GzipFile(fileobj=buffered, mode="rb"),
                                                                    1 << 20)
        else:
            self.stream = buffered

    @property
    def bytes_read(self) -> int:
        return self._counter.bytes_read

    def __iter__(self):
        return iter(self.stream)

    def read(self, size: int = -1) -> bytes:
        return self.stream.read(size)

    def read1(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes, without waiting for more than one read of the source (a pipe
        gives what has been written to it); b"" only at the end."""
        return self.stream.read1(size)

    def close(self) -> None:
        if self.path != STDIO:
            self.stream.close()

    def __enter__(self) -> "InputFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ReadProgress:
    """How far a reader has got through the :class:`InputFile` it holds open as ``_input``, for
    progress bars."""

    _input: Optional[InputFile] = None

    def follow(self, source: InputFile) -> None:
        """Report on ``source`` (an open :class:`InputFile`) from now on."""
        self._input = source

    @property
    def size(self) -> Optional[int]:
        return self._input.size if self._input is not None else None

    @property
    def bytes_read(self) -> int:
        return self._input.bytes_read if self._input is not None else 0


def open_input(path: PathLike) -> InputFile:
    """Open ``path`` (``-`` for stdin) for binary line reading, gunzipping when needed."""
    return InputFile(path)


def is_gzip_name(path: PathLike) -> bool:
    return os.fspath(path).endswith(".gz")


def part_path(path: PathLike) -> Path:
    """The temporary file an output is written to before it is renamed into place."""
    path = Path(path)
    return path.with_name(path.name + ".part")


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


def describe_os_error(exc: OSError, path: PathLike) -> PhraseScorerError:
    """Turn an OSError met while writing into a one-line project error (``-``: standard output)."""
    if os.fspath(path) == STDIO:
        path = "<stdout>"
    return out_of_resources(exc, path) or PhraseScorerError(f"cannot write: {exc.strerror or exc}", path=path)


def _soft_limit(name: str) -> Optional[int]:
    import resource

    soft = resource.getrlimit(getattr(resource, name))[0]
    return None if soft == resource.RLIM_INFINITY else soft


def out_of_resources(exc: OSError, path: Optional[PathLike] = None) -> Optional[PhraseScorerError]:
    """The one line of an OSError saying the machine ran out of something: disk space (ENOSPC,
    EDQUOT), the file-size limit (EFBIG), file descriptors (EMFILE, ENFILE), memory (ENOMEM), or
    processes and threads (EAGAIN, where no file is named), with the limit that was reached and what
    to do; ``path``: the file it was met on, where known. None for any other error."""
    code, kept = exc.errno, "; the previous output, if any, is untouched"
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        what = ("disk quota exceeded (EDQUOT)" if code != errno.ENOSPC else
                "no space left on the device " + ("while writing (ENOSPC)" if path is not None else "(ENOSPC)"))
        return PhraseScorerError(what, path=path, hint="free some space or write elsewhere" + kept)
    if code == errno.EFBIG:  # past the file-size limit (ulimit -f), or the file system's largest file
        limit = _soft_limit("RLIMIT_FSIZE")
        shown = f": the limit is {limit:,} bytes (ulimit -f)" if limit is not None else ""
        return PhraseScorerError(f"file too large (EFBIG){shown}", path=path,
                                 hint="raise the limit (ulimit -f unlimited) or write elsewhere" + kept)
    if code in (errno.EMFILE, errno.ENFILE):
        limit = _soft_limit("RLIMIT_NOFILE")
        what = ("too many open files (EMFILE)" + (f": the limit is {limit} (ulimit -n)" if limit is not None else "")
                if code == errno.EMFILE else "the system has no file descriptor left (ENFILE)")
        return PhraseScorerError(what, path=path,
                                 hint="raise the limit (ulimit -n 4096), or start fewer worker processes or ranks")
    if code == errno.ENOMEM:
        limits = [f"the {what} limit of {limit / (1 << 20):,.0f} MiB ({shell})"
                  for name, what, shell in (("RLIMIT_AS", "address-space", "ulimit -v"),
                                            ("RLIMIT_DATA", "data-segment", "ulimit -d"))
                  for limit in [_soft_limit(name)] if limit is not None]
        shown = f" under {' and '.join(limits)}" if limits else ""
        return PhraseScorerError(f"out of memory (ENOMEM){shown}", path=path,
                                 hint="give the run more memory, or make it use less: fewer worker processes or "
                                      "ranks, smaller batches")
    if code == errno.EAGAIN and path is None:  # fork or a thread's start; a file's EAGAIN is no shortage
        limits = [f"{limit} processes and threads (ulimit -u)" for limit in [_soft_limit("RLIMIT_NPROC")] if limit]
        limits += [f"{limit / (1 << 20):,.0f} MiB of address space for the stacks (ulimit -v)"
                   for limit in [_soft_limit("RLIMIT_AS")] if limit]  # a thread's stack must fit in it too
        shown = f": the limits are {' and '.join(limits)}" if limits else ""
        return PhraseScorerError(f"cannot start another process or thread (EAGAIN){shown}",
                                 hint="raise them, or start fewer worker processes, ranks or threads")
    return None


def _no_follow() -> int:
    return getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_new(path: PathLike, mode: int = 0o666) -> int:
    """Create ``path`` for writing and return its descriptor; never an existing file.

    The one way a command makes a file beside its output (a ``.part``, a lock, a record's
    temporary file): ``O_EXCL`` with ``O_NOFOLLOW``, so that a file already there, or a symbolic
    link planted there, is never opened, truncated or followed (:class:`FileExistsError`)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _no_follow(), mode)


def open_own(path: PathLike) -> int:
    """Open an existing regular file for reading and writing without following a link (a
    symbolic link raises :class:`OSError`, ELOOP); for companions this tool made earlier."""
    fd = os.open(path, os.O_RDWR | _no_follow())
    if not S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(errno.EISDIR, "not a regular file", os.fspath(path))
    return fd


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
    ``NAME.wPID-START-BOOT.XXXXXXXX.part`` (:func:`new_temporary`), or, for a resumable output, ``part`` (``OUT.part``),
    which the caller has made free first or, with ``append``, opened as its own
    (:mod:`phrase_scorer.runtime.job`). The file that replaces an existing one takes its
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
        self._key: Optional[Tuple[int, int]] = None
        self.tmp_path: Optional[Path] = None
        if self.to_stdout:
            self.file: BinaryIO = sys.stdout.buffer
        elif self.direct:
            self.file = open_direct(self.path)
        else:
            require_output_folder(self.path)
            try:
                if part is None:
                    fd, name = new_temporary(self.path)
                    self.tmp_path = Path(name)
                else:
                    self.tmp_path = Path(part)
                    fd = open_own(part) if append else create_new(part)
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


def gzip_member(data: bytes, level: int = MAX_COMPRESS_LEVEL) -> bytes:
    """One complete gzip member holding ``data``, with a zero timestamp (reproducible bytes).

    ``level`` is the library's: ISA-L has levels 0-3, zlib 1-9; a higher one is clipped."""
    return fast_gzip.compress(data, min(level, MAX_COMPRESS_LEVEL), mtime=0)


def write_text_atomically(path: PathLike, text: str) -> None:
    """Write a small text file (JSON, ini) atomically."""
    write_bytes_atomically(path, text.encode("utf-8"))


def write_bytes_atomically(path: PathLike, data: bytes) -> None:
    """Write a small file atomically."""
    with AtomicOutput(path) as out:
        out.write(data)
        out.commit()


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
            return os.open(self.lock_path, os.O_RDONLY | _no_follow())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def _open_existing(self) -> Optional[int]:
        """The lock file already there, opened for reading without following a link, when it is
        this tool's; None when it went away meanwhile."""
        try:
            fd = os.open(self.lock_path, os.O_RDONLY | _no_follow() | getattr(os, "O_NONBLOCK", 0))
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


def read_gzip_error(exc: BaseException) -> Optional[str]:
    """A readable description of a gzip/zlib failure, or None if ``exc`` is not one."""
    if isinstance(exc, EOFError):
        return "the gzip stream ends early: the file is truncated (an interrupted copy or download?)"
    if isinstance(exc, gzip.BadGzipFile):
        return f"not a valid gzip file ({exc})"
    if isinstance(exc, GZIP_ERRORS):
        return f"corrupt gzip data ({exc})"
    return None


def gzip_damage(path: PathLike, block_size: int = 1 << 20) -> Optional[tuple]:
    """Where and how a gzip file is damaged, read again from its start: (the complete lines
    before the damage, what is wrong), or None if the whole file reads cleanly.

    Reads the file as gzip readers do (members one after another, zero padding allowed after
    the last), with flat memory, so that an error can name the last good line and tell a
    truncated file from one followed by bytes that are not gzip."""
    lines = 0
    members = 0  # gzip members read to their end
    decompressor = None  # the current member's; None between members
    data = b""  # compressed bytes read and not used yet
    at_end = False
    try:
        source = open(path, "rb")
    except OSError:
        return None
    with source:
        while True:
            if not at_end and (not data or (decompressor is None and len(data) < 2)):
                block = source.read(block_size)
                at_end = not block
                data += block
                if block:
                    continue
            if decompressor is None:  # between members: the next one, zero padding or foreign bytes
                if members:
                    data = data.lstrip(b"\0")
                    if not data:
                        if at_end:
                            return None
                        continue
                if len(data) < 2 and not at_end:
                    continue
                if data[:2] != GZIP_MAGIC:
                    if not members:
                        return 0, "not a valid gzip file"
                    rest = len(data) + max(0, os.fstat(source.fileno()).st_size - source.tell())
                    return lines, (f"the gzip data ends there and is followed by {rest:,} "
                                   f"byte{'s' if rest != 1 else ''} that are not gzip (gzip -d ignores them with a "
                                   "warning; this reader does not)")
                decompressor = zlib.decompressobj(31)
            if not data:
                return lines, "the gzip stream ends early: the file is truncated (an interrupted copy or download?)"
            try:
                out = decompressor.decompress(data, 1 << 22)
            except GZIP_ERRORS as exc:
                return lines, f"corrupt gzip data ({exc})"
            lines += out.count(b"\n")
            if decompressor.eof:
                data, decompressor = decompressor.unused_data, None
                members += 1
            else:
                data = decompressor.unconsumed_tail


def read_failure(exc: BaseException, path: PathLike, lines: int) -> PhraseScorerError:
    """The error for a read that failed after ``lines`` complete lines (as the reader counted
    them). For a damaged gzip file the file is read again to name the last good line exactly,
    and to tell a truncated file from trailing bytes that are not gzip."""
    reason = read_gzip_error(exc)
    if reason is not None and os.fspath(path) != STDIO:
        damage = gzip_damage(path)
        if damage is not None:
            lines, reason = damage
    return PhraseScorerError(f"cannot read after line {lines}: {reason or exc}", path=path)


def line_text(raw: bytes, path: PathLike = STDIO, number: int = 0) -> bytes:
    """A line without its line end: ``\\n`` or ``\\r\\n`` (a file written on Windows), so that no
    reader takes the carriage return for part of the last word.

    Line 1 (``number``) of every text input may not start with a UTF-8 byte-order mark: a reader
    would take it for part of the first word (``<unk>`` for a model, another phrase for Moses).
    It is an error naming ``path`` that says how to remove the mark."""
    if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        import shlex

        strip = "sed '1s/^\\xEF\\xBB\\xBF//'"
        name = os.fspath(path)
        if name == STDIO:
            how = f"remove it from the input with {strip}"
        elif is_gzip_name(name):
            how = f"remove it: zcat {shlex.quote(name)} | {strip} | gzip > {shlex.quote(name + '.new')}"
        else:
            how = f"remove it: {strip.replace('sed ', 'sed --in-place ')} {shlex.quote(name)}"
        raise PhraseScorerError("starts with a UTF-8 byte-order mark, which would be read as part of its first word",
                                path=path, line=1, hint=how)
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    return raw[:-1] if raw.endswith(b"\r") else raw


class TextLines(ReadProgress):
    """The one reader of text inputs (sentences, references, corpora, lists of phrases): (line
    number, text without its line end, :func:`line_text`) for each line of a plain or gzip file
    (``-``: stdin), decoded as UTF-8. A line that is not UTF-8, a byte-order mark, or damaged gzip
    data, is an error naming the file and the line (``hint`` says what to give instead). ``size`` and
    ``bytes_read`` tell a progress bar how far the reading has got."""

    def __init__(self, path: PathLike, hint: Optional[str] = None) -> None:
        self.path = path
        self.hint = hint
        self._input = None

    def __iter__(self) -> Iterator[Tuple[int, str]]:
        path = self.path
        number = 0
        with open_input(path) as f:
            self._input = f
            lines = iter(f)
            while True:
                try:
                    raw = next(lines, None)
                except (EOFError, OSError, ValueError) as exc:
                    raise read_failure(exc, path, number) from None
                if raw is None:
                    return
                number += 1
                try:
                    text = line_text(raw, path, number).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise PhraseScorerError(f"invalid UTF-8 at byte {exc.start + 1}", path=path, line=number,
                                            hint=self.hint) from None
                yield number, text


def text_lines(path: PathLike, hint: Optional[str] = None) -> Iterator[Tuple[int, str]]:
    """(line number, text without its line end) for each line of a text input: see :class:`TextLines`."""
    return iter(TextLines(path, hint))


IDENTITY_STAT = ("device", "inode", "size", "mtime_ns", "ctime_ns")  # what must all match to reuse a hash


def file_identity(path: PathLike) -> dict:
    """The one identity of an input file: ``{"path", "size", "mtime_ns", "sha256", "device",
    "inode", "ctime_ns"}``.

    Two identities are the same input when they hold the same bytes (:func:`identity_change`): the
    size decides first; when the sizes match, the SHA-256 of the bytes decides. The path is there
    to be read by people, never compared. The SHA-256 is ``None`` until it is needed: a record
    that is written (a resume record, a signature, a cache's description) holds it
    (:func:`hash_identities`), and a file takes its hash from the record instead of being read
    again only when it is still the same file with nothing done to it since: its device, inode,
    size, modification time and change time all as recorded (the change time moves with every
    write, and with ``touch -r``, ``cp -p`` or ``rsync -t`` restoring a modification time). A
    pipe or a device, which reading would consume, is known by its path, size and time alone."""
    info = os.stat(path)
    identity = {"path": os.path.abspath(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    if not S_ISREG(info.st_mode):
        return identity
    return {**identity, "sha256": None, "device": info.st_dev, "inode": info.st_ino, "ctime_ns": info.st_ctime_ns}


def is_file_identity(value: Any) -> bool:
    """Whether ``value`` is a :func:`file_identity` as recorded: a mapping with its size and
    SHA-256 (records of experiment steps before the identity had times hold no more)."""
    return isinstance(value, Mapping) and {"size", "sha256"} <= value.keys()


def identity_sha256(identity: dict) -> str:
    """The SHA-256 of the file ``identity`` describes, read (once) if it is not known yet."""
    if identity.get("sha256") is None:
        identity["sha256"] = file_sha256(identity["path"])
    return identity["sha256"]


def untouched(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``current`` is the very file ``saved`` recorded with nothing done to it since
    (:data:`IDENTITY_STAT` all equal; a record without them never is)."""
    return all(saved.get(key) is not None and saved.get(key) == current.get(key) for key in IDENTITY_STAT)


def identity_change(saved: Mapping[str, Any], current: dict) -> Optional[Tuple[str, Any, Any]]:
    """None when the file ``current`` identifies holds the bytes ``saved`` recorded; else what
    differs, as ``(key, saved value, current value)``: its ``size``, or its ``sha256`` (same size,
    other bytes). The file is hashed unless it is :func:`untouched` since the record, when
    ``current`` takes the recorded hash."""
    if saved.get("size") != current.get("size"):
        return "size", saved.get("size"), current.get("size")
    if current.get("sha256") is None and saved.get("sha256") is not None and untouched(saved, current):
        current["sha256"] = saved.get("sha256")
        return None
    digest = identity_sha256(current)
    return None if digest == saved.get("sha256") else ("sha256", saved.get("sha256"), digest)


def hash_identities(value: Any) -> Any:
    """Fill in the SHA-256 of every :func:`file_identity` inside ``value`` (nested mappings and
    lists) that lacks one, before ``value`` is written as a record; returns ``value``."""
    if is_file_identity(value) and isinstance(value, dict):
        identity_sha256(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            hash_identities(item)
    elif isinstance(value, list):
        for item in value:
            hash_identities(item)
    return value


def file_sha256(path: PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse_single_pass(path: PathLike, what: Union[str, Text], reads: str) -> None:
    """Refuse an input that a command reads more than once unless it is a regular file (or a
    link to one): standard input (``-``), a pipe (a shell's process substitution, such as
    ``<(zcat table.gz)``, is a pipe named ``/dev/fd/N``), a socket or a device gives its bytes
    to the first reading alone, and the next would find nothing. ``what`` names the input as
    the user gave it (its option), ``reads`` says why it is read again. Checked by its status
    alone, before any work; a missing file is left to the reader to name."""
    if os.fspath(path) == STDIO:
        raise PhraseScorerError(Text(what, f" cannot be standard input ('-'): {reads}"),
                                hint="give a regular file; a .gz file is read as it is")
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if S_ISREG(mode):
        return
    kind = ("a pipe (a process substitution is one)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    raise PhraseScorerError(Text(what, f" is {kind}, whose bytes can be read once: {reads}"), path=path,
                            hint="save the stream to a regular file first; a .gz file is read as it is")
