"""The parts both experiments' Markdown reports share: tables, mean ± sd cells, p-value cells,
the closing lines, writing report.md and results.json together, where an experiment writes
(:class:`ExperimentOutputs`), and the report a caller asks for (``report``): checked and claimed
before hours of work, written when the experiment ends."""
from __future__ import annotations

import contextlib
import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ContextManager, Iterable, Mapping, Optional, Sequence

from phrase_scorer import __version__
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.outputs import Input, OutputKind
from phrase_scorer.runtime.job import OutputJob

NONE = "–"  # the cell of a figure that does not apply


@dataclass(frozen=True)
class ExperimentOutputs:
    """Where an experiment writes: its working folder (resumable: finished steps are kept, and
    report.md and results.json are among its files) and, when given, the Markdown report too,
    an existing one replaced only with ``overwrite``."""

    work_dir: PathLike
    report: Optional[PathLike] = None
    overwrite: bool = False


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table, one line per row (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` to two decimals; one value alone; ``–`` for none."""
    if not values:
        return NONE
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def two_decimals(value: Optional[float]) -> str:
    return NONE if value is None else f"{value:.2f}"


def p_values(values: Optional[Sequence[float]]) -> str:
    """The p of each run, ``0.004 / 0.002 / 0.001``."""
    return NONE if not values else " / ".join(f"{p:.3f}" for p in values)


def closing_lines(signatures: Mapping[str, str]) -> str:
    """The sacrebleu signatures and the package version, as the last lines of Settings."""
    return (f"- sacrebleu signatures: BLEU `{signatures.get('BLEU', '')}`, chrF `{signatures.get('chrF', '')}`\n"
            f"- phrase-scorer {__version__}, report written "
            f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}\n")


def write_report(work: Path, markdown: str, results: Mapping[str, Any]) -> None:
    """``report.md`` and ``results.json`` in ``work``, each written atomically."""
    write_text_atomically(work / "report.md", markdown)
    write_text_atomically(work / "results.json", json.dumps(results, indent=1) + "\n")


def report_job(outputs: ExperimentOutputs, inputs: Sequence[Input]) -> ContextManager[Optional[OutputJob]]:
    """The job of the report ``outputs`` ask for (None: no report), entered before the experiment
    runs: never one of ``inputs``, an existing one replaced only with ``outputs.overwrite``,
    claimed until :func:`finish_report` writes it or the experiment fails."""
    if outputs.report is None:
        return contextlib.nullcontext()
    return OutputJob(outputs.report, inputs, overwrite=outputs.overwrite, kind=OutputKind("the report"))


def finish_report(job: Optional[OutputJob], markdown: str) -> None:
    """Write ``markdown`` as the report ``job`` holds (nothing without one)."""
    if job is not None:
        job.write(0, markdown.encode("utf-8"))
        job.commit()
