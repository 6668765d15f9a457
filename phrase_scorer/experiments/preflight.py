"""What the long commands check before their first step (``build-reranker``, ``ems-decoder``,
``rescore-experiment``, ``experiment``): the inputs that a step hours in would otherwise be the
first to read. Each command calls these before it makes anything, and again whenever it is given
again to continue: a check a fresh run fails is never skipped by continuing.

- the moses.ini reads, and every file its features name is there (:func:`check_ini`; the rule's
  home is :meth:`~phrase_scorer.io.moses_ini.MosesIni.check_files`, which ``tune`` uses too);
- a text and its translation (a corpus, a tuning, dev or test set) are regular files of readable
  text, as many lines on both sides, and not empty (:func:`check_text_pair`);
- Moses has the decoder and mert's programs (:func:`check_moses`);
- what the machine holds (:func:`machine_memory`), against which a command bounds what a count
  multiplies, and the disk the n-best lists need (:func:`check_disk_holds`);
- one log line says what was checked (:func:`log_checked`).
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.inputs import TextLines, refuse_single_pass
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni

log = logging.getLogger(__name__)


def check_ini(path: PathLike) -> MosesIni:
    """The moses.ini at ``path``, read, each file its features name there
    (:meth:`~phrase_scorer.io.moses_ini.MosesIni.check_files`)."""
    system = MosesIni.read(path)
    system.check_files()
    return system


def check_text_pair(sides: Tuple[PathLike, PathLike], what: str) -> int:
    """The two sides of ``what`` (a corpus, a tuning set): regular files (the steps read them more
    than once, which a pipe or a device cannot give, and reading one here would consume it),
    readable text of as many lines, not empty. Returns the lines."""
    for side in sides:
        refuse_single_pass(side, what, "the steps read it more than once")
    counts = []
    for side in sides:
        lines = 0
        for lines, _ in TextLines(side):
            pass
        counts.append(lines)
    if counts[0] != counts[1]:
        raise PhraseScorerError(f"{what}: {counts[0]} lines, but its other side {os.fspath(sides[1])} has "
                                f"{counts[1]}", path=sides[0],
                                hint="give the two sides of one set, line n translating line n")
    if not counts[0]:
        raise PhraseScorerError(f"{what}: no lines", path=sides[0], hint="give a non-empty file")
    return counts[0]


def check_moses(moses, decoder: str, mertdir: Optional[PathLike] = None) -> None:
    """``moses`` (a :class:`~phrase_scorer.moses.installation.MosesInstallation`) has the
    decoder ``decoder`` and mert's programs (in ``mertdir``, by default its ``bin/``)."""
    moses.check_mert(mertdir)
    moses.decoder(decoder)


def machine_memory() -> int:
    """The memory this process may use, in bytes: the machine's, or its control group's limit
    where lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit, encoding="ascii") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    return total


#: Bytes an n-best hypothesis takes on disk over a build or an experiment: its line in Moses' list
#: (words, every feature's scores: about 250 bytes), again in the rescored list and in mert's
#: feature and score files
NBEST_HYPOTHESIS_BYTES = 3 * 250


def check_disk_holds(folder: PathLike, nbest_size: int, sentences: int) -> str:
    """Refuse n-best lists of ``nbest_size`` hypotheses for ``sentences`` sentences in all that
    would not fit in the free space where ``folder`` is (or will be). Returns what was found, for
    the log."""
    import shutil

    from phrase_scorer.errors import Text, setting

    where = os.path.abspath(folder)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    need = nbest_size * sentences * NBEST_HYPOTHESIS_BYTES
    gib = 1 << 30
    if need > free:
        raise PhraseScorerError(Text(f"{sentences:,} sentences' lists of ", setting("nbest_size", nbest_size),
                                     f" hypotheses need about {need / gib:,.1f} GiB, more than the {free / gib:,.1f} "
                                     "GiB free there"), path=where,
                                hint=Text("give a smaller ", setting("nbest_size"), ", or a folder on a larger disk"))
    return f"n-best lists of about {max(need >> 20, 1):,} MiB in {free / gib:,.1f} GiB free"


def log_checked(what: Sequence[str]) -> None:
    """The one line that says the checks passed, before the first step."""
    log.info("checked before the first step: %s", "; ".join(what))
