"""When the machine runs out: memory, disk space, open files, processes and threads.

Whatever verb meets it, and wherever (Python's ``MemoryError``, an ``OSError`` of the kernel, or
the same condition wrapped by torch in a ``RuntimeError``: a checkpoint's zip writer, the CPU
allocator, gloo's sockets), a run that runs out of something ends with one line naming the file
or the resource, the limit where there is one, and what to do (:func:`exhausted`).

Some of it can only be checked before: under an address-space limit (``ulimit -v``) too small
to load torch, torch, OpenBLAS and the C++ runtime abort the process from native code
(``std::bad_alloc``, "OpenBLAS error: Memory allocation still failed") where no Python handler
runs. :func:`check_address_space` refuses such a limit before torch is loaded.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.abc
import os
import re
import resource
import sys
from typing import Iterator, Optional

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.files import describe_os_error

MIB = 1 << 20

#: Address space (bytes) that loading torch takes before any work: about 600 MiB of mappings
#: (its libraries, OpenBLAS's buffers) on one thread, measured on Linux with torch 2.x.
TORCH_ADDRESS_SPACE = 600 * MIB
#: Address space a run needs beyond that at the least: a tiny model's training or scoring, each
#: thread's malloc arena and stack. Under a limit below TORCH_ADDRESS_SPACE + this the run is
#: refused before it starts instead of being aborted by native code part way.
RUN_ADDRESS_SPACE = 200 * MIB

# What torch and other native code say (as text in a RuntimeError) for each condition.
_MEMORY = re.compile(r"can't allocate memory|cannot allocate memory|out of memory|std::bad_alloc", re.IGNORECASE)
_OPEN_FILES = re.compile(r"too many open files", re.IGNORECASE)
_NO_SPACE = re.compile(r"no space left on device", re.IGNORECASE)
_NO_THREAD = re.compile(r"can't start new thread|resource temporarily unavailable", re.IGNORECASE)


def soft_limit(which: int) -> Optional[int]:
    """This process's soft limit ``which`` (a ``resource.RLIMIT_*``), None when unlimited."""
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _mib(size: int) -> str:
    return f"{size / MIB:,.0f} MiB"


def memory() -> PhraseScorerError:
    """The machine (or this process's limit) has no memory left for the run."""
    limit = soft_limit(resource.RLIMIT_AS)
    under = f" under the address-space limit of {_mib(limit)} (ulimit -v)" if limit is not None else ""
    return PhraseScorerError(
        f"out of memory (ENOMEM){under}",
        hint=Text("give the run more memory, or make it use less: fewer ", setting("workers"), ", a smaller ",
                  setting("batch_size"), " or ", setting("batch_tokens")))


def open_files(what: str = "too many open files (EMFILE)") -> PhraseScorerError:
    """This process (EMFILE) or the system (ENFILE) has no file descriptor left."""
    limit = soft_limit(resource.RLIMIT_NOFILE)
    under = f": the limit is {limit} (ulimit -n)" if limit is not None and "EMFILE" in what else ""
    return PhraseScorerError(
        f"{what}{under}",
        hint=Text("raise the limit (ulimit -n 4096), or run fewer ", setting("workers"), " or ", setting("processes")))


def processes() -> PhraseScorerError:
    """No process or thread can be started (EAGAIN from fork or pthread_create)."""
    limit = soft_limit(resource.RLIMIT_NPROC)
    under = f": the limit is {limit} processes and threads (ulimit -u)" if limit is not None else ""
    return PhraseScorerError(
        f"cannot start another process or thread (EAGAIN){under}",
        hint=Text("raise the limit (ulimit -u), or run fewer ", setting("workers"), ", ", setting("processes"),
                  " or ", setting("threads")))


def no_space(path: Optional[os.PathLike | str] = None, problem: str = "") -> PhraseScorerError:
    """The disk holding ``path`` is full (as :func:`~phrase_scorer.io.files.describe_os_error` says it
    of a file; of no known file, by the error's name)."""
    if path is not None and not problem:
        return describe_os_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path)
    return PhraseScorerError(problem or "no space left on the device (ENOSPC)", path=path,
                             hint="free some space or write elsewhere; the previous output, if any, is untouched")


def exhausted(exc: BaseException, path: Optional[os.PathLike | str] = None) -> Optional[PhraseScorerError]:
    """The project's error for ``exc`` when it says the machine ran out of memory, disk space,
    file descriptors, processes or threads; None for any other exception. ``path`` names the
    file being written when ``exc`` does not (a torch zip writer's error names none)."""
    if isinstance(exc, PhraseScorerError):
        return None
    if isinstance(exc, MemoryError):
        return memory()
    if isinstance(exc, OSError) and exc.errno is not None:
        named = exc.filename if exc.filename is not None else path
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            return no_space(named, "disk quota exceeded (EDQUOT)" if exc.errno != errno.ENOSPC else "")
        if exc.errno == errno.EFBIG:
            return describe_os_error(exc, named if named is not None else "output")
        if exc.errno == errno.EMFILE:
            return open_files()
        if exc.errno == errno.ENFILE:
            return open_files("the system has no file descriptor left (ENFILE)")
        if exc.errno == errno.ENOMEM:
            return memory()
        if exc.errno == errno.EAGAIN and exc.filename is None:  # fork or a thread's start, not a file's read
            return processes()
        return None
    if isinstance(exc, RuntimeError):  # torch's and threading's wording of the same conditions
        text = str(exc)
        if _NO_SPACE.search(text):
            return no_space(path)
        if _OPEN_FILES.search(text):
            return open_files()
        if _MEMORY.search(text):
            return memory()
        if _NO_THREAD.search(text):
            return processes()
    return None


def check_address_space() -> None:
    """Refuse an address-space limit (``ulimit -v``) under which torch cannot load and run: native
    code would abort the process part way, with no message of this tool. Called before torch is
    imported."""
    limit = soft_limit(resource.RLIMIT_AS)
    need = TORCH_ADDRESS_SPACE + RUN_ADDRESS_SPACE
    if limit is not None and limit < need:
        raise PhraseScorerError(
            f"the address-space limit (ulimit -v) is {_mib(limit)}: loading torch and running a model needs at "
            f"least {_mib(need)} of address space",
            hint="raise it (ulimit -v unlimited), and bound memory with a cgroup instead (systemd-run -p "
                 "MemoryMax=..., docker --memory): it counts memory used, not address space reserved")


class _BeforeTorch(importlib.abc.MetaPathFinder):
    """Runs :func:`check_address_space` when torch is first imported, before any of it loads."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            check_address_space()
        return None  # the import goes on as always


@contextlib.contextmanager
def checked_before_torch() -> Iterator[None]:
    """While a command runs, the first import of torch checks the address-space limit first
    (:func:`check_address_space`); a command that never loads torch is never refused. Nothing is
    checked where torch is loaded already."""
    finder = None
    if "torch" not in sys.modules:
        finder = _BeforeTorch()
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)
