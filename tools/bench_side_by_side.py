"""build-reranker's trainings one after another or side by side: training pairs per second.

    python tools/bench_side_by_side.py --steps 300 --write
    python tools/bench_side_by_side.py --counts 1,2,3,5 --presets small,medium --write
    python tools/bench_side_by_side.py --arch transformer --counts 1,3 --write
    python tools/bench_side_by_side.py --builds transformer:2,transformer:4,rnnsearch:3+transformer:2 --write

Runs ``phrase-scorer train --corpus`` of RNNsearch ``small`` (or each of ``--presets``; another
architecture with ``--arch``, whose section of docs/benchmarks.md is its own) on the
Multi30k English-French sentence pairs (``--data``), the build's recipe, for ``--steps`` updates:
one training on all the cores (``--threads`` = the cores: how ``build-reranker --one-at-a-time``
trains each model), then 2 and 3 (``--counts``) trainings at once on their share of the cores
(at least one thread each: how ``build-reranker`` trains them side by side), each a process of
its own started together. A training's rate is the mean of its log's validation intervals after
the first (start-up and validation excluded); the rate of trainings side by side is the sum of
theirs, over the time they all ran. *x one at a time*: that sum against the first count's rate
of the same preset in the same run. Every configuration runs ``--repeats`` times, in rounds, and
the best round counts.

``--builds`` times the trainings of ``build-reranker`` builds instead, each configuration a list
of architectures and counts (``rnnsearch:3+transformer:2``: three RNNsearch and two Transformer
trainings at once), with the build's preset, batch size and threads (its share of the cores for
each training, all of them for one), in one run: the *idle hours* of each build, its models'
``--max-steps`` updates of the build's batch at the rate in all of its configuration, are then
on one clock (docs/results.md, "BLEU against training hours").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SECTION = "bench_side_by_side"
DATA = benchlib.ROOT.parent / "shared" / "data" / "multi30k-en-fr"


def trainings(args, work: Path, preset: str, count: int, archs: Sequence[str] = (),
              batch_size: Optional[int] = None) -> Dict[str, object]:
    """``count`` trainings of ``preset`` started together (of ``archs``, one per training; none:
    ``--arch`` for each); each one's pairs/s."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // count)
    data = Path(args.data)
    every = max(1, args.steps // 3)
    batch = ["--batch-size", batch_size] if batch_size else []
    runs = []
    for k in range(count):
        out = work / f"x{count}-{k}"
        command = benchlib.phrase_scorer_command(
            "train", "--corpus", data / "train.tok.en.gz", data / "train.tok.fr.gz", "--dev", data / "val.tok.en.gz",
            data / "val.tok.fr.gz", "--arch", archs[k] if archs else args.arch, "--preset", preset,
            "--threads", threads, *batch, "--valid-metric", "nll", "--valid-every", every, "--max-steps", 3 * every,
            "--seed", k + 1, "-o", out, "--overwrite")
        runs.append((out, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    rates = []
    for out, proc in runs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"{out}: training failed: {err[-2000:]}")
        records = [json.loads(line) for line in (out / "train.log.jsonl").read_text().splitlines() if line.strip()]
        later = records[1:]  # the first interval holds the start-up
        if not later:
            raise SystemExit(f"{out}: fewer than 2 validations; raise --steps")
        rates.append(sum(r["pairs_per_second"] for r in later) / len(later))
        shutil.rmtree(out, ignore_errors=True)
    return {"preset": preset, "trainings": count, "threads": threads, "rates": rates, "total": sum(rates)}


def build_archs(configuration: str) -> List[str]:
    """``rnnsearch:3+transformer:2`` -> the architecture of each training, in order."""
    from phrase_scorer.config import ARCH_PRESETS

    archs: List[str] = []
    for part in configuration.split("+"):
        arch, _, count = part.partition(":")
        if not arch or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--builds: {part!r} is not ARCH:COUNT (rnnsearch:3+transformer:2)")
        if arch not in ARCH_PRESETS:
            raise SystemExit(f"--builds: {arch!r} is not an architecture ({', '.join(ARCH_PRESETS)})")
        archs += [arch] * int(count)
    return archs


def builds(args) -> None:
    """The ``--builds`` configurations timed in one run, and each build's idle hours."""
    from phrase_scorer.config import BuildRerankerOptions

    build = BuildRerankerOptions()
    configurations = {c: build_archs(c) for c in args.builds.split(",") if c}  # every one checked before the first
    load_before = os.getloadavg()[0]
    best: Dict[str, dict] = {}
    with benchlib.work_dir(args.work_dir, "bench-side-by-side-") as work:
        for _ in range(args.repeats):
            for configuration, archs in configurations.items():
                r = trainings(args, work, build.preset, len(archs), archs, build.batch_size)
                print(json.dumps({"configuration": configuration, **r}), flush=True)
                if configuration not in best or r["total"] > best[configuration]["total"]:
                    best[configuration] = r
    rows: List[List[object]] = []
    for configuration in configurations:
        r = best[configuration]
        pairs = r["trainings"] * build.max_steps * build.batch_size
        rows.append([configuration.replace("+", " + "), r["trainings"], r["threads"],
                     " / ".join(f"{x:,.0f}" for x in r["rates"]), f"**{r['total']:,.0f}**",
                     f"{pairs / r['total'] / 3600:.2f}"])
    info = benchlib.machine()
    text = (
        "## Training side by side: the builds' clock (`tools/bench_side_by_side.py --builds`)\n\n"
        f"Command: `python tools/bench_side_by_side.py --builds {args.builds} --steps {args.steps} "
        f"--repeats {args.repeats} --write`; machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, "
        f"fp32, OMP_WAIT_POLICY=PASSIVE; 1-minute load average {load_before:.2f} before. Each configuration starts "
        "its trainings together, as `build-reranker` trains its models side by side: processes of `phrase-scorer "
        f"train --corpus train.tok.en.gz train.tok.fr.gz --arch A --preset {build.preset} --batch-size "
        f"{build.batch_size} --threads T --max-steps {3 * max(1, args.steps // 3)}` (Multi30k English-French, "
        "each architecture's recipe; T: the cores shared among the trainings, at least one each); *pairs/s each*: "
        "the mean of each training log's validation intervals after the first (start-up and validation "
        f"excluded), the best of the rounds; *idle hours*: {build.max_steps:,} updates of {build.batch_size} "
        "pairs for each training at the rate in all.\n\n"
        + benchlib.markdown_table(["trainings at once", "trainings", "threads each", "pairs/s each",
                                   "pairs/s in all", f"idle hours for {build.max_steps:,} updates each"], rows)
        + "\n"
    )
    benchlib.report(f"{SECTION}_builds", text, args.write)


def main() -> None:
    parser, _ = benchlib.bench_parser(__doc__)
    parser.add_argument("--data", default=str(DATA), help="a folder with train.tok.{en,fr}.gz, val.tok.{en,fr}.gz")
    parser.add_argument("--steps", type=int, default=300, help="updates per training")
    parser.add_argument("--counts", default="1,2,3", help="trainings at once, per configuration")
    parser.add_argument("--presets", default="small", help="the architecture's presets, each with every count")
    parser.add_argument("--arch", default="rnnsearch", help="the architecture trained")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--builds", default="",
                        help="build-reranker's trainings instead, comma-separated: rnnsearch:3,transformer:2,"
                             "rnnsearch:3+transformer:2 (the build's preset and batch size)")
    args = parser.parse_args()
    if args.builds:
        builds(args)
        return
    counts = [int(c) for c in args.counts.split(",")]
    presets = [p for p in args.presets.split(",") if p]
    load_before = os.getloadavg()[0]
    best: Dict[Tuple[str, int], dict] = {}
    with benchlib.work_dir(args.work_dir, "bench-side-by-side-") as work:
        for _ in range(args.repeats):
            for preset in presets:
                for count in counts:
                    r = trainings(args, work, preset, count)
                    print(json.dumps(r), flush=True)
                    if (preset, count) not in best or r["total"] > best[preset, count]["total"]:
                        best[preset, count] = r
    rows: List[List[object]] = []
    for preset in presets:
        one = best[preset, counts[0]]["total"]
        for count in counts:
            r = best[preset, count]
            rows.append([preset, count, r["threads"], " / ".join(f"{x:,.0f}" for x in r["rates"]),
                         f"**{r['total']:,.0f}**", f"{r['total'] / one:.2f}"])
    info = benchlib.machine()
    arch = "" if args.arch == "rnnsearch" else f" --arch {args.arch}"
    text = (
        f"## Training side by side{': ' + args.arch if arch else ''} (`tools/bench_side_by_side.py{arch}`)\n\n"
        f"Command: `python tools/bench_side_by_side.py{arch} --steps {args.steps} --counts {args.counts} --presets "
        f"{args.presets} --repeats {args.repeats} --write`; machine: {info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}, fp32, "
        f"OMP_WAIT_POLICY=PASSIVE; 1-minute load average {load_before:.2f} before. Each configuration starts "
        f"*trainings* processes of `phrase-scorer train --corpus train.tok.en.gz train.tok.fr.gz --arch {args.arch} "
        f"--preset P --threads T --max-steps {3 * max(1, args.steps // 3)}` together (Multi30k English-French, "
        "the build's recipe); *pairs/s each*: the mean of each training log's validation intervals after the "
        "first; *x one at a time*: their sum against the preset's first row, the best of the rounds.\n\n"
        + benchlib.markdown_table(["preset", "trainings", "threads each", "pairs/s each", "pairs/s in all",
                                   "x one at a time"], rows) + "\n"
    )
    benchlib.report(SECTION if args.arch == "rnnsearch" else f"{SECTION}_{args.arch}", text, args.write)


if __name__ == "__main__":
    main()
