"""Read and patch moses.ini files, keeping every other byte as it was.

A moses.ini is a list of ``[section]`` headers, each followed by value lines. Moses cuts every
line at its first ``#``, trims spaces, tabs and line ends, and ignores what is left empty. Two
sections matter here::

    [feature]
    PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz ...
    [weight]
    TranslationModel0= 0.2 0.2 0.2 0.2

:class:`MosesIni` keeps all lines (comments, blank lines, line ends) so that writing it back
unchanged gives the same bytes. :func:`patch_moses_ini` points a phrase-table feature at a new
table with more score columns and gives it the matching extra weights; it changes nothing else,
except relative ``path=`` values when asked to make them absolute.

Moses 1 and Moses2 read the same syntax. Moses2 knows only the ``PhraseDictionaryMemory`` and
``ProbingPT`` phrase tables and refuses unknown feature keys such as ``tuneable-components``.

No torch or numpy here: the Moses-config verbs start at once.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

from phrase_scorer.config import COLUMNS, start_weights
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import PathLike, write_text_atomically
from phrase_scorer.io.outputs import check_output, same_file
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.io.programs import run_logged

log = logging.getLogger(__name__)

#: The phrase-table feature types this module can patch.
PHRASE_TABLE_TYPES = ("PhraseDictionaryMemory", "PhraseDictionaryCompact", "ProbingPT", "PhraseDictionaryOnDisk")
#: Types whose ``path=`` names a text table (plain or gzip) rather than a binarised one.
TEXT_TABLE_TYPES = ("PhraseDictionaryMemory",)

#: The Moses program that builds each binary table type from a text table.
BINARIZERS = {
    "PhraseDictionaryCompact": "processPhraseTableMin",
    "ProbingPT": "CreateProbingPT",
    "PhraseDictionaryOnDisk": "CreateOnDiskPt",
}

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


def binarize_command(feature_type: str, text_table: PathLike, output: PathLike, num_scores: int,
                     moses_home: PathLike) -> List[str]:
    """The command that turns a text phrase table into the binary table a feature type loads.

    * ``PhraseDictionaryCompact``: ``processPhraseTableMin -in T -out O -nscores N``. Its input
      must be sorted as ``LC_ALL=C sort`` sorts it, and it writes ``O.minphr`` (``O`` itself when
      that already ends in ``.minphr``).
    * ``ProbingPT``: ``CreateProbingPT --input-pt T --output-dir O --num-scores N``; the input must
      be grouped by source phrase. Nothing in Moses checks the score count later, so N matters.
    * ``PhraseDictionaryOnDisk``: ``CreateOnDiskPt 1 1 N 100 2 T O`` (one factor on each side,
      100 translations kept per source, sorted by score 2, p(e|f)).

    The programs are looked for in ``moses_home/bin``.
    """
    table, out, n = os.fspath(text_table), os.fspath(output), str(num_scores)
    if feature_type in BINARIZERS:
        program = os.path.join(os.fspath(moses_home), "bin", BINARIZERS[feature_type])
    if feature_type == "PhraseDictionaryCompact":
        return [program, "-in", table, "-out", out, "-nscores", n]
    if feature_type == "ProbingPT":
        return [program, "--input-pt", table, "--output-dir", out, "--num-scores", n]
    if feature_type == "PhraseDictionaryOnDisk":
        return [program, "1", "1", n, "100", "2", table, out]
    raise PhraseScorerError(
        f"{feature_type} tables are not binarised",
        hint="PhraseDictionaryMemory reads the text table itself; binarising is for "
        "PhraseDictionaryCompact, ProbingPT and PhraseDictionaryOnDisk",
    )


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
                if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
                    return int(parts[1])
    except OSError:
        return None
    return None


def _looks_like(feature_type: str, path: str) -> bool:
    """Whether the existing folder ``path`` holds a binary table of ``feature_type``."""
    marker = "config" if feature_type == "ProbingPT" else "Misc.dat"
    return os.path.isfile(os.path.join(path, marker))


def run_binarizer(feature_type: str, text_table: PathLike, output: PathLike, num_scores: int,
                  moses_home: Optional[PathLike]) -> List[str]:
    """Binarise ``text_table`` into ``output`` (the feature's ``path=``) and return the command run.

    The table is built under a temporary name and moved into place only when the program
    succeeds, so a failure leaves any previous table untouched. See :func:`binarize_command` for
    the programs and what they expect of their input (sorted for Compact, grouped for ProbingPT).
    """
    if not moses_home:
        raise PhraseScorerError("binarising needs the Moses programs",
                                hint="set MOSES_HOME (or pass --moses-home) to the Moses folder holding bin/")
    final = binary_table_file(feature_type, output)
    if feature_type == "PhraseDictionaryCompact":
        build_arg = final[: -len(".minphr")] + ".part"
        built = build_arg + ".minphr"
        replaceable = not os.path.isdir(final)
    else:
        build_arg = built = final + ".part"
        replaceable = os.path.isdir(final) and _looks_like(feature_type, final)
    if os.path.lexists(final) and not replaceable:
        raise PhraseScorerError(f"exists and is not a {feature_type} table", path=final,
                                hint="remove it or choose another --phrase-table path")
    command = binarize_command(feature_type, text_table, build_arg, num_scores, moses_home)
    program = command[0]
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        raise PhraseScorerError("no such program", path=program,
                                hint=f"MOSES_HOME must be the Moses folder whose bin/ holds {os.path.basename(program)}")
    _remove(built)
    log.info("binarising: %s", " ".join(command))
    try:
        run_logged(command, final + ".log")  # appended to, each run after its command line
    except PhraseScorerError:
        _remove(built)
        raise
    if not os.path.exists(built):
        raise PhraseScorerError(f"{os.path.basename(program)} succeeded but wrote nothing", path=built)
    try:
        if os.path.isdir(built) and os.path.isdir(final):
            shutil.rmtree(final)
        os.replace(built, final)
    except OSError as exc:
        raise PhraseScorerError(f"cannot move the new table into place: {exc.strerror or exc}", path=final,
                                hint=f"the table that was built is in {built}") from None
    return command


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


# --- patching ------------------------------------------------------------------------------------


@dataclass
class LineChange:
    number: int  # 1-based
    before: str
    after: str


@dataclass
class PatchResult:
    """What :func:`patch_moses_ini` changed."""

    ini_path: str
    output_path: str
    feature_name: str
    feature_type: str
    old_num_features: int
    new_num_features: int
    table_path: str  # the new path= value
    changed_lines: List[int] = field(default_factory=list)  # 1-based line numbers
    changes: List[LineChange] = field(default_factory=list)
    binarize_command: Optional[List[str]] = None  # the command run, if any


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


def _check_count(table: PathLike, found: int, ini: MosesIni, feature: FeatureLine, old: int, new: int,
                 what: str) -> None:
    if found == new:
        return
    if found == old and _points_at(ini, feature, table):
        raise PhraseScorerError(
            f"{feature.name} already reads this table with num-features={old} ({ini.path} line "
            f"{feature.line.number}): the moses.ini looks patched already", path=table, line=1,
            hint="patch the original moses.ini, or use --add-features 0 to change nothing but paths")
    if found == old:
        hint = "the table has no new columns yet: annotate it first, or use --add-features 0"
    elif found > old:
        hint = f"use --add-features {found - old} to match it"
    else:
        hint = f"a {feature.name} table needs at least the {old} scores num-features has now"
    raise PhraseScorerError(
        f"{what} has {found} scores per line but num-features of {feature.name} "
        f"({ini.path} line {feature.line.number}) would be {new} ({old} + {new - old})",
        path=table, line=1, hint=hint,
    )


def _points_at(ini: "MosesIni", feature: "FeatureLine", table: PathLike) -> bool:
    """Does ``feature``'s path= (as Moses resolves it, or against the ini's folder) name ``table``?"""
    path = feature.get("path")
    if not path:
        return False
    folder = os.path.dirname(os.path.abspath(ini.path))
    return any(same_file(candidate, table) for candidate in (path, os.path.join(folder, path)))


def ini_inputs(ini: "MosesIni") -> List[Tuple[str, str]]:
    """The files a moses.ini reads (every feature's path=, as given and against the ini's folder),
    as inputs for :func:`~phrase_scorer.io.outputs.check_output`."""
    folder = os.path.dirname(os.path.abspath(ini.path))
    found = [("the moses.ini", os.fspath(ini.path))]
    for feature in ini.features():
        path = feature.get("path")
        if path:
            found += [(f"the file of {feature.name}", path), (f"the file of {feature.name}", os.path.join(folder, path))]
    return found


def new_column_weights(add_features: int, initial_weights: Union[None, float, Sequence[float]]) -> List[float]:
    """The start weights of ``add_features`` new columns (see :func:`patch_moses_ini`)."""
    if initial_weights is None:
        if add_features > len(COLUMNS):
            raise PhraseScorerError(
                f"no default start weights for {add_features} new columns (annotate adds at most "
                f"{len(COLUMNS)}: {', '.join(COLUMNS)})", hint="give one start weight per new column",
            )
        initial_weights = start_weights(COLUMNS[:add_features])
    elif isinstance(initial_weights, (int, float)):
        initial_weights = [float(initial_weights)] * add_features
    weights = [float(w) for w in initial_weights]
    if len(weights) != add_features:
        raise PhraseScorerError(f"{len(weights)} start weights given for {add_features} new columns",
                                hint="give one weight per new column, or one for all")
    bad = [w for w in weights if not math.isfinite(w)]
    if bad:
        raise PhraseScorerError(f"initial weight {bad[0]} is not a finite number")
    return weights


def declared_scores(ini: MosesIni, feature: FeatureLine) -> int:
    """The phrase-table feature's num-features (Moses' default 1 when absent), checked against its
    weight line, its path= and its tuneable-components."""
    number = feature.line.number
    declared = feature.get("num-features")
    if declared is None:
        old = 1  # Moses' default
    elif declared.isdigit():
        old = int(declared)
    else:
        raise ini.error(f"num-features={declared} is not a whole number", number,
                        "num-features is the number of scores on each table line, e.g. num-features=4")
    weights = ini.weight_line(feature.name)
    if len(weights.weights) != old:
        raise ini.error(
            f"{feature.name} has {len(weights.weights)} weights but num-features={old} (line {number})",
            weights.line.number, "make them agree before adding columns; Moses refuses the mismatch",
        )
    if feature.get("path") is None:
        raise ini.error(f"{feature.name} has no path=", number, "a phrase-table feature needs path=TABLE")
    tuneable = feature.get("tuneable-components")
    if tuneable is not None and len(tuneable.split(",")) != old:
        raise ini.error(
            f"tuneable-components has {len(tuneable.split(','))} values but num-features={old}", number,
            "give one 0 or 1 per score",
        )
    return old


def check_table_scores(ini: MosesIni, feature: FeatureLine, text_table: Optional[PathLike], phrase_table: PathLike,
                       old: int, new: int) -> None:
    """The score count on the first lines of the text table (or, without one, in the binary
    table's own metadata) is the new num-features."""
    if text_table is not None:
        _check_count(text_table, count_table_scores(text_table), ini, feature, old, new,
                     f"the {feature.type} text table")
        return
    found = binary_table_num_scores(feature.type, binary_table_file(feature.type, phrase_table))
    if found is not None:
        _check_count(phrase_table, found, ini, feature, old, new, f"the {feature.type} table")
    else:
        log.warning("%s: the score count of the binary %s table was not checked "
                    "(give the text table to binarise to check it)", phrase_table, feature.type)


def patched_lines(ini: MosesIni, feature: FeatureLine, new_path: str, old: int, new: int,
                  weights_added: Sequence[float], absolute_paths: bool) -> Dict[int, str]:
    """The new text of each changed line, by line number: the feature's line, its weight line and,
    with ``absolute_paths``, every other feature with a relative path=."""
    new_text: Dict[int, str] = {}
    if absolute_paths:
        ini_dir = os.path.dirname(os.path.abspath(ini.path))
        for other in ini.features():
            value = other.get("path")
            if other is not feature and value and not os.path.isabs(value):
                absolute = os.path.normpath(os.path.join(ini_dir, value))
                new_text[other.line.number] = set_arguments(other.line, {"path": absolute})
    values = {"path": new_path, "num-features": str(new)}
    tuneable = feature.get("tuneable-components")
    if tuneable is not None:
        values["tuneable-components"] = tuneable + ",1" * (new - old)
    text = set_arguments(feature.line, values)
    if feature.get("num-features") is None:
        text = insert_argument(feature.line, text, f"num-features={new}")
    new_text[feature.line.number] = text
    weights = ini.weight_line(feature.name)
    new_text[weights.line.number] = append_values(weights.line, [format_weight(w) for w in weights_added])
    return new_text


def patch_moses_ini(
    ini_path: PathLike,
    output_path: PathLike,
    *,
    phrase_table: PathLike,
    add_features: int = 2,
    initial_weights: Union[None, float, Sequence[float]] = None,
    feature_name: Optional[str] = None,
    absolute_paths: bool = False,
    check_table: bool = True,
    binarize_from: Optional[PathLike] = None,
    moses_home: Optional[PathLike] = None,
    overwrite: bool = False,
) -> PatchResult:
    """Write ``ini_path`` to ``output_path`` with a phrase table that has ``add_features`` more columns.

    Only these lines change: the phrase-table feature (``path=`` becomes ``phrase_table``,
    ``num-features`` grows by ``add_features``, a ``tuneable-components`` list gets a ``1`` per new
    column) and its ``[weight]`` line (``initial_weights`` appended: one weight per new column,
    or one number for all of them; by default annotate's start weights,
    :data:`phrase_scorer.config.START_WEIGHTS`, of its first ``add_features`` columns, ``prob``
    then ``unk``).
    ``feature_name`` picks the feature by ``name=``; by default the first phrase table is used.

    ``absolute_paths`` also makes every relative ``path=`` absolute: paths from the ini against
    the ini's folder, ``phrase_table`` against the current directory.

    ``check_table`` compares the score count on the first lines of the text table with the new
    ``num-features``: ``phrase_table`` for ``PhraseDictionaryMemory``, ``binarize_from`` for the
    binary types (whose own metadata is checked when there is no text table to read).

    ``binarize_from`` builds the binary table at ``phrase_table`` from this text table with the
    Moses program in ``moses_home/bin`` (default: the ``MOSES_HOME`` environment variable); see
    :func:`binarize_command`. The ini is written atomically, after any binarising has succeeded.

    ``output_path`` is refused when it is the same file as the ini, the new table, the text table
    to binarise or any file the ini names (:mod:`phrase_scorer.io.outputs`); an existing one is
    replaced only with ``overwrite``.
    """
    if add_features < 0:
        raise PhraseScorerError(f"cannot add {add_features} features", hint="use 0 or more")
    weights_added = new_column_weights(add_features, initial_weights)
    ini = MosesIni.read(ini_path)
    inputs = [*ini_inputs(ini), ("the phrase table", phrase_table), ("the text table", binarize_from)]
    with check_output(output_path, inputs, overwrite=overwrite, what="the patched moses.ini"):
        feature = ini.find_phrase_table(feature_name)
        old = declared_scores(ini, feature)
        new = old + add_features
        if binarize_from is not None and feature.type in TEXT_TABLE_TYPES:
            raise PhraseScorerError(
                f"{feature.name} is a {feature.type}, which reads text tables: there is nothing to binarise",
                path=ini.path, line=feature.line.number, hint="drop --binarize-from, or declare a binary table type",
            )
        if check_table:
            check_table_scores(ini, feature, phrase_table if feature.type in TEXT_TABLE_TYPES else binarize_from,
                               phrase_table, old, new)
        new_path = os.path.abspath(phrase_table) if absolute_paths else os.fspath(phrase_table)
        new_text = patched_lines(ini, feature, new_path, old, new, weights_added, absolute_paths)

        command = None
        if binarize_from is not None:
            for name, path in (("the text table", binarize_from), ("the moses.ini", ini_path)):
                if same_file(phrase_table, path):  # the binariser writes --phrase-table
                    raise PhraseScorerError(f"the binary table {phrase_table} is the same file as {name} {path}",
                                            hint="give the binary table another name")
            if moses_home is None:
                moses_home = os.environ.get("MOSES_HOME")
            command = run_binarizer(feature.type, binarize_from, phrase_table, new, moses_home)

        changes = []
        for line in ini.lines:
            if line.number in new_text and new_text[line.number] != line.text:
                changes.append(LineChange(line.number, line.text, new_text[line.number]))
                line.text = new_text[line.number]
        ini.write(output_path)
        return PatchResult(
            ini_path=ini.path,
            output_path=os.fspath(output_path),
            feature_name=feature.name,
            feature_type=feature.type,
            old_num_features=old,
            new_num_features=new,
            table_path=new_path,
            changed_lines=[c.number for c in changes],
            changes=changes,
            binarize_command=command,
        )


def moses_for_new_columns(output: str, before: int, after: int, columns: Sequence[str], *,
                          moses_ini: Optional[PathLike] = None, ini_output: Optional[PathLike] = None) -> str:
    """What an annotated table OUTPUT (``before`` -> ``after`` scores per line, the new ``columns``)
    means for Moses: with ``moses_ini``, that config patched into ``ini_output`` (default
    OUTPUT.moses.ini) and a line saying so; without it, the change to make by hand."""
    added = after - before
    weights = [format_weight(w) for w in start_weights(columns)]
    described = ", ".join(f"{c} {w}" for c, w in zip(columns, weights))
    if moses_ini:
        target = ini_output or f"{output}.moses.ini"
        result = patch_moses_ini(moses_ini, target, phrase_table=os.path.abspath(output), add_features=added,
                                 initial_weights=start_weights(columns), absolute_paths=True, overwrite=True)
        return (f"patched moses.ini written to {target}: {result.feature_name} num-features="
                f"{result.new_num_features}, start weights of the new columns: {described}; re-tune before use")
    options = "" if tuple(columns) == COLUMNS else f" --add-features {added} --initial-weights {','.join(weights)}"
    path = os.path.abspath(output) if output != "-" else "TABLE"
    return (
        f"\nFor Moses, the phrase table now has {after} scores per line (was {before}). In moses.ini:\n"
        f"  [feature]  PhraseDictionaryMemory ... num-features={after} path={path}\n"
        f"  [weight]   TranslationModel0= <the {before} current weights> {' '.join(weights)}\n"
        f"({described}: the unknown-word feature starts as a penalty), then re-tune.\n"
        f"'phrase-scorer moses-ini MOSES_INI --phrase-table {path}{options} -o NEW_INI' makes this change."
    )
