"""Build the binary phrase tables Moses loads (Compact, ProbingPT, OnDisk) with Moses' own programs.

No torch here: the Moses-config verbs start at once.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import List, Optional

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import binary_table_file
from phrase_scorer.runtime.programs import run_logged

log = logging.getLogger(__name__)

#: The Moses program that builds each binary table type from a text table.
BINARIZERS = {
    "PhraseDictionaryCompact": "processPhraseTableMin",
    "ProbingPT": "CreateProbingPT",
    "PhraseDictionaryOnDisk": "CreateOnDiskPt",
}


def _looks_like(feature_type: str, path: str) -> bool:
    """Whether the existing folder ``path`` holds a binary table of ``feature_type``."""
    marker = "config" if feature_type == "ProbingPT" else "Misc.dat"
    return os.path.isfile(os.path.join(path, marker))


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


def run_binarizer(feature_type: str, text_table: PathLike, output: PathLike, num_scores: int,
                  moses_home: Optional[PathLike]) -> List[str]:
    """Binarise ``text_table`` into ``output`` (the feature's ``path=``) and return the command run.

    The table is built under a temporary name (``OUTPUT.part``; anything already there is refused,
    never removed) and moved into place only when the program succeeds, so a failure leaves any
    previous table untouched. The program's log is appended to ``OUTPUT.log``, never through a
    link. See :func:`binarize_command` for the programs and what they expect of their input
    (sorted for Compact, grouped for ProbingPT).
    """
    if not moses_home:
        raise PhraseScorerError("binarising needs the Moses programs",
                                hint=Text("set MOSES_HOME (or pass ", setting("moses_home"),
                                          ") to the Moses folder holding bin/"))
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
                                hint=Text("remove it or choose another ", setting("phrase_table"), " path"))
    command = binarize_command(feature_type, text_table, build_arg, num_scores, moses_home)
    program = command[0]
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        raise PhraseScorerError("no such program", path=program,
                                hint="MOSES_HOME must be the Moses folder whose bin/ holds "
                                     f"{os.path.basename(program)}")
    if os.path.lexists(built):  # not this run's: never removed, nor written through (a link)
        raise PhraseScorerError("a file is in the way of the table being built", path=built,
                                hint="it may be yours or left by an interrupted run: move it away, then run again")
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
            _replace_folder(built, final)
        else:
            os.replace(built, final)
    except OSError as exc:
        raise PhraseScorerError(f"cannot move the new table into place: {exc.strerror or exc}", path=final,
                                hint=f"the table that was built is in {built}") from None
    return command


def _replace_folder(built: str, final: str) -> None:
    """Move the folder ``built`` to ``final``, where a folder table is: the old one steps aside
    into a folder of a name no one else holds (``FINAL.previous.XXXXXXXX/``, made for it) and is
    removed only once the new one is in place (it steps back if that fails; an interruption
    between the two moves leaves it whole there)."""
    import tempfile

    aside = tempfile.mkdtemp(prefix=os.path.basename(final) + ".previous.", dir=os.path.dirname(final) or ".")
    previous = os.path.join(aside, os.path.basename(final))
    os.rename(final, previous)
    try:
        os.rename(built, final)
    except OSError:
        os.rename(previous, final)
        os.rmdir(aside)
        raise
    shutil.rmtree(aside)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
