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

import signal

# The process settings (OMP_WAIT_POLICY, THP_MEM_ALLOC_ENABLE) were set by importing phrase_scorer,
# before this package: the command line runs as a Python caller does.
from phrase_scorer.cli import (  # noqa: F401  (the verbs)
    analysis, experiments, generation, moses, rescoring, scoring, training,
)
from phrase_scorer.cli.group import cli


def main() -> None:
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phrase-scorer score ... | head` ends quietly
    cli(prog_name="phrase-scorer")


if __name__ == "__main__":
    main()
