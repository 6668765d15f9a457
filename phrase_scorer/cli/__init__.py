"""The ``phrase-scorer`` command line: parses options, calls one library function per verb.

One module per group of verbs (training, scoring, rescoring, generation, analysis, moses,
experiments);
the group, its error handling and the shared options live in ``group`` and ``options``.

Library errors (:class:`PhraseScorerError`) become one line on stderr and exit status 1; an
interrupted long job says how to resume and exits with 130. SIGTERM and SIGHUP end a run as
Ctrl-C does, with 128 + the signal's number (``group.ending_like_ctrl_c``). torch is imported
only inside the verbs that need it, so ``--help`` and the Moses-config verbs start at once.
"""

from __future__ import annotations

import os
import signal

# PyTorch's OpenMP threads spin while they wait for work by default. Beside other busy processes
# a spinning thread holds a core that the thread it waits for needs: with sleeping threads a
# `small` model annotated 1.7 and 8.1 times faster (two measurements) on a 2-core machine kept
# busy by 2 other processes, and about 10% slower on the idle machine (docs/benchmarks.md,
# "Annotate on a busy machine").
# So waiting threads sleep, unless the user chose a policy (OMP_WAIT_POLICY=ACTIVE for a machine
# of its own). The OpenMP runtime reads this when torch loads, which is after this line.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# On a CPU, torch frees a scored depth's states with the C library, which hands buffers of more
# than a few MB back to the kernel at once (and takes them again, page by page, at the next depth):
# on the main thread between a batch's operators, most of the `paper` network's host work per pair
# (8.7 against 3.5 µs with huge pages: docs/benchmarks.md, "The batch scorer's stages"). With
# THP_MEM_ALLOC_ENABLE torch's CPU allocator asks for 2 MB pages for such buffers (where the
# kernel's transparent huge pages allow it: "madvise" or "always"), a page fault per 2 MB instead
# of per 4 kB. No score changes.
# Read at torch's first allocation, after this line; THP_MEM_ALLOC_ENABLE=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from phrase_scorer.cli import (  # noqa: E402,F401  (the verbs)
    analysis, experiments, generation, moses, rescoring, scoring, training,
)
from phrase_scorer.cli.group import cli  # noqa: E402


def main() -> None:
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phrase-scorer score ... | head` ends quietly
    cli(prog_name="phrase-scorer")


if __name__ == "__main__":
    main()
