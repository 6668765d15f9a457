"""Streaming reader for Moses phrase tables.

A line of a Moses phrase table is::

    src ||| tgt ||| scores [||| alignment [||| counts [||| sparse [||| properties]]]]

Fields are separated by ``|||``; Moses trims the spaces around them. The reader keeps each line's
raw bytes so that a rewrite (:meth:`TableLine.with_scores_appended`) changes nothing but the
score field, and checks what Moses would choke on or silently misread: fewer than three fields,
empty phrases, scores that are not finite non-negative numbers (Moses takes their log), a score
count that changes between lines, invalid UTF-8, a byte-order mark, a truncated gzip file.
Every problem is raised as a :class:`~phrase_scorer.errors.PhraseScorerError` naming the file and
the line.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Generator, List, Optional

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.inputs import ReadProgress, line_text, open_input, read_failure
from phrase_scorer.io.paths import PathLike

FIELD_SEPARATOR = "|||"
BOM = "\ufeff"  # refused on line 1 of every text input (:func:`~phrase_scorer.io.inputs.line_text`)

# What Moses' double-conversion parser and we agree is a number (no '_', no hex, no 'nan').
# ASCII digits only: Python's float() also reads other scripts' digits ('١'), Moses does not.
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+]?inf(?:inity)?", re.IGNORECASE | re.ASCII)


def split_words(phrase: str) -> List[str]:
    """The words of a phrase as Moses splits them: on spaces and tabs only."""
    if "\t" in phrase:
        phrase = phrase.replace("\t", " ")
    return [word for word in phrase.split(" ") if word]


@dataclass(slots=True)
class TableLine:
    """One line of a phrase table.

    ``raw`` is the line's bytes without its line end and ``eol`` that line end (``b"\\n"``,
    ``b"\\r\\n"``, or ``b""`` on a last line without one), so ``raw + eol`` is exactly what was read.
    """

    line_number: int
    raw: bytes
    eol: bytes
    fields: List[str]
    source_words: List[str]
    target_words: List[str]

    @property
    def source(self) -> str:
        return " ".join(self.source_words)

    @property
    def target(self) -> str:
        return " ".join(self.target_words)

    @property
    def scores(self) -> List[float]:
        return [float(s) for s in self.fields[2].split()] if len(self.fields) > 2 else []

    def with_scores_appended(self, values: bytes) -> bytes:
        """The line with ``values`` (e.g. ``b"0.25 1"``) added at the end of its score field.

        Everything else, including the spacing around the fields and the newline, is kept byte
        for byte.
        """
        end = scores_end(self.raw.split(b"|||", 3))
        return self.raw[:end] + b" " + values + self.raw[end:] + self.eol


    def without_last_scores(self, count: int) -> bytes:
        """The line with its last ``count`` scores removed (the inverse of appending them)."""
        parts = self.raw.split(b"|||", 3)
        kept = parts[2].rstrip()
        trailing = parts[2][len(kept):]
        pieces = kept.rsplit(None, count)
        if len(pieces) <= count:
            raise ValueError(f"line {self.line_number} has fewer than {count + 1} scores")
        parts[2] = pieces[0] + trailing
        return b"|||".join(parts) + self.eol


def scores_end(parts: List[bytes]) -> int:
    """Where new scores go in a line split on ``|||``: the end of its last score, before the
    spaces that lead to the next field."""
    if len(parts) < 3:
        raise ValueError("line has no score field")
    return len(parts[0]) + len(parts[1]) + 2 * len(b"|||") + len(parts[2].rstrip())


class PhraseTableReader(ReadProgress):
    """Iterate over the lines of a plain or gzipped phrase table, validating each one.

    ``min_fields`` is 3 for a phrase table, 2 for ``src ||| tgt`` input. With ``check_scores``
    the score field must hold the same number of finite, non-negative numbers on every line.
    ``skip`` lines are read and passed over without being parsed (used to resume a run).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        min_fields: int = 3,
        check_scores: bool = True,
        allow_empty: bool = False,
        skip: int = 0,
    ) -> None:
        self.path = path
        self.min_fields = min_fields
        self.check_scores = check_scores
        self.allow_empty = allow_empty
        self.skip = skip
        self.num_scores: Optional[int] = None
        self.lines_read = 0
        self._input = None

    def error(self, message: str, line: Optional[int] = None, hint: Optional[str] = None) -> PhraseScorerError:
        return PhraseScorerError(message, path=self.path, line=line, hint=hint)

    def __iter__(self) -> Generator[TableLine, None, None]:
        self._input = open_input(self.path)
        number = 0
        try:
            with self._input as source:
                lines = iter(source)
                try:
                    for _ in range(self.skip):
                        next(lines)
                        number += 1
                except StopIteration:
                    raise self.error(
                        f"has only {number} lines, fewer than the {self.skip} already done",
                        hint=Text("the input changed since the interrupted run; start again without ",
                                  setting("resume")),
                    ) from None
                for number, data in enumerate(lines, number + 1):
                    self.lines_read = number
                    yield self.parse(data, number)
        except PhraseScorerError:
            raise
        except (EOFError, OSError, ValueError) as exc:  # zlib.error and BadGzipFile are among these
            raise read_failure(exc, self.path, number) from None
        if number == 0 and not self.allow_empty:
            raise self.error("the file is empty", hint="expected a Moses phrase table")

    def parse(self, data: bytes, number: int) -> TableLine:
        # a CRLF line's CR is part of its line end, not of its last field's word; a byte-order mark is refused
        raw = line_text(data, self.path, number)
        eol = data[len(raw):]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.error(
                f"invalid UTF-8 at byte {exc.start + 1}", number, "phrase tables must be UTF-8 text"
            ) from None
        fields = text.split(FIELD_SEPARATOR)
        if len(fields) < self.min_fields:
            raise self.error(
                f"expected at least {self.min_fields} fields separated by '|||', found {len(fields)}",
                number,
            )
        source_words = split_words(fields[0])
        if not source_words:
            raise self.error("empty source phrase", number)
        target_words = split_words(fields[1])
        if not target_words:
            raise self.error("empty target phrase", number)
        if self.check_scores and len(fields) > 2:
            try:
                self._check_scores(fields[2], number)
            except PhraseScorerError:
                # here, not at the top: io/nbest.py loads numpy, which moses-ini never needs
                from phrase_scorer.io.nbest import is_nbest_line, nbest_given_for_pairs
                if is_nbest_line([field.encode("utf-8") for field in fields]):
                    raise nbest_given_for_pairs(self.path, number) from None
                raise
        return TableLine(number, raw, eol, fields, source_words, target_words)

    def _check_scores(self, field: str, number: int) -> None:
        scores = field.split()
        for token in scores:
            if not _NUMBER.fullmatch(token):
                raise self.error(f"score {token!r} is not a number", number)
            value = float(token)
            if not (0.0 <= value < math.inf):
                raise self.error(
                    f"score {token!r} is not a finite non-negative number",
                    number,
                    "Moses takes the log of every score: a negative value silently disables the table",
                )
        if self.num_scores is None:
            self.num_scores = len(scores)
        elif len(scores) != self.num_scores:
            raise self.error(
                f"found {len(scores)} scores where the first line has {self.num_scores}",
                number,
                "every line of a phrase table needs the same number of scores",
            )


def read_phrase_table(path: PathLike, **options) -> PhraseTableReader:
    """A validating iterator over ``path``'s lines; see :class:`PhraseTableReader`."""
    return PhraseTableReader(path, **options)
