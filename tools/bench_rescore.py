#!/usr/bin/env python3
"""Rescoring speed: hypotheses per second of ``phrase-scorer rescore`` with sentence models on
the CPU, and where the time of the one-command path (``translate --moses --reranker``) goes.

    python tools/bench_rescore.py --model NAME=DIR [--model NAME=DIR ...] [--reverse-model NAME=DIR]
        [--nbest NBEST --source SRC] [--sentences 200] [--threads 1,2] [--repeats 2]
        [--reranker RERANKER --moses-ini INI --translate-sentences 100] [--parts throughput,path] [--write]

1. Throughput: the first --sentences sentences of NBEST (default: the shared Moses system's
   100-best list of val and its source) are rescored by each model alone (one feature) and by
   all of them together (one feature each), with each --threads count: the best of --repeats
   runs of the whole command (start-up and model loading included), as hypotheses/s and
   predicted target tokens/s (words + </s>), beside the same run's fp32 matmul rate.
2. The one-command path (with --reranker, --moses-ini and MOSES_HOME): ``phrase-scorer translate
   --moses INI --reranker RERANKER`` of the first --translate-sentences lines of SOURCE, and the
   seconds it spent in Moses (decoding the n-best lists), rescoring and reranking, as the
   command reports them.

Time it on an otherwise idle machine: every figure is a wall-clock time.
"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path
from typing import List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SHARED = benchlib.ROOT.parent / "shared" / "data"
DEFAULT_NBEST = SHARED / "moses-multi30k-en-fr" / "val.nbest.gz"
DEFAULT_SOURCE = SHARED / "multi30k-en-fr" / "val.tok.en.gz"
PHASES = re.compile(r"Moses ([\d.]+) s, rescoring ([\d.]+) s, reranking ([\d.]+) s")


def open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def nbest_head(nbest: Path, source: Path, sentences: int, work: Path) -> Tuple[Path, Path, int, int, int]:
    """The list's lines of its first ``sentences`` sentences and those source lines, as files in
    ``work``; and the number of sentences found, of hypotheses and of predicted target tokens."""
    head, head_source = work / f"head{sentences}.nbest", work / f"head{sentences}.src"
    hypotheses = tokens = 0
    found = 0  # sentences in the list's head (a shorter list has fewer than asked)
    with open_text(nbest) as lines, open(head, "w", encoding="utf-8") as out:
        for line in lines:
            sentence = int(line.split(" ||| ", 1)[0])
            if sentence >= sentences:
                break
            found = sentence + 1
            out.write(line)
            hypotheses += 1
            tokens += len(line.split(" ||| ")[1].split()) + 1
    with open_text(source) as lines, open(head_source, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if i >= found:
                break
            out.write(line)
    return head, head_source, found, hypotheses, tokens


def model_args(forward: Sequence[Tuple[str, str]], reverse: Sequence[Tuple[str, str]]) -> List[str]:
    args: List[str] = []
    for name, directory in forward:
        args += ["-m", directory, "--name", name]
    for name, directory in reverse:
        args += ["-r", directory, "--reverse-name", name]
    return args


def named(values: Sequence[str]) -> List[Tuple[str, str]]:
    pairs = []
    for value in values:
        name, _, directory = value.partition("=")
        if not directory:
            raise SystemExit(f"{value!r}: give NAME=DIR")
        pairs.append((name, directory))
    return pairs


def throughput(args, work: Path) -> str:
    nbest, source, sentences, hypotheses, tokens = nbest_head(Path(args.nbest), Path(args.source), args.sentences, work)
    forward, reverse = named(args.model), named(args.reverse_model)
    sets = [([m], []) for m in forward] + [([], [m]) for m in reverse]
    if len(forward) + len(reverse) > 1:
        sets.append((forward, reverse))
    rows = []
    for models_forward, models_reverse in sets:
        label = " + ".join(n for n, _ in [*models_forward, *models_reverse])
        for threads in args.threads:
            best = min(benchlib.run_measured(benchlib.phrase_scorer_command(
                "rescore", nbest, "--source", source, *model_args(models_forward, models_reverse),
                "--threads", threads, "-o", work / "out.nbest", "--overwrite"))[2] for _ in range(args.repeats))
            rows.append([label, threads, f"{hypotheses:,}", f"{best:.1f}", f"{hypotheses / best:,.0f}",
                         f"{tokens / best:,.0f}"])
            print(rows[-1], file=sys.stderr, flush=True)
    info = benchlib.machine()
    return (
        "## Rescoring: hypotheses per second on the CPU (`tools/bench_rescore.py`)\n\n"
        f"`phrase-scorer rescore` of the first {sentences} sentences of `{Path(args.nbest).name}` "
        f"({hypotheses:,} hypotheses, {tokens:,} predicted target tokens), each model alone and all together, "
        f"best of {args.repeats} runs of the whole command (start-up and loading included), on {info['cpu']} "
        f"({info['cores']} cores), torch {info['torch']}; fp32 matmul rate in the same run: "
        f"{benchlib.matmul_rate() / 1e9:.0f} GFLOP/s. Models: "
        + ", ".join(f"{n} `{d}`" for n, d in [*forward, *reverse]) + ".\n\n"
        + benchlib.markdown_table(["models", "threads", "hypotheses", "seconds", "hypotheses/s", "tokens/s"], rows)
        + f"\n\nCommand: `python tools/bench_rescore.py {' '.join(sys.argv[1:])}`.\n"
    )


def one_command(args, work: Path) -> str:
    source = work / f"translate{args.translate_sentences}.src"
    with open_text(Path(args.source)) as lines, open(source, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if i >= args.translate_sentences:
                break
            out.write(line)
    _, err, seconds, _ = benchlib.run_measured(benchlib.phrase_scorer_command(
        "translate", "--moses", args.moses_ini, "--reranker", args.reranker, source, "-o", work / "translation.txt",
        "--overwrite", "--decoder-threads", args.decoder_threads))
    match = PHASES.search(err)
    if not match:
        raise SystemExit(f"translate did not report its phases:\n{err[-2000:]}")
    moses, rescoring, reranking = (float(g) for g in match.groups())
    rest = max(seconds - moses - rescoring - reranking, 0.0)
    rows = [[name, f"{value:.1f}", f"{100 * value / seconds:.0f}%"]
            for name, value in [("Moses (n-best lists)", moses), ("rescoring", rescoring), ("reranking", reranking),
                                ("start-up, loading, the rest", rest)]]
    info = benchlib.machine()
    return (
        "## The one-command path: where the time goes (`tools/bench_rescore.py --reranker ...`)\n\n"
        f"`phrase-scorer translate --moses {Path(args.moses_ini).name} --reranker {Path(args.reranker).name}` of the "
        f"first {args.translate_sentences} sentences of `{Path(args.source).name}` (decoder threads "
        f"{args.decoder_threads}), {seconds:.1f} s in all, "
        f"{args.translate_sentences / seconds:.2f} sentences/s, on {info['cpu']} ({info['cores']} cores).\n\n"
        + benchlib.markdown_table(["part", "seconds", "share"], rows)
        + f"\n\nCommand: `python tools/bench_rescore.py {' '.join(sys.argv[1:])}`.\n"
    )


def main() -> None:
    parser, _ = benchlib.bench_parser(__doc__)
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--reverse-model", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--nbest", default=str(DEFAULT_NBEST))
    parser.add_argument("--source", default=str(DEFAULT_SOURCE))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")], default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--reranker", default=None)
    parser.add_argument("--moses-ini", default=None)
    parser.add_argument("--translate-sentences", type=int, default=100)
    parser.add_argument("--decoder-threads", type=int, default=1)
    parser.add_argument("--parts", default="throughput,path", help="throughput, path (the path needs --reranker)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    with benchlib.work_dir(args.work_dir, "bench-rescore-") as work:
        if "throughput" in parts:
            if not args.model and not args.reverse_model:
                parser.error("give at least one --model NAME=DIR")
            benchlib.report("bench_rescore_throughput", throughput(args, work), args.write)
        if "path" in parts and args.reranker:
            if not args.moses_ini:
                parser.error("--reranker needs --moses-ini")
            benchlib.report("bench_rescore_path", one_command(args, work), args.write)


if __name__ == "__main__":
    main()
