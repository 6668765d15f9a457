"""Gzip as every reader and writer uses it: the library (ISA-L where installed), whole gzip members
written one per chunk (:func:`gzip_member`: zcat, Python and Moses' own reader all read a series of
them as one stream, and an interrupted write resumes at a chunk boundary), and what a damaged gzip
file's reading failure means (:func:`read_gzip_error`, :func:`gzip_damage`).

Gzip goes through ISA-L (``isal``) where it is installed: on a phrase table it decompresses about
1.5 times as fast as the standard library's zlib, and compresses at its level 3 about six times as
fast as zlib's level 6 (figures in docs/benchmarks.md), and writes plain gzip. Without it the standard library is used.
"""

from __future__ import annotations

import gzip
import os
import zlib
from types import ModuleType
from typing import Optional

from phrase_scorer.io.paths import PathLike


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


GZIP_MAGIC = b"\x1f\x8b"


def gzip_member(data: bytes, level: int = MAX_COMPRESS_LEVEL) -> bytes:
    """One complete gzip member holding ``data``, with a zero timestamp (reproducible bytes).

    ``level`` is the library's: ISA-L has levels 0-3, zlib 1-9; a higher one is clipped."""
    return fast_gzip.compress(data, min(level, MAX_COMPRESS_LEVEL), mtime=0)


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
