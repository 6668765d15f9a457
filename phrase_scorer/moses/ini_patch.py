"""Patch a moses.ini for a phrase table with new score columns.

:func:`patch_moses_ini` points a phrase-table feature at a new table with more score columns and
gives it the matching extra weights; it changes nothing else, except relative ``path=`` values
when asked to make them absolute. It binarises the table first where the feature loads a binary
one (:mod:`phrase_scorer.moses.binarise`).

No torch here: the Moses-config verbs start at once.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from phrase_scorer.config import COLUMNS, MosesIniOptions, start_weights
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import (
    TEXT_TABLE_TYPES,
    FeatureLine,
    MosesIni,
    append_values,
    binary_table_file,
    binary_table_num_scores,
    count_table_scores,
    format_weight,
    ini_inputs,
    insert_argument,
    set_arguments,
)
from phrase_scorer.io.outputs import OutputKind, same_file
from phrase_scorer.moses.binarise import run_binarizer
from phrase_scorer.runtime.job import OutputJob

log = logging.getLogger(__name__)


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


def _check_count(table: PathLike, found: int, ini: MosesIni, feature: FeatureLine, old: int, new: int,
                 what: str) -> None:
    if found == new:
        return
    if found == old and _points_at(ini, feature, table):
        raise PhraseScorerError(
            f"{feature.name} already reads this table with num-features={old} ({ini.path} line "
            f"{feature.line.number}): the moses.ini looks patched already", path=table, line=1,
            hint=Text("patch the original moses.ini, or use ", setting("add_features", 0),
                      " to change nothing but paths"))
    hint: Union[Text, str]
    if found == old:
        hint = Text("the table has no new columns yet: annotate it first, or use ", setting("add_features", 0))
    elif found > old:
        hint = Text("use ", setting("add_features", found - old), " to match it")
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
    return any(same_file(candidate, table) for candidate in (path, ini.resolve(path)))


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
    elif declared.isascii() and declared.isdigit():
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
        for other in ini.features():
            value = other.get("path")
            if other is not feature and value and not os.path.isabs(value):
                absolute = os.path.normpath(ini.resolve(value))
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
    options: MosesIniOptions = MosesIniOptions(),
    binarize_from: Optional[PathLike] = None,
    moses_home: Optional[PathLike] = None,
    overwrite: bool = False,
) -> PatchResult:
    """Write ``ini_path`` to ``output_path`` with a phrase table that has ``options.add_features``
    more columns.

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
    add_features, absolute_paths = options.add_features, options.absolute_paths
    if add_features < 0:
        raise PhraseScorerError(f"cannot add {add_features} features", hint="use 0 or more")
    weights_added = new_column_weights(add_features, options.initial_weights)
    ini = MosesIni.read(ini_path)
    inputs = [*ini_inputs(ini), ("the phrase table", phrase_table), ("the text table", binarize_from)]
    with OutputJob(output_path, inputs, overwrite=overwrite, kind=OutputKind("the patched moses.ini")) as job:
        feature = ini.find_phrase_table(options.feature_name)
        old = declared_scores(ini, feature)
        new = old + add_features
        if binarize_from is not None and feature.type in TEXT_TABLE_TYPES:
            raise PhraseScorerError(
                f"{feature.name} is a {feature.type}, which reads text tables: there is nothing to binarise",
                path=ini.path, line=feature.line.number,
                hint=Text("drop ", setting("binarize_from"), ", or declare a binary table type"),
            )
        if options.check_table:
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
        job.write(len(ini.lines), ini.text().encode("utf-8"))
        job.commit()
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
                          moses_ini: Optional[PathLike] = None, ini_output: Optional[PathLike] = None,
                          overwrite: bool = False) -> str:
    """What an annotated table OUTPUT (``before`` -> ``after`` scores per line, the new ``columns``)
    means for Moses: with ``moses_ini``, that config patched into ``ini_output`` (default
    OUTPUT.moses.ini; an existing one is replaced only with ``overwrite``) and a line saying so;
    without it, the change to make by hand."""
    added = after - before
    weights = [format_weight(w) for w in start_weights(tuple(columns))]
    described = ", ".join(f"{c} {w}" for c, w in zip(columns, weights))
    if moses_ini:
        target = ini_output or f"{output}.moses.ini"
        patch = MosesIniOptions(add_features=added, initial_weights=start_weights(tuple(columns)), absolute_paths=True)
        result = patch_moses_ini(moses_ini, target, phrase_table=os.path.abspath(output), options=patch,
                                 overwrite=overwrite)
        return (f"patched moses.ini written to {target}: {result.feature_name} num-features="
                f"{result.new_num_features}, start weights of the new columns: {described}; re-tune before use")
    options = ("" if tuple(columns) == COLUMNS
               else Text(" ", setting("add_features", added, verb="moses-ini"), " ",
                         setting("initial_weights", ",".join(weights), verb="moses-ini")))
    path = os.path.abspath(output) if output != "-" else "TABLE"
    return Text(
        f"\nFor Moses, the phrase table now has {after} scores per line (was {before}). In moses.ini:\n"
        f"  [feature]  PhraseDictionaryMemory ... num-features={after} path={path}\n"
        f"  [weight]   TranslationModel0= <the {before} current weights> {' '.join(weights)}\n"
        f"({described}: the unknown-word feature starts as a penalty), then re-tune.\n"
        "'phrase-scorer moses-ini MOSES_INI ", setting("phrase_table", path, verb="moses-ini"), options, " ",
        setting("output", "NEW_INI", short=True, verb="moses-ini"), "' makes this change."
    )

