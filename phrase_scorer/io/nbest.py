"""Read and write Moses n-best lists.

A line of an n-best list is::

    id ||| hypothesis ||| Name= v ... Name2= v v ||| total [||| segmentation] [||| alignment]

The fields are separated by `` ||| ``, words and values by spaces; a line with a tab is refused.
Moses 1 may add the segmentation (``-include-segmentation-in-n-best``) and word-alignment
(``-print-alignment-info-in-n-best``) fields; Moses2 writes only the first four. Feature labels end
in ``=``; a label with ``_`` in its name is a sparse feature (``TranslationModel0_x= 1``).

Every field is kept as read, so an entry written back unchanged gives the same bytes (Moses
puts two spaces before the ``|||`` after the hypothesis). Fields whose parsed values were changed
are written the way Moses writes them.
"""

from __future__ import annotations

import io
import itertools
import os
import re
from dataclasses import dataclass, field, replace
from typing import IO, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import AtomicOutput
from phrase_scorer.io.compression import gzip_member
from phrase_scorer.io.inputs import ReadProgress, line_text, open_input, read_failure
from phrase_scorer.io.paths import PathLike, is_gzip_name

SEPARATOR = "|||"

# What Moses prints for a float: digits (ASCII ones: Python's float() also reads '١'), exponents, inf and nan.
_NUMBER = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE | re.ASCII)
_WHOLE_NUMBER = re.compile(r"-?[0-9]+")

Features = List[Tuple[str, List[float]]]


@dataclass
class _Origin:
    """The fields of an entry as read, to write back the unchanged ones byte for byte."""

    fields: Tuple[str, str, str, str]  # id, hypothesis, features, total
    sentence_id: int
    features: Tuple[Tuple[str, Tuple[float, ...]], ...]
    total: float


@dataclass
class NBestEntry:
    """One hypothesis of an n-best list.

    ``hypothesis`` is the raw field, spaces included (``" le chat  "``); :attr:`text` gives the
    words. ``features`` are (label, values) pairs in the order of the line, sparse ones included.
    ``extra`` holds the raw fields after the total (segmentation, alignment), ``eol`` the newline.
    """

    sentence_id: int
    hypothesis: str
    features: Features
    total: float
    extra: List[str] = field(default_factory=list)
    eol: str = "\n"
    line_number: Optional[int] = field(default=None, compare=False)
    _origin: Optional[_Origin] = field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str:
        """The hypothesis words joined by single spaces."""
        return " ".join(self.hypothesis.split())

    def feature(self, name: str) -> List[float]:
        """The values of the feature labelled ``name`` (without ``=``)."""
        for label, values in self.features:
            if label == name:
                return values
        raise KeyError(name)

    def to_line(self) -> str:
        """The entry as an n-best line, newline included."""
        origin = self._origin
        if origin is not None and origin.sentence_id == self.sentence_id:
            id_field = origin.fields[0]
        else:
            id_field = f"{self.sentence_id} "
        frozen = _freeze(self.features)
        kept = len(origin.features) if origin is not None else 0
        if origin is not None and frozen[:kept] == origin.features:
            # the features as read, byte for byte, then any appended ones as Moses writes them
            feature_field = origin.fields[2]
            if kept < len(frozen):
                added = format_features(self.features[kept:])
                feature_field += added[1:] if feature_field.endswith(" ") else added
        else:
            feature_field = format_features(self.features)
        if origin is not None and _same(origin.total, self.total):
            total_field = origin.fields[3]
        else:
            total_field = f" {format_value(self.total)}" + (" " if self.extra else "")
        return SEPARATOR.join([id_field, self.hypothesis, feature_field, total_field, *self.extra]) + self.eol


def _freeze(features: Features) -> Tuple[Tuple[str, Tuple[float, ...]], ...]:
    return tuple((name, tuple(values)) for name, values in features)


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # nan equals nan here


def format_value(value: float) -> str:
    """A number as Moses prints it (6 significant digits), with more digits only where needed."""
    text = f"{value:g}"
    return text if _same(float(text), value) else repr(float(value))


def moses_rounded(value: float) -> float:
    """``value`` rounded to the 6 significant digits Moses prints its feature values with."""
    return float(f"{value:g}")


def format_features(features: Features) -> str:
    """The features field as Moses writes it: `` Name= v v Name2= v ``."""
    return "".join(f" {name}=" + "".join(" " + format_value(v) for v in values) for name, values in features) + " "


def dense_feature_vector(entry: NBestEntry) -> List[float]:
    """The values of the dense features (labels without ``_``), in label order, as one list."""
    return [v for name, values in entry.features if "_" not in name for v in values]


def group_by_sentence(entries: Iterable[NBestEntry]) -> Iterator[Tuple[int, List[NBestEntry]]]:
    """(sentence id, its entries) for each run of consecutive entries with the same id."""
    for sentence_id, group in itertools.groupby(entries, key=lambda e: e.sentence_id):
        yield sentence_id, list(group)


# The sentences in a row an n-best list may have no hypotheses for (Moses writes every sentence's
# id, from 0): a larger jump in ids is refused, since each such sentence is an empty output line.
MAX_SKIPPED_SENTENCES = 10_000


def check_sentence_order(entry: NBestEntry, last_id: int, path: PathLike) -> None:
    """Refuse an entry whose sentence id is below ``last_id``, the id of the entry before it
    (-1 for none): Moses writes a list grouped by sentence id in increasing order."""
    check_id_order(entry.sentence_id, last_id, path, entry.line_number)


def check_id_order(sentence_id: int, last_id: int, path: PathLike, line: Optional[int]) -> None:
    """:func:`check_sentence_order` for the sentence id of line ``line``; an id that skips more
    than :data:`MAX_SKIPPED_SENTENCES` sentences is refused too (each sentence without hypotheses
    is an empty line of a chosen translation: an id such as 99999999 in a short list would ask
    for a hundred million of them)."""
    if sentence_id < last_id:
        raise PhraseScorerError(f"sentence id {sentence_id} comes after {last_id}", path=path,
                                line=line, hint="the n-best list must be grouped by sentence id in "
                                                "increasing order, as Moses writes it")
    skipped = sentence_id - max(last_id, -1) - 1
    if skipped > MAX_SKIPPED_SENTENCES:
        after = "as the list's first sentence" if last_id < 0 else f"after sentence {last_id:,}"
        raise PhraseScorerError(
            f"sentence id {sentence_id:,} {after} skips {skipped:,} sentences without hypotheses, more than the "
            f"{MAX_SKIPPED_SENTENCES:,} a list may skip at once", path=path, line=line,
            hint="give the n-best list Moses wrote for this input: it numbers the sentences from 0, one after "
                 "the other")


_PLAIN_ID = re.compile(rb" *([0-9]+) *")


def is_nbest_line(fields: Sequence[bytes]) -> bool:
    """Whether a line, split on ``|||``, reads as a Moses n-best line rather than a phrase pair:
    a whole-number sentence id, a hypothesis, features written ``Name= values`` (a phrase table's
    third field holds bare numbers) and a total."""
    if len(fields) < 4 or _PLAIN_ID.fullmatch(fields[0]) is None:
        return False
    features = fields[2].split()
    return bool(features) and features[0].endswith(b"=")


def nbest_given_for_pairs(path: PathLike, line: int) -> PhraseScorerError:
    """The error for an n-best list (:func:`is_nbest_line`) given where phrase pairs are read."""
    return PhraseScorerError("is a Moses n-best list (sentence id ||| hypothesis ||| features ||| total), not "
                             "phrase pairs (source ||| target ...)", path=path, line=line,
                             hint="give it to rescore with the sentences it was decoded from: rescore adds a "
                                  "model's log p to each of its hypotheses")


def sentence_id_of(data: bytes, path: PathLike, number: int) -> int:
    """The sentence id of the raw line ``data`` (line ``number``, its line end included), read
    without parsing the rest of the line; a line whose id field is not a plain whole number is
    parsed whole, which raises the error :class:`NBestReader` gives for it."""
    bar = data.find(SEPARATOR.encode())
    match = _PLAIN_ID.fullmatch(data, 0, bar) if bar >= 0 else None
    if match is None:
        return entry_of(data, path, number).sentence_id
    return int(match.group(1))


def entry_of(data: bytes, path: PathLike, number: int) -> NBestEntry:
    """The entry of raw line ``data`` (line ``number`` of ``path``, its line end included)."""
    if number == 1:
        line_text(data, path, number)  # refuses a byte-order mark
    if data.endswith(b"\n"):
        raw, eol = data[:-1], "\n"
    else:
        raw, eol = data, ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PhraseScorerError(f"invalid UTF-8 at byte {exc.start + 1}", path=path, line=number,
                                hint="n-best lists must be UTF-8 text") from None
    entry = parse_nbest_line(text, path, number)
    entry.eol = eol
    return entry


def whole_number(text: str, what: str, path: PathLike, line: Optional[int], hint: Optional[str] = None) -> int:
    """``text`` (spaces around it aside) as the non-negative whole number ``what`` of an input file:
    the digits 0-9 only (Python's int() also reads '١' and '1_000', which no program writing these
    files does); a negative number is named as negative (``hint``: what the number counts)."""
    text = text.strip(" ")
    if not _WHOLE_NUMBER.fullmatch(text):
        raise PhraseScorerError(f"{what} {text!r} is not a whole number", path=path, line=line,
                                hint="write it in the digits 0-9")
    value = int(text)
    if value < 0:
        raise PhraseScorerError(f"{what} {text} is negative", path=path, line=line, hint=hint)
    return value


def parse_nbest_line(text: str, path: PathLike = "-", number: Optional[int] = None) -> NBestEntry:
    """One n-best line (without its newline); errors name ``path`` and ``number``."""

    def error(message: str, hint: Optional[str] = None) -> PhraseScorerError:
        return PhraseScorerError(message, path=path, line=number, hint=hint)

    tab = text.find("\t")
    if tab >= 0:  # Moses writes none: a tab would pass for a space in the features and stay in the words
        raise error(f"a tab at column {tab + 1}",
                    "Moses separates the fields of an n-best line with ' ||| ' and words and values with spaces")
    fields = text.split(SEPARATOR)
    if len(fields) < 4:
        raise error(f"expected at least 4 fields separated by '|||', found {len(fields)}",
                    "an n-best line is 'id ||| hypothesis ||| features ||| total'")
    id_field, hypothesis, feature_field, total_field, *extra = fields
    sentence_id = whole_number(id_field, "sentence id", path, number,
                               hint="Moses numbers the input sentences from 0")
    tokens = feature_field.split()
    try:
        frozen = _plain_features(tokens, feature_field)
    except ValueError:  # something out of place: the checks token by token name it
        frozen = _freeze(_checked_features(tokens, error))
    features: Features = [(label, list(values)) for label, values in frozen]
    total_text = total_field.strip()
    if not _NUMBER.fullmatch(total_text):
        raise error(f"total score {total_text!r} is not a number")
    total = float(total_text)
    origin = _Origin((id_field, hypothesis, feature_field, total_field), sentence_id, frozen, total)
    return NBestEntry(sentence_id, hypothesis, features, total, extra, "\n", number, origin)


def _plain_features(tokens: List[str], feature_field: str) -> Tuple[Tuple[str, Tuple[float, ...]], ...]:
    """The features of a field's ``tokens`` when each label ends in ``=`` and has values that
    Python reads as numbers; ValueError for anything else. A number Python reads that Moses does
    not write (``1_0``, ``١``) is also refused."""
    starts = [i for i, token in enumerate(tokens) if token[-1] == "="]  # the labels
    if (starts[0] if starts else len(tokens)) != 0:
        raise ValueError("a value before the first label")
    starts.append(len(tokens))
    features = []
    for a, b in zip(starts, starts[1:]):
        if b == a + 1 or len(tokens[a]) == 1:
            raise ValueError("a label without values or without a name")
        features.append((tokens[a][:-1], tuple(map(float, tokens[a + 1:b]))))
    if "_" in feature_field and any("_" in token for token in tokens if token[-1] != "="):
        raise ValueError("an underscore in a value")
    if not feature_field.isascii() and any(not token.isascii() for token in tokens if token[-1] != "="):
        raise ValueError("a value in digits other than 0-9")
    return tuple(features)


def _checked_features(tokens: List[str], error: Callable[..., PhraseScorerError]) -> Features:
    """The features of a field's ``tokens``, one by one, refusing the first that is out of place."""
    features: Features = []
    for token in tokens:
        if token.endswith("="):
            if len(token) == 1:
                raise error("a feature label '=' without a name")
            if features and not features[-1][1]:
                raise error(f"feature {features[-1][0]}= has no values")
            features.append((token[:-1], []))
        elif "=" in token:
            raise error(f"{token!r} is not 'Name= value'", "a label ends with '=' and a space follows it")
        elif not features:
            raise error(f"feature value {token!r} comes before any 'Name=' label")
        elif not _NUMBER.fullmatch(token):
            raise error(f"feature value {token!r} of {features[-1][0]} is not a number")
        else:
            features[-1][1].append(float(token))
    if features and not features[-1][1]:
        raise error(f"feature {features[-1][0]}= has no values")
    return features


class NBestReader(ReadProgress):
    """Streams the entries of a plain or gzipped n-best list (``-`` for stdin).

    The first ``skip`` lines are passed over unparsed (resuming). ``bytes_read`` and ``size``
    tell a progress bar how far the reading has got. Malformed lines raise
    :class:`PhraseScorerError` with the file and line number.
    """

    def __init__(self, path: PathLike, skip: int = 0) -> None:
        self.path = path
        self.skip = skip
        self._input = None

    def __iter__(self) -> Iterator[NBestEntry]:
        path = self.path
        number = 0
        try:
            with open_input(path) as source:
                self._input = source
                for number, data in enumerate(source, 1):
                    if number <= self.skip:
                        continue
                    yield entry_of(data, path, number)
        except PhraseScorerError:
            raise
        except (EOFError, OSError, ValueError) as exc:
            raise read_failure(exc, path, number) from None


def read_nbest(path: PathLike) -> Iterator[NBestEntry]:
    """Stream the entries of a plain or gzipped n-best list (``-`` for stdin); see :class:`NBestReader`."""
    return iter(NBestReader(path))


def write_nbest(entries: Iterable[NBestEntry], path_or_stream: Union[PathLike, IO]) -> int:
    """Write ``entries`` and return how many were written.

    A path is written atomically, gzipped when it ends in ``.gz``; ``-`` is stdout. A stream may
    be binary or text.
    """
    if not isinstance(path_or_stream, (str, bytes, os.PathLike)):
        stream = path_or_stream
        count = 0
        binary = not isinstance(stream, io.TextIOBase)
        for count, entry in enumerate(entries, 1):
            line = entry.to_line()
            stream.write(line.encode("utf-8") if binary else line)
        return count
    path = os.fspath(path_or_stream)
    packed = is_gzip_name(path)
    count = 0
    with AtomicOutput(path) as out:
        chunk: List[bytes] = []
        size = 0
        for count, entry in enumerate(entries, 1):
            data = entry.to_line().encode("utf-8")
            chunk.append(data)
            size += len(data)
            if size >= 1 << 20:
                out.write(gzip_member(b"".join(chunk)) if packed else b"".join(chunk))
                chunk, size = [], 0
        if chunk or (packed and count == 0):
            out.write(gzip_member(b"".join(chunk)) if packed else b"".join(chunk))
        out.commit()
    return count


# --- the dense features, as Moses' optimisers read them -------------------------------------------


Layout = Tuple[Tuple[str, int], ...]  # the dense features of a line: (name, number of values), in order



def without_features(entry: NBestEntry, ignore: Sequence[str]) -> NBestEntry:
    """``entry`` without the features labelled with a name in ``ignore`` (``entry`` itself when
    there are none to remove)."""
    if not ignore or not any(name in ignore for name, _ in entry.features):
        return entry
    return replace(entry, features=[(name, values) for name, values in entry.features if name not in ignore])



def dense_layout(entry: NBestEntry) -> Layout:
    """The dense features of an entry (labels without ``_``), as the extractor reads them."""
    return tuple((name, len(values)) for name, values in entry.features if "_" not in name)



def describe_layout(layout: Layout) -> str:
    return " ".join(f"{name}=x{count}" if count > 1 else f"{name}=" for name, count in layout)



def dense_features(entry: NBestEntry, ignore: Sequence[str] = ()) -> Tuple[Layout, List[float]]:
    """The dense features of ``entry`` (labels without ``_``) other than those in ``ignore``: their
    layout and their values in order (:func:`dense_layout` and :func:`dense_feature_vector` of
    :func:`without_features`, in one pass)."""
    layout: List[Tuple[str, int]] = []
    values: List[float] = []
    for name, found in entry.features:
        if "_" not in name and name not in ignore:
            layout.append((name, len(found)))
            values.extend(found)
    return tuple(layout), values


def checked_dense_rows(entries: Sequence[NBestEntry], rows: Union[Sequence[Sequence[float]], np.ndarray],
                       layout: Layout, path: PathLike) -> np.ndarray:
    """The dense values of ``entries`` (``rows``, each laid out as ``layout``) as one (H, D) array,
    refusing a NaN: no weight can rank a hypothesis by it. Infinite values are kept (Moses writes
    -inf for an impossible hypothesis); the weights' sums and their ranking handle them."""
    values = np.array(rows, np.float64).reshape(len(rows), -1)  # (H, D)
    nan = np.isnan(values)
    if nan.any():
        row, position = (int(i) for i in np.argwhere(nan)[0])
        names = [name for name, count in layout for _ in range(count)]
        raise PhraseScorerError(f"feature {names[position]} is nan", path=path, line=entries[row].line_number,
                                hint="no weight can rank a hypothesis by a value that is not a number; "
                                     "fix or drop the hypotheses that have one")
    return values

