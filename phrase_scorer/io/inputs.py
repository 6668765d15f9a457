"""Reading inputs: a plain or gzip file (detected by its magic bytes, not its name) or standard
input (``-``) as binary lines that report how many raw bytes they have consumed, so that progress
bars can show an ETA (:func:`open_input`); the one reader of text lines (:class:`TextLines`); the
error of a read that failed (:func:`read_failure`); and the refusal of an input that can be read
only once where a command reads it twice (:func:`refuse_single_pass`)."""

from __future__ import annotations

import io
import os
import stat
import sys
from stat import S_ISREG
from typing import Any, Generator, Optional, Tuple, Union

from phrase_scorer.errors import PhraseScorerError, Text
from phrase_scorer.io.compression import GZIP_MAGIC, fast_gzip, gzip_damage, read_gzip_error
from phrase_scorer.io.paths import STDIO, PathLike, is_gzip_name


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

    def __iter__(self) -> Generator[Tuple[int, str], None, None]:
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


def text_lines(path: PathLike, hint: Optional[str] = None) -> Generator[Tuple[int, str], None, None]:
    """(line number, text without its line end) for each line of a text input: see :class:`TextLines`."""
    return iter(TextLines(path, hint))


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
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
    raise PhraseScorerError(Text(what, f" is {kind}, not a regular file, whose bytes can be read once: {reads}"),
                            path=path,
                            hint="save the stream to a regular file first; a .gz file is read as it is")
