#!/usr/bin/env python3
"""The parameter count of every preset of every architecture, as a Markdown table.

    python tools/model_sizes.py            # print the table
    python tools/model_sizes.py --write    # and put it into docs/rnnsearch.md, between its markers

Counts assume full shortlists: a corpus with fewer distinct words gets smaller embedding and
output matrices.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import benchlib  # noqa: E402

from phrase_scorer.config import ARCH_PRESETS  # noqa: E402
from phrase_scorer.models.architectures import full_size_parameters  # noqa: E402

DOC = ROOT / "docs" / "rnnsearch.md"
BEGIN, END = "<!-- model_sizes: begin -->", "<!-- model_sizes: end -->"


def sizes_table() -> str:
    lines = ["| arch | preset | shortlists (source / target) | parameters |", "|---|---|---|---:|"]
    for arch, presets in ARCH_PRESETS.items():
        for name, config in presets.items():
            lines.append(f"| {arch} | {name} | {config.source_shortlist:,} / {config.target_shortlist:,} | "
                         f"{full_size_parameters(config):,} |")
    return "\n".join(lines) + "\n"


def write_table(table: str, path: Path = DOC) -> None:
    benchlib.replace_marked(path, BEGIN, END, table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    table = sizes_table()
    print(table, end="")
    if args.write:
        write_table(table)


if __name__ == "__main__":
    main()
