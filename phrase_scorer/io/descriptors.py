"""Outputs written in place rather than replaced: ``-``, an open descriptor named through links
(``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N`` or a link to one), a character device or a
FIFO (:func:`writes_directly`), and how such an output is opened (:func:`open_direct`)."""

from __future__ import annotations

import fcntl
import os
import re
import stat
from typing import BinaryIO, Optional

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.os_errors import describe_os_error
from phrase_scorer.io.paths import STDIO, PathLike


def stat_or_none(path: PathLike) -> Optional[os.stat_result]:
    """The status of ``path`` after following links; None when there is none to read."""
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
    info = stat_or_none(path)
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
