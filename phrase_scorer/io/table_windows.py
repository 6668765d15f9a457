"""A phrase table as windows of whole lines, read as raw bytes and parsed a window at a time.

:class:`RawWindows` cuts the (decompressed) input into windows of ``window_lines`` lines without
looking inside them, so that the one process that must read the file sequentially does almost
nothing per line. Window ``k`` holds lines ``k * window_lines + 1`` to ``(k + 1) * window_lines``
of the file, whatever line a run starts at: window boundaries depend on the input alone, which is
what makes resumed and sharded runs byte-identical to one uninterrupted run.

:func:`parse_window` then checks and splits a whole window with a few bulk operations (one UTF-8
decode, byte splits, one float conversion of all the scores). Whenever the bulk checks are not
sure a window is clean, the window is parsed again line by line by
:meth:`PhraseTableReader.parse`, the one definition of what a valid line is, which raises the
exact error for the first bad line (or accepts the window: the bulk checks are stricter, never
looser, than the reader's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, List, Optional

import numpy as np

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.inputs import ReadProgress, open_input, read_failure
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.phrase_table import BOM, PhraseTableReader, scores_end

READ_BLOCK = 1 << 22
# Bytes that ``bytes.split()`` treats as white space but Moses (spaces and tabs only) does not.
_OTHER_SPACES = (b"\r", b"\x0b", b"\x0c")
# A score field that holds anything else goes to the exact reader (nan, inf, 1_0, 0x1, ...).
_NOT_PLAIN_NUMBER = re.compile(rb"[^0-9.eE+\- \t]")


@dataclass
class RawWindow:
    index: int  # window number counted from the first line of the file
    first_line: int  # 1-based number of its first line
    lines: int
    data: bytes  # the lines, newlines included (the last line of a file may have none)


def count_lines(path: PathLike) -> int:
    """Lines in a plain or gzip file (a last line without a newline counts)."""
    lines, last = 0, b"\n"
    try:
        with open_input(path) as source:
            while block := source.read(READ_BLOCK):
                lines += block.count(b"\n")
                last = block[-1:]
    except (EOFError, OSError, ValueError) as exc:
        raise read_failure(exc, path, lines) from None
    return lines + (last != b"\n")


class RawWindows(ReadProgress):
    """Iterate over the windows of lines ``start`` to ``stop`` (0-based, ``stop`` excluded;
    None: to the end). A window cut by ``start`` or ``stop`` is shorter than ``window_lines``.

    ``size``, ``bytes_read`` and ``lines_read`` feed a progress bar.
    """

    def __init__(self, path: PathLike, window_lines: int, start: int = 0, stop: Optional[int] = None) -> None:
        if window_lines < 1:
            raise ValueError("window_lines must be positive")
        self.path = path
        self.window_lines = window_lines
        self.start = start
        self.stop = stop
        self.lines_read = 0

    def __iter__(self) -> Iterator[RawWindow]:
        self._input = open_input(self.path)
        line = 0  # lines of the file before ``pending``
        pending = b""
        eof = False
        try:
            with self._input as source:
                while not eof and (self.stop is None or line < self.stop):
                    block = source.read1(READ_BLOCK)  # what there is: a pipe need not fill a block
                    eof = not block
                    pending += block
                    if eof and pending and not pending.endswith(b"\n"):
                        pending += b"\n"  # a last line without newline: cut it like the others,
                        ends = np.flatnonzero(np.frombuffer(pending, np.uint8) == 10) + 1
                        ends[-1] -= 1  # then give it back its missing newline
                        pending = pending[:-1]
                    else:
                        ends = np.flatnonzero(np.frombuffer(pending, np.uint8) == 10) + 1
                    used = 0  # bytes of ``pending`` consumed
                    k = 0  # lines of ``ends`` consumed
                    while k < len(ends):
                        if self.stop is not None and line >= self.stop:
                            break
                        if line < self.start:
                            take = min(self.start - line, len(ends) - k)
                        else:
                            boundary = (line // self.window_lines + 1) * self.window_lines
                            if self.stop is not None:
                                boundary = min(boundary, self.stop)
                            take = boundary - line
                            if take > len(ends) - k and not eof:
                                break  # the window goes on in the next block
                            take = min(take, len(ends) - k)
                        end = int(ends[k + take - 1])
                        if line >= self.start:
                            self.lines_read = line + take
                            yield RawWindow(line // self.window_lines, line + 1, take, pending[used:end])
                        used, k, line = end, k + take, line + take
                    pending = pending[used:]
        except PhraseScorerError:
            raise
        except (EOFError, OSError, ValueError) as exc:  # zlib.error and BadGzipFile are among these
            complete = line + pending.count(b"\n")  # the lines read whole, in windows or not yet
            raise read_failure(exc, self.path, complete) from None
        if line < self.start:
            raise PhraseScorerError(
                f"has only {line} lines, fewer than the {self.start} already done", path=self.path,
                hint=Text("the input changed since the interrupted run; start again without ", setting("resume")),
            )


@dataclass
class ParsedWindow:
    """A window split into lines, with each line's words (as UTF-8 bytes)."""

    first_line: int
    lines: List[bytes]  # each line without its newline
    eols: List[bytes]  # b"\n", b"\r\n" (read line by line), or b"" for a last line without one
    fields: List[List[bytes]]  # each line split on ``|||``
    source_words: List[List[bytes]]
    target_words: List[List[bytes]]
    num_scores: Optional[int]

    def appender(self) -> "ScoreAppender":
        """What it takes to append scores to these lines later (far smaller than the window)."""
        return ScoreAppender(self.lines, self.eols, [scores_end(parts) for parts in self.fields])


@dataclass
class ScoreAppender:
    lines: List[bytes]
    eols: List[bytes]
    ends: List[int]  # where each line's new scores go (:func:`scores_end`)

    def with_scores_appended(self, values: List[bytes]) -> bytes:
        """Every line with its ``values`` added at the end of its score field, joined."""
        out: List[bytes] = []
        for raw, end, value, eol in zip(self.lines, self.ends, values, self.eols):
            out += (raw[:end], b" ", value, raw[end:], eol)
        return b"".join(out)


def first_score_count(window: RawWindow) -> Optional[int]:
    """The number of scores on a window's first line (None where it has no score field)."""
    first = window.data.split(b"\n", 1)[0]
    parts = first.decode("utf-8", "replace").split("|||")
    return len(parts[2].split()) if len(parts) > 2 else None


def parse_window(window: RawWindow, path: PathLike, num_scores: Optional[int], *, min_fields: int = 3,
                 check_scores: bool = True) -> ParsedWindow:
    """Split and check a window. ``num_scores`` is the score count of the table's first line (the
    window's own first line sets it when None). Raises the reader's error for the first bad line."""
    data = window.data
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
        eols = [b"\n"] * len(lines)
    else:
        eols = [b"\n"] * (len(lines) - 1) + [b""]
    fields = [line.split(b"|||") for line in lines]
    source_words = [parts[0].split() for parts in fields] if fields and min(map(len, fields)) >= 2 else None
    target_words = [parts[1].split() for parts in fields] if source_words is not None else None
    count = num_scores
    clean = (
        source_words is not None and target_words is not None
        and len(lines) == window.lines
        and min(map(len, fields)) >= min_fields
        and not (window.first_line == 1 and data.startswith(BOM.encode()))
        and not any(space in data for space in _OTHER_SPACES)
        and all(source_words) and all(target_words)
        and _valid_utf8(data)
    )
    if clean and check_scores:
        score_fields = [parts[2] for parts in fields if len(parts) > 2]
        if score_fields:
            counts = set(map(len, map(bytes.split, score_fields)))
            count = next(iter(counts)) if count is None and len(counts) == 1 else count
            text = b" ".join(score_fields)
            clean = counts == {count} and not _NOT_PLAIN_NUMBER.search(text) and _non_negative_finite(text)
    if not clean:
        return _parse_line_by_line(window, path, num_scores, min_fields, check_scores)
    assert source_words is not None and target_words is not None  # a clean window has both sides
    return ParsedWindow(window.first_line, lines, eols, fields, source_words, target_words, count)


def _valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _non_negative_finite(text: bytes) -> bool:
    try:
        values = np.array(list(map(float, text.split())), np.float64)
    except ValueError:  # '1e', '--1', '.', ...
        return False
    return bool(len(values) == 0 or (values.min() >= 0 and np.isfinite(values.max())))


def _parse_line_by_line(window: RawWindow, path: PathLike, num_scores: Optional[int], min_fields: int,
                        check_scores: bool) -> ParsedWindow:
    reader = PhraseTableReader(path, min_fields=min_fields, check_scores=check_scores)
    reader.num_scores = num_scores
    pieces = window.data.split(b"\n")  # only \n ends a line (not the \r that splitlines() cuts at)
    last = pieces.pop()
    raw_lines = [piece + b"\n" for piece in pieces] + ([last] if last else [])
    parsed = [reader.parse(line, number) for number, line in enumerate(raw_lines, window.first_line)]
    return ParsedWindow(
        window.first_line,
        [line.raw for line in parsed],
        [line.eol for line in parsed],
        [line.raw.split(b"|||") for line in parsed],
        [[w.encode("utf-8") for w in line.source_words] for line in parsed],
        [[w.encode("utf-8") for w in line.target_words] for line in parsed],
        reader.num_scores,
    )
