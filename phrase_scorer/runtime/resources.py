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

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.os_errors import out_of_resources, soft_limit

MIB = 1 << 20

#: Address space (bytes) that loading torch takes before any work: about 600 MiB of mappings
#: (its libraries, OpenBLAS's buffers) on one thread, measured on Linux with torch 2.x.
TORCH_ADDRESS_SPACE = 600 * MIB
#: Address space a run needs beyond that at the least: a tiny model's training or scoring, each
#: thread's malloc arena and stack. Under a limit below TORCH_ADDRESS_SPACE + this the run is
#: refused before it starts instead of being aborted by native code part way.
RUN_ADDRESS_SPACE = 200 * MIB

#: Each limit on a process's memory, what it is called, how the shell sets it, and the least under
#: which torch loads and a tiny model trains (torch alone takes about 230 MiB of its data segment).
MEMORY_FLOORS = (
    (resource.RLIMIT_AS, "address-space", "ulimit -v", TORCH_ADDRESS_SPACE + RUN_ADDRESS_SPACE),
    (resource.RLIMIT_DATA, "data-segment", "ulimit -d", 320 * MIB),
)

#: File descriptors a training job of N processes on this machine needs at the least: Python's and
#: torch's own, the pair cache's, and gloo's sockets and pipes between the ranks (two ranks of a tiny
#: training failed at 32 and ran at 64). Under fewer a rank fails part way, or waits forever on a
#: peer whose connection it could not accept.
JOB_OPEN_FILES = 48
RANK_OPEN_FILES = 8

# What torch says when a GPU's memory is full (torch.cuda.OutOfMemoryError, the MPS backend's).
_GPU_MEMORY = re.compile(r"(CUDA|HIP|MPS backend) out of memory|CUDA error: out of memory", re.IGNORECASE)
# What torch and other native code say (as text in a RuntimeError) for each condition, in this order.
_SAID = (
    (re.compile(r"no space left on device", re.IGNORECASE), errno.ENOSPC),
    (re.compile(r"too many open files", re.IGNORECASE), errno.EMFILE),
    (re.compile(r"can't allocate memory|cannot allocate memory|out of memory|std::bad_alloc", re.IGNORECASE),
     errno.ENOMEM),
    (re.compile(r"can't start new thread|resource temporarily unavailable", re.IGNORECASE), errno.EAGAIN),
)


def _mib(size: int) -> str:
    return f"{size / MIB:,.0f} MiB"


def exhausted(exc: BaseException, path: Optional[os.PathLike | str] = None) -> Optional[PhraseScorerError]:
    """The project's error for ``exc`` when it says the machine ran out of memory, disk space,
    file descriptors, processes or threads (worded by :func:`~phrase_scorer.io.os_errors.out_of_resources`);
    None for any other exception. ``path`` names the file being written when ``exc`` does not (a
    torch zip writer's error names none)."""
    if isinstance(exc, PhraseScorerError):
        return None
    if isinstance(exc, OSError):  # ``path`` is the file only of a write that ran out of room
        by_file = exc.errno in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC))
        return out_of_resources(exc, exc.filename if exc.filename is not None else path if by_file else None)
    if isinstance(exc, RuntimeError) and _GPU_MEMORY.search(str(exc)):  # torch.cuda.OutOfMemoryError among them
        return PhraseScorerError("out of GPU memory",
                                 hint="make the run use less: smaller batches, fewer runs on the GPU at once; or "
                                      "run where the GPU is free (nvidia-smi shows what holds its memory)")
    code = None
    if isinstance(exc, MemoryError):
        code = errno.ENOMEM
    elif isinstance(exc, SystemError) and "without exception set" in str(exc) and \
            any(soft_limit(which) is not None for which, *_ in MEMORY_FLOORS):
        code = errno.ENOMEM  # native code whose allocation failed under the limit, and said nothing
    elif isinstance(exc, RuntimeError):  # torch's and threading's wording of the same conditions
        text = str(exc)
        code = next((number for pattern, number in _SAID if pattern.search(text)), None)
    if code is None:
        return None
    return out_of_resources(OSError(code, os.strerror(code)), path if code == errno.ENOSPC else None)


def check_address_space() -> None:
    """Refuse an address-space limit (``ulimit -v``) or a data-segment limit (``ulimit -d``) under
    which torch cannot load and run (:data:`MEMORY_FLOORS`): native code would abort the process
    part way, with no message of this tool. Called before torch is imported."""
    for which, what, shell, need in MEMORY_FLOORS:
        limit = soft_limit(which)
        if limit is not None and limit < need:
            raise PhraseScorerError(
                f"the {what} limit ({shell}) is {_mib(limit)}: loading torch and running a model needs at least "
                f"{_mib(need)} of it",
                hint=f"raise it ({shell} unlimited), and bound memory with a cgroup instead (systemd-run -p "
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


def check_open_files(processes: int) -> None:
    """Refuse a limit on open files (``ulimit -n``) too small for a job of ``processes`` ranks on this
    machine (:data:`JOB_OPEN_FILES`), before any rank starts."""
    limit = soft_limit(resource.RLIMIT_NOFILE)
    need = JOB_OPEN_FILES + RANK_OPEN_FILES * processes
    if limit is not None and limit < need:
        raise PhraseScorerError(
            f"too many open files for {processes} training processes (EMFILE): the limit is {limit} (ulimit -n), "
            f"and {processes} processes need at least {need}",
            hint=f"raise the limit (ulimit -n {max(4096, need)}), or start fewer processes")
