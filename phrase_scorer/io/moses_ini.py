"""Read moses.ini files and edit their lines, keeping every other byte as it was.

A moses.ini is a list of ``[section]`` headers, each followed by value lines. Moses cuts every
line at its first ``#``, trims spaces, tabs and line ends, and ignores what is left empty. Two
sections matter here::

    [feature]
    PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz ...
    [weight]
    TranslationModel0= 0.2 0.2 0.2 0.2

:class:`MosesIni` keeps all lines (comments, blank lines, line ends) so that writing it back
unchanged gives the same bytes, and edits single lines. Patching a moses.ini for a table with
new columns is :mod:`phrase_scorer.moses.ini_patch`; building binary tables is
:mod:`phrase_scorer.moses.binarise`.

Moses 1 and Moses2 read the same syntax. Moses2 knows only the ``PhraseDictionaryMemory`` and
``ProbingPT`` phrase tables and refuses unknown feature keys such as ``tuneable-components``.

No torch or numpy here: the Moses-config verbs start at once.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.inputs import line_text
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.phrase_table import PhraseTableReader

log = logging.getLogger(__name__)

#: The phrase-table feature types this module can patch.
PHRASE_TABLE_TYPES = ("PhraseDictionaryMemory", "PhraseDictionaryCompact", "ProbingPT", "PhraseDictionaryOnDisk")
#: Types whose ``path=`` names a text table (plain or gzip) rather than a binarised one.
TEXT_TABLE_TYPES = ("PhraseDictionaryMemory",)


#: How many lines of a text table are read to count its scores.
CHECK_LINES = 100

_TRIM = " \t\r\n"
_TOKEN = re.compile(r"[^ \t\r\n]+")


# --- the line-preserving model -------------------------------------------------------------------


@dataclass
class IniLine:
    """One line of a moses.ini: ``text + eol`` is exactly what was read."""

    number: int  # 1-based
    text: str  # without the line end
    eol: str  # "\n", or "" on a last line without one
    section: Optional[str]  # the section the line belongs to; None before the first header

    @property
    def content_end(self) -> int:
        """Where the part Moses reads ends: at the first ``#``, without trailing blanks."""
        cut = self.text.find("#")
        body = self.text if cut < 0 else self.text[:cut]
        return len(body.rstrip(_TRIM))

    @property
    def content(self) -> str:
        """What Moses reads of the line: before any ``#``, trimmed."""
        return self.text[: self.content_end].lstrip(_TRIM)

    def tokens(self) -> List[Tuple[int, int, str]]:
        """The space- or tab-separated tokens of :attr:`content` with their positions in :attr:`text`."""
        return [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(self.text, 0, self.content_end)]


@dataclass
class FeatureLine:
    """A line of the ``[feature]`` section: ``Type key=value ...``."""

    line: IniLine
    type: str
    name: str  # name= or Moses' default, the type followed by its count so far (Distortion0)
    args: List[Tuple[str, str]]

    def get(self, key: str) -> Optional[str]:
        for k, v in self.args:
            if k == key:
                return v
        return None

    @property
    def is_phrase_table(self) -> bool:
        return self.type in PHRASE_TABLE_TYPES


@dataclass
class WeightLine:
    """A line of the ``[weight]`` section: ``Name= w1 w2 ...``."""

    line: IniLine
    name: str
    weights: List[float]


class MosesIni:
    """All lines of a moses.ini, in order, with the sections they belong to."""

    def __init__(self, lines: List[IniLine], path: PathLike = "moses.ini") -> None:
        self.lines = lines
        self.path = os.fspath(path)

    def resolve(self, path: str) -> str:
        """A ``path=`` value as Moses opens it when it runs in the ini's folder (as every verb runs
        it): against that folder, unless absolute."""
        return os.path.join(os.path.dirname(os.path.abspath(self.path)), path)

    @classmethod
    def read(cls, path: PathLike) -> "MosesIni":
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise PhraseScorerError("no such file", path=path) from None
        except IsADirectoryError:
            raise PhraseScorerError("is a directory, expected a moses.ini file", path=path) from None
        except OSError as exc:
            raise PhraseScorerError(f"cannot read: {exc.strerror or exc}", path=path) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise PhraseScorerError("invalid UTF-8", path=path, line=line,
                                    hint="save the file as UTF-8 text") from None
        line_text(data[:3], path, 1)  # refuses a byte-order mark
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str, path: PathLike = "moses.ini") -> "MosesIni":
        pieces = text.split("\n")
        lines: List[IniLine] = []
        section: Optional[str] = None
        for number, piece in enumerate(pieces, 1):
            eol = "\n" if number < len(pieces) else ""
            if not eol and not piece:
                break  # the text ended with a newline
            line = IniLine(number, piece, eol, section)
            content = line.content
            if content.startswith("["):
                close = content.find("]")
                # Moses keeps the previous section when the header has no closing bracket
                if close >= 0:
                    section = content[1:close]
                line.section = None  # a header belongs to no section
            lines.append(line)
        return cls(lines, path)

    def text(self) -> str:
        return "".join(line.text + line.eol for line in self.lines)

    def write(self, path: PathLike) -> None:
        """Write atomically (``-`` for stdout)."""
        write_text_atomically(path, self.text())

    def section_lines(self, section: str) -> Iterator[IniLine]:
        """The value lines of ``section`` (all its occurrences), skipping blanks and comments."""
        for line in self.lines:
            if line.section == section and line.content:
                yield line

    def header_line(self, section: str) -> Optional[int]:
        for line in self.lines:
            if line.section is None and line.content.startswith(f"[{section}]"):
                return line.number
        return None

    def error(self, message: str, line: Optional[int] = None, hint: Optional[str] = None) -> PhraseScorerError:
        return PhraseScorerError(message, path=self.path, line=line, hint=hint)

    def check_files(self) -> None:
        """Refuse an ini a feature of which names a file (``path=``, against the ini's folder) that
        is not there, nor a binary table's file beside that name (``NAME.minphr``, ...): Moses
        would fail on it only when it starts decoding, after the steps before it."""
        import glob

        for feature in self.features():
            named = feature.get("path")
            if named is None:
                continue
            where = self.resolve(named)
            if not (os.path.exists(where) or glob.glob(glob.escape(where) + ".*")):
                raise self.error(f"{feature.name}'s file {named} is missing", line=feature.line.number,
                                 hint="correct its path=, or give the moses.ini of a whole system")

    # --- features and weights ---

    def features(self) -> List[FeatureLine]:
        counts: Dict[str, int] = {}
        result = []
        for line in self.section_lines("feature"):
            tokens = [t for _, _, t in line.tokens()]
            kind, args, seen = tokens[0], [], set()
            for token in tokens[1:]:
                key, eq, value = token.partition("=")
                if not eq or not key:
                    raise self.error(f"feature argument {token!r} is not key=value", line.number,
                                     "Moses needs every argument after the feature type as key=value")
                if key in seen:
                    raise self.error(f"{key}= appears twice", line.number, "Moses refuses duplicate keys")
                seen.add(key)
                args.append((key, value))
            name = dict(args).get("name")
            if name is None:
                name = f"{kind}{counts.get(kind, 0)}"
                counts[kind] = counts.get(kind, 0) + 1
            result.append(FeatureLine(line, kind, name, args))
        return result

    def table_path(self, feature: FeatureLine) -> str:
        """The file a phrase-table feature's ``path=`` names, as Moses opens it (:meth:`resolve`);
        a feature without ``path=`` is refused naming its line."""
        path = feature.get("path")
        if path is None:
            raise self.error(f"feature {feature.name} has no path=", feature.line.number,
                             "give its phrase table's path=")
        return os.path.normpath(self.resolve(path))

    def find_phrase_table(self, name: Optional[str] = None) -> FeatureLine:
        """The phrase-table feature called ``name``, or the first phrase table when ``name`` is None."""
        features = self.features()
        tables = [f for f in features if f.is_phrase_table]
        for feature in features:
            if (not feature.is_phrase_table and feature.type.startswith("PhraseDictionary")
                    and (feature.name == name or (name is None and not tables))):
                raise self.error(f"feature {feature.name} is a {feature.type}, a phrase-table type this command does "
                                 "not patch", feature.line.number,
                                 f"supported: {', '.join(PHRASE_TABLE_TYPES)} (Moses2: PhraseDictionaryMemory, "
                                 "ProbingPT); convert the table to one of them")
        if name is None:
            if tables:
                return tables[0]
            hint = f"expected a {', '.join(PHRASE_TABLE_TYPES)} line in [feature]"
            if any(line.section == "ttable-file" for line in self.lines):
                hint = "this is an old-style moses.ini ([ttable-file]); convert it to the [feature] syntax first"
            raise self.error("no phrase-table feature", self.header_line("feature"), hint)
        for feature in features:
            if feature.name == name:
                if not feature.is_phrase_table:
                    raise self.error(f"feature {name} is a {feature.type}, not a phrase table",
                                     feature.line.number, f"phrase tables here: {_describe(tables)}")
                return feature
        raise self.error(f"no feature named {name}", self.header_line("feature"),
                         f"phrase tables here: {_describe(tables)}")

    def weight_names(self) -> List[str]:
        """The features the ``[weight]`` section gives weights to (``Name= w1 w2 ...`` lines), in order."""
        names = []
        for line in self.section_lines("weight"):
            label = line.tokens()[0][2]
            if label.endswith("=") and label[:-1] not in names:
                names.append(label[:-1])
        return names

    def weight_line(self, name: str) -> WeightLine:
        """The ``[weight]`` line of feature ``name``."""
        found: List[WeightLine] = []
        for line in self.section_lines("weight"):
            tokens = line.tokens()
            label = tokens[0][2]
            if label == f"{name}=":
                values = []
                for _, _, token in tokens[1:]:
                    try:
                        if not token.isascii() or "_" in token:  # float() reads '١' and '1_0'; Moses does not
                            raise ValueError(token)
                        value = float(token)
                    except ValueError:
                        raise self.error(f"weight {token!r} of {name} is not a number", line.number,
                                         "weights are numbers such as 0.2 or -1") from None
                    values.append(value)
                found.append(WeightLine(line, name, values))
            elif label.startswith(f"{name}="):
                raise self.error(f"'{label}' is not read as weights of {name}", line.number,
                                 f"Moses needs a space after '=': '{name}= {label[len(name) + 1:]}'")
        if not found:
            raise self.error(f"no weight line for {name}", self.header_line("weight"),
                             f"add '{name}= w1 ... wn' to [weight], one weight per score")
        if len(found) > 1:
            numbers = ", ".join(str(w.line.number) for w in found)
            raise self.error(f"{name} has weight lines on lines {numbers}", found[-1].line.number,
                             "Moses uses the last one only; delete the others")
        return found[0]


def _describe(tables: List[FeatureLine]) -> str:
    if not tables:
        return "none"
    return ", ".join(f"{t.name} ({t.type}, line {t.line.number})" for t in tables)


# --- editing single lines ------------------------------------------------------------------------


def set_arguments(line: IniLine, values: Dict[str, str]) -> str:
    """``line``'s text with the values of some ``key=value`` arguments replaced, spacing kept."""
    text = line.text
    for start, end, token in reversed(line.tokens()):
        key, eq, _ = token.partition("=")
        if eq and key in values:
            text = text[:start] + f"{key}={values[key]}" + text[end:]
    return text


def insert_argument(line: IniLine, text: str, argument: str) -> str:
    """``text`` (the line's text) with `` argument`` inserted after the type and any name= token."""
    tokens = line.tokens()
    after = tokens[0][1]
    for start, end, token in tokens[1:]:
        if token.startswith("name="):
            after = end
    return text[:after] + " " + argument + text[after:]


def append_values(line: IniLine, values: List[str]) -> str:
    """``line``'s text with ``values`` added after its last value, before any comment or line end."""
    end = line.content_end
    return line.text[:end] + "".join(" " + v for v in values) + line.text[end:]


def format_weight(weight: float) -> str:
    """A weight as Moses prints it: ``0.2``, ``1``, ``-0.05``."""
    text = f"{weight:g}"
    return text if float(text) == weight else repr(float(weight))


# --- binarised tables ----------------------------------------------------------------------------


#: How KenLM's binary files begin; an ARPA file (plain or gzip) does not.
KENLM_BINARY_MAGIC = b"mmap lm "


def text_loaded_features(ini: "MosesIni") -> List[str]:
    """The features of ``ini`` whose files Moses parses from text each time it starts, on one
    thread, before it decodes anything: a ``PhraseDictionaryMemory`` table, a ``LexicalReordering``
    table with neither its compact (``P.minlexr``) nor its binary (``P.binlexr.idx``) form beside
    ``path=P`` (Moses looks for those first), and a ``KENLM`` model in ARPA format. Relative paths
    are read against the ini's folder, where Moses runs; a file that cannot be read is left to
    Moses to report."""
    found = []
    for feature in ini.features():
        path = feature.get("path")
        if path is None:
            continue
        path = ini.resolve(path)
        if feature.type in TEXT_TABLE_TYPES:
            found.append(feature.name)
        elif feature.type == "LexicalReordering":
            if not (os.path.exists(path + ".minlexr") or os.path.exists(path + ".binlexr.idx")):
                found.append(feature.name)
        elif feature.type == "KENLM":
            try:
                with open(path, "rb") as lm:
                    head = lm.read(len(KENLM_BINARY_MAGIC))
            except OSError:
                continue
            if head != KENLM_BINARY_MAGIC:
                found.append(feature.name)
    return found


def binary_table_file(feature_type: str, path: PathLike) -> str:
    """The file or folder Moses opens for a binary table whose ``path=`` is ``path``."""
    path = os.fspath(path)
    if feature_type == "PhraseDictionaryCompact" and not path.endswith(".minphr"):
        return path + ".minphr"
    return path


def binary_table_num_scores(feature_type: str, path: PathLike) -> Optional[int]:
    """The score count a ProbingPT or OnDisk table records about itself, or None if unknown.

    ProbingPT writes ``num_scores<TAB>N`` to ``O/config``, CreateOnDiskPt writes ``NumScores N``
    to ``O/Misc.dat``. Compact tables keep theirs in binary form and give None.
    """
    if feature_type == "ProbingPT":
        name, key = "config", "num_scores"
    elif feature_type == "PhraseDictionaryOnDisk":
        name, key = "Misc.dat", "NumScores"
    else:
        return None
    try:
        with open(os.path.join(os.fspath(path), name), encoding="utf-8", errors="replace") as f:
            for text in f:
                parts = text.split()
                if len(parts) == 2 and parts[0] == key and parts[1].isascii() and parts[1].isdigit():
                    return int(parts[1])
    except OSError:
        return None
    return None





def count_table_scores(path: PathLike, lines: int = CHECK_LINES) -> int:
    """The number of scores on the first ``lines`` lines of a text phrase table (plain or gzip).

    Raises :class:`PhraseScorerError` if the lines are not a valid phrase table or their score
    counts differ.
    """
    reader = PhraseTableReader(path)
    rows = iter(reader)
    try:
        for _ in itertools.islice(rows, lines):
            pass
    finally:
        rows.close()
    return reader.num_scores or 0


def ini_inputs(ini: "MosesIni") -> List[Tuple[str, str]]:
    """The files a moses.ini reads (every feature's path=, as given and against the ini's folder),
    as inputs for :func:`~phrase_scorer.io.outputs.check_output`."""
    found = [("the moses.ini", os.fspath(ini.path))]
    for feature in ini.features():
        path = feature.get("path")
        if path:
            found += [(f"the file of {feature.name}", path),
                      (f"the file of {feature.name}", ini.resolve(path))]
    return found


