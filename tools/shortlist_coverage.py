#!/usr/bin/env python3
"""How much of a language's text a word shortlist covers: the first question when choosing
between ``train --vocabulary words`` and subword pieces (docs/your-language-pair.md).

    python tools/shortlist_coverage.py TRAIN [HELD_OUT ...] [--sizes 6000,15000,30000]

TRAIN and each HELD_OUT are tokenised text files (plain or gzip), one sentence per line: the
side of the corpus a model would read or predict. For each shortlist size it prints the share
of TRAIN's tokens the most frequent words cover (as ``train`` counts them) and the share of each
HELD_OUT file's tokens outside the shortlist (what a word model reads as ``<unk>``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from phrase_scorer.experiments.build_reranker import outside_shortlist, words_of  # noqa: E402  (one shortlist rule)


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("train", type=Path)
    parser.add_argument("held_out", type=Path, nargs="*")
    parser.add_argument("--sizes", default="6000,15000,30000", help="shortlist sizes, comma-separated")
    args = parser.parse_args(argv)
    counts = Counter(words_of(args.train))
    total = sum(counts.values())
    held_out = {path: Counter(words_of(path)) for path in args.held_out}
    print(f"{args.train}: {total:,} tokens, {len(counts):,} word types")
    header = ["shortlist", "training tokens covered"] + [f"{p.name}: tokens outside" for p in held_out]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for size in (int(s) for s in args.sizes.split(",")):
        row = [f"{size:,}", f"{100 * (1 - outside_shortlist(counts, counts, size)):.1f}%"]
        row += [f"{100 * outside_shortlist(counts, held, size):.1f}%" for held in held_out.values()]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
