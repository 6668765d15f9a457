#!/usr/bin/env python3
"""Learning curves: dev BLEU against training time, by recipe, for RNNsearch ``small`` on the
29,000 Multi30k sentence pairs (en->fr, or --direction), and the test BLEU of the best weights with beam 5.

    python tools/bench_learning.py train --recipe modern --minutes 96 --work-dir W   # one run per call
    python tools/bench_learning.py train --recipe paper --minutes 96 --work-dir W
    python tools/bench_learning.py report --work-dir W [--idle-from W/idle] [--write]

``train`` runs ``phrase-scorer train --corpus ... --dev val ... --arch rnnsearch --preset small
--batch-size 80 --valid-every N --max-time M --recipe R`` (plus any ``--set NAME=VALUE`` of the
ablation) into ``W/<label>``; the training log has a line per validation with the step, the
training time (validations included) and the dev BLEU (greedy). ``report`` reads the logs,
translates test 2016 with the best weights (beam 5) and prints the curves, the ablation and the
machine into docs/benchmarks.md ("Learning").

Times: a run on an otherwise idle machine is reported as measured. A run that shared the cores
with other work is converted to idle time with ``--idle-from RUN=DIR``: the training log of a short
run of the same command on the idle machine gives the idle seconds per validation interval
(``--valid-every`` steps and one validation), and validation k of the loaded run is placed at k
such intervals. A model's weights at step k do not depend on the load, only its speed does.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, machine, markdown_table, phrase_scorer_command, report  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "multi30k-en-fr"
# (minutes, val BLEU) of the reference curve
PEER = [(21.6, 0.7), (40.6, 27.9), (57.2, 42.5), (77.0, 50.5), (96.3, 52.5)]
CHECKPOINTS_MIN = [20, 30, 41, 57, 77, 96]


def corpus_args(data: Path, direction: str) -> List[str]:
    src, tgt = direction.split("-")
    return ["--corpus", data / f"train.tok.{src}.gz", data / f"train.tok.{tgt}.gz",
            "--dev", data / f"val.tok.{src}.gz", data / f"val.tok.{tgt}.gz"]


def train_run(args) -> None:
    out = Path(args.work_dir) / args.label
    extra = []
    for setting in args.set:
        name, value = setting.split("=", 1)
        extra += [f"--{name}", value]
    command = phrase_scorer_command(
        "train", *corpus_args(Path(args.data), args.direction), "--arch", "rnnsearch", "--preset", "small",
        "--batch-size", 80, "--valid-every", args.valid_every, "--recipe", args.recipe, "--threads", args.threads,
        "--processes", args.processes, *extra,
        *(["--max-time", f"{args.minutes}m"] if args.minutes else []),
        *(["--max-steps", args.max_steps] if args.max_steps else []), "-o", out, "--resume")
    (Path(args.work_dir)).mkdir(parents=True, exist_ok=True)
    (out.parent / f"{args.label}.command.json").write_text(json.dumps([str(c) for c in command]) + "\n")
    run = subprocess.run(command)
    if run.returncode == 130:
        print(f"{out}: stopped with a checkpoint; the same command goes on from it", file=sys.stderr)
    elif run.returncode:
        raise SystemExit(run.returncode)


def read_log(run: Path) -> List[dict]:
    return [json.loads(line) for line in (run / "train.log.jsonl").read_text().splitlines() if line.strip()]


def idle_interval_seconds(idle_run: Path) -> float:
    """Idle seconds per validation interval, from the log of a short idle run (its first
    interval left out: it holds the start-up)."""
    records = read_log(idle_run)
    if len(records) < 3:
        raise SystemExit(f"{idle_run}: an idle run needs at least 3 validations")
    times = [r["train_seconds"] for r in records]
    return (times[-1] - times[0]) / (len(times) - 1)


def curve(run: Path, interval: Optional[float]) -> List[dict]:
    """(minutes, step, dev BLEU, dev NLL) of each validation; minutes converted with ``interval``."""
    out = []
    for k, record in enumerate(read_log(run), 1):
        seconds = k * interval if interval else record["train_seconds"]
        out.append({"minutes": seconds / 60, "step": record["step"], "bleu": record.get("valid_bleu"),
                    "nll": record["valid_nll_token"]})
    return out


def bleu_at(points: List[dict], minutes: float) -> Optional[float]:
    """The best dev BLEU reached by ``minutes`` (what early stopping would have kept), or None."""
    reached = [p["bleu"] for p in points if p["minutes"] <= minutes and p["bleu"] is not None]
    return max(reached) if reached and points[-1]["minutes"] >= minutes else None


def bleu_cell(points: List[dict], minutes: float) -> str:
    """The table's cell for ``minutes``: the best dev BLEU by then; for a run stopped earlier,
    "≥ B" with B its best (model.pt keeps the best weights, so longer training keeps at least B)."""
    at = bleu_at(points, minutes)
    if at is not None:
        return f"{at:.1f}"
    reached = [p["bleu"] for p in points if p["bleu"] is not None]
    return f"≥ {max(reached):.1f}" if reached and points[-1]["minutes"] < minutes else ""


def test_bleu(run: Path, data: Path, direction: str, beam: int = 5) -> float:
    from phrase_scorer.moses.evaluate import score

    src, tgt = direction.split("-")
    hypotheses = run / f"test2016.beam{beam}.{tgt}"
    if not hypotheses.exists() or hypotheses.stat().st_mtime_ns < (run / "model.pt").stat().st_mtime_ns:
        subprocess.run(phrase_scorer_command("translate", "-m", run, "--beam", beam,
                                             data / f"test_2016_flickr.tok.{src}.gz", "-o", hypotheses, "--overwrite"),
                       check=True)
    import gzip

    with gzip.open(data / f"test_2016_flickr.tok.{tgt}.gz", "rt", encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]
    return score(hypotheses.read_text(encoding="utf-8").splitlines(), references, kind="tokenized").bleu


def changed_settings(work: Path, run: Path) -> List[str]:
    """The ``--set`` options of a run's command (what an ablation changed), as ``--name value``."""
    command_file = work / f"{run.name}.command.json"
    if not command_file.exists():
        return []
    command = json.loads(command_file.read_text())
    changed, i = [], command.index("train") + 1
    standard = {"--corpus": 2, "--dev": 2, "--arch": 1, "--preset": 1, "--batch-size": 1, "--valid-every": 1,
                "--recipe": 1, "--threads": 1, "--max-time": 1, "--max-steps": 1, "-o": 1, "--resume": 0}
    while i < len(command):
        option = command[i]
        if option in standard:
            i += 1 + standard[option]
        else:
            changed.append(f"{option} {command[i + 1]}")
            i += 2
    return changed


def ablation_rows(work: Path, runs: List[Path], baseline: str = "modern") -> tuple:
    """Each run that changed settings against ``baseline``, at the last step they all reached."""
    ablations = [run for run in runs if changed_settings(work, run)]
    base = next((run for run in runs if run.name == baseline), None)
    if not ablations or base is None:
        return None, []
    logs = {run.name: {r["step"]: r for r in read_log(run)} for run in [base, *ablations]}
    common = set.intersection(*(set(log) for log in logs.values()))
    if not common:
        return None, []
    step = max(common)
    rows = []
    for run in [base, *ablations]:
        record = logs[run.name][step]
        rows.append([run.name, ", ".join(changed_settings(work, run)) or f"the `{baseline}` recipe",
                     f"{record.get('valid_bleu', float('nan')):.2f}", f"{record['valid_nll_token']:.3f}",
                     f"{record['valid_margin_pair']:.1f}"])
    return step, rows


def report_runs(args) -> None:
    work = Path(args.work_dir)
    idle_runs = dict(item.split("=", 1) for item in args.idle_from)  # run name -> its idle run
    intervals = {name: idle_interval_seconds(Path(path)) for name, path in idle_runs.items()}
    every_run = sorted(p.parent for p in work.glob("*/train.log.jsonl") if p.parent.name != "idle")
    ablation_step, ablation = ablation_rows(work, every_run)
    runs = [run for run in every_run if not changed_settings(work, run)]
    header = ["run", *[f"{m} min" for m in CHECKPOINTS_MIN], "steps", "test 2016 (beam 5)"]
    rows = [["reference curve (peer toolkit, same data and CPU kind)",
             *[next((f"{b}" for m2, b in PEER if abs(m2 - m) < 1.5), "") for m in CHECKPOINTS_MIN], "", "55.5"]
            ] if args.direction == "en-fr" else []  # the peer's curve is en->fr
    for run in runs:
        points = curve(run, intervals.get(run.name))
        cells = [bleu_cell(points, m) for m in CHECKPOINTS_MIN]
        test = f"{test_bleu(run, Path(args.data), args.direction):.2f}" if args.test else ""
        rows.append([run.name, *cells, points[-1]["step"] if points else 0, test])
    detail = []
    for run in runs:
        detail += [[run.name, p["step"], f"{p['minutes']:.1f}", f"{p['bleu']:.2f}" if p["bleu"] is not None else "",
                    f"{p['nll']:.3f}"] for p in curve(run, intervals.get(run.name))]
    info = machine()
    shared = [run.name for run in runs if run.name in args.shared and run.name not in intervals]
    timing = "; ".join([f"`{name}`: idle time from a run of the same command alone on the machine "
                        f"({intervals[name]:.0f} s per validation interval)" for name in intervals]
                       + [f"`{name}`: training time measured beside other work (validations included), "
                          "not an idle figure" for name in shared]
                       + (["other runs: training time as measured alone on the machine (validations included)"]
                          if len(shared) + len(intervals) < len(runs) else []))
    markdown = "\n".join([
        "## Learning: dev BLEU against training time (`tools/bench_learning.py`)" if args.direction == "en-fr" else
        f"## Learning, {args.direction.replace('-', '→')} (`tools/bench_learning.py --direction {args.direction}`)",
        "",
        "Dev BLEU (val 2016, greedy, tokenised) reached by each training time: RNNsearch `small`, "
        f"{args.direction.replace('-', '→')}, 29,000 Multi30k pairs, batch 80, {info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}; {timing}.",
        "",
        markdown_table(header, rows),
        "",
        "A cell \"≥ B\": the run was stopped before that time; model.pt keeps its best weights (dev BLEU B, "
        "what early stopping would keep), so training on keeps at least B. Test 2016 is translated with model.pt.",
        "",
        *([f"Ablation: each run changes one setting of `modern` (`train --recipe modern` plus the option shown) and "
           f"is compared with `modern` after the same {ablation_step:,} updates (the same batches; a model's "
           "weights at an update do not depend on the machine's load). Dev BLEU greedy; margin: mean log p(true) "
           "- log p(shuffled) per dev pair.", "",
           markdown_table(["run", "setting", f"dev BLEU at step {ablation_step:,}", "dev NLL/token", "margin"],
                          ablation),
           ""] if ablation else []),
        "Every validation:",
        "",
        markdown_table(["run", "step", "minutes", "dev BLEU", "dev NLL/token"], detail),
        "",
        f"Command: `python tools/bench_learning.py report --work-dir {args.work_dir}"
        + "".join(f" --idle-from {item}" for item in args.idle_from)
        + (f" --direction {args.direction}" if args.direction != "en-fr" else "")
        + "".join(f" --shared {name}" for name in args.shared) + " --test` after one `train` call per run.",
    ])
    report("learning" if args.direction == "en-fr" else f"learning-{args.direction}", markdown, args.write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--recipe", default="modern")
    t.add_argument("--label", default=None, help="run folder name [default: the recipe]")
    t.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="another train option (ablation)")
    t.add_argument("--minutes", type=float, default=None)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--valid-every", type=int, default=500)
    t.add_argument("--threads", type=int, default=2, help="threads per process")
    t.add_argument("--processes", type=int, default=1, help="train --processes (2 on a 2-core CPU with --threads 1)")
    t.add_argument("--direction", default="en-fr")
    t.add_argument("--data", default=str(DATA), help="folder of the tokenised Multi30k files")
    t.add_argument("--work-dir", required=True)
    r = sub.add_parser("report")
    r.add_argument("--work-dir", required=True)
    r.add_argument("--idle-from", action="append", default=[], metavar="RUN=DIR",
                   help="convert RUN's validations to idle time with the log of DIR, a run of the same command alone "
                        "on the machine")
    r.add_argument("--direction", default="en-fr")
    r.add_argument("--shared", action="append", default=[], metavar="RUN",
                   help="a run timed beside other work: its times are reported as such, not as idle")
    r.add_argument("--data", default=str(DATA))
    r.add_argument("--test", action="store_true", help="also translate test 2016 with each run's best weights")
    r.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.command == "train":
        args.label = args.label or args.recipe
        train_run(args)
    else:
        report_runs(args)


if __name__ == "__main__":
    main()
