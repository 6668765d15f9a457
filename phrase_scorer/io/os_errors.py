"""An ``OSError`` as the one line a user reads: what could not be written, and, where the machine
ran out of something (disk space, the file-size limit, file descriptors, memory, processes), which
limit was reached and what to do (:func:`out_of_resources`)."""

from __future__ import annotations

import errno
import os
import resource
from typing import Optional

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.paths import STDIO, PathLike


def describe_os_error(exc: OSError, path: PathLike) -> PhraseScorerError:
    """Turn an OSError met while writing into a one-line project error (``-``: standard output)."""
    if os.fspath(path) == STDIO:
        path = "<stdout>"
    return out_of_resources(exc, path) or PhraseScorerError(f"cannot write: {exc.strerror or exc}", path=path)


def soft_limit(which: int) -> Optional[int]:
    """This process's soft limit ``which`` (a ``resource.RLIMIT_*``), None when unlimited."""
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
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
        limit = soft_limit(resource.RLIMIT_FSIZE)
        shown = f": the limit is {limit:,} bytes (ulimit -f)" if limit is not None else ""
        return PhraseScorerError(f"file too large (EFBIG){shown}", path=path,
                                 hint="raise the limit (ulimit -f unlimited) or write elsewhere" + kept)
    if code in (errno.EMFILE, errno.ENFILE):
        limit = soft_limit(resource.RLIMIT_NOFILE)
        what = ("too many open files (EMFILE)" + (f": the limit is {limit} (ulimit -n)" if limit is not None else "")
                if code == errno.EMFILE else "the system has no file descriptor left (ENFILE)")
        return PhraseScorerError(what, path=path,
                                 hint="raise the limit (ulimit -n 4096), or start fewer worker processes or ranks")
    if code == errno.ENOMEM:
        limits = [f"the {what} limit of {limit / (1 << 20):,.0f} MiB ({shell})"
                  for which, what, shell in ((resource.RLIMIT_AS, "address-space", "ulimit -v"),
                                             (resource.RLIMIT_DATA, "data-segment", "ulimit -d"))
                  for limit in [soft_limit(which)] if limit is not None]
        shown = f" under {' and '.join(limits)}" if limits else ""
        return PhraseScorerError(f"out of memory (ENOMEM){shown}", path=path,
                                 hint="give the run more memory, or make it use less: fewer worker processes or "
                                      "ranks, smaller batches")
    if code == errno.EAGAIN and path is None:  # fork or a thread's start; a file's EAGAIN is no shortage
        limits = [f"{limit} processes and threads (ulimit -u)"
                  for limit in [soft_limit(resource.RLIMIT_NPROC)] if limit]
        limits += [f"{limit / (1 << 20):,.0f} MiB of address space for the stacks (ulimit -v)"
                   for limit in [soft_limit(resource.RLIMIT_AS)] if limit]  # a thread's stack must fit in it too
        shown = f": the limits are {' and '.join(limits)}" if limits else ""
        return PhraseScorerError(f"cannot start another process or thread (EAGAIN){shown}",
                                 hint="raise them, or start fewer worker processes, ranks or threads")
    return None
