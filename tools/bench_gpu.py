"""Annotate and train on one device, with the figures that decide the scale settings.

    python tools/bench_gpu.py --write                      # on a machine with a CUDA GPU
    python tools/bench_gpu.py --device cpu --preset small  # the same measurements on the CPU

* annotate -- `phrase-scorer annotate` end to end on the first --lines lines of the table (the
              whole table by default) with a --preset model (--trained MODEL, or the preset's
              initial weights), once per --batch-tokens value: lines/s, and on a GPU the share
              of the run during which the GPU was busy (nvidia-smi's utilisation, sampled every
              200 ms; n/a where nvidia-smi is absent). Whether the outputs of the batch sizes hold
              the same lines is checked and printed.
* rescore  -- `phrase-scorer rescore NBEST --source SRC` on the device, once per
              --rescore-batch-tokens value, with a forward model (--forward DIR), a reverse model
              (--reverse DIR) and an ensemble (--ensemble DIR,DIR: what a reranker's ensemble
              feature runs): hypotheses/s and GPU busy (start-up and loading included), the
              largest difference between the batch sizes' scores, and between the device's
              scores and the CPU's (the same command with --device cpu) over the first
              --cpu-sentences sentences.
* sentences -- `phrase-scorer train --corpus SRC TGT --arch rnnsearch --preset P` alone for
              --steps updates with one validation at the end (the sentence models' recipe:
              --corpus-batch-size pairs per update): updates/s and the seconds per 500 updates
              with a validation, which times a sentence model's training.
* train    -- `phrase-scorer train --preset P` once per --batch-sizes value, each for the same
              number of training pairs (--pairs) with a validation every --valid-pairs-every
              pairs: training pairs/s (the same validations in every run, their time included:
              the log's ``train_seconds``), and the validation NLL per token
              against pairs seen and against training time, so that a larger batch is kept only
              where it learns at least as well per pair as the paper's 64.

Each run is its own process. The section written into docs/benchmarks.md names the device.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
from bench_annotate import make_model_dir  # noqa: E402


class BusySampler:
    """The mean utilisation (%) nvidia-smi reports for GPU ``index`` while the block runs; None
    where nvidia-smi is absent or the device is not a GPU."""

    def __init__(self, device: str, index: int = 0) -> None:
        self.enabled = device.startswith("cuda") and shutil.which("nvidia-smi") is not None
        self.index = index
        self.samples: List[float] = []

    def __enter__(self) -> "BusySampler":
        if self.enabled:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200",
                 "-i", str(self.index)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._proc.terminate()
            self._proc.wait()
            self._reader.join(timeout=5)

    @property
    def busy(self) -> Optional[float]:
        return sum(self.samples) / len(self.samples) if self.samples else None


def percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def annotate(args, work: Path) -> str:
    table = Path(args.table)
    if args.lines:
        table = benchlib.table_head(table, args.lines, work)
    model = Path(args.trained) if args.trained else make_model_dir(
        work / f"{args.preset}-initial", args.preset, Path(args.table), work / "counts.json")
    rows, outputs = [], []
    for tokens in [int(t) for t in args.batch_tokens.split(",")]:
        out = work / f"annotated-{tokens}.gz"
        with BusySampler(args.device) as sampler:
            _, _, seconds, peak = benchlib.run_measured(benchlib.phrase_scorer_command(
                "annotate", table, "-m", model, "-o", out, "--device", args.device, "--batch-tokens", tokens,
                *(["--threads", args.threads] if args.threads else [])))
        lines = json.loads(Path(str(out) + ".json").read_text())["lines"]
        rows.append([f"{tokens:,}", f"{lines:,}", f"{seconds:.1f}", f"**{lines / seconds:,.0f}**",
                     percent(sampler.busy), f"{peak:,.0f}"])
        outputs.append(out)
        print(rows[-1], flush=True)
    same = all(benchlib.same_lines(outputs[0], other) for other in outputs[1:])
    weights = "trained" if args.trained else "initial"
    return (
        f"`phrase-scorer annotate {table.name} -m MODEL -o OUT.gz --device {args.device} --batch-tokens N`, MODEL the "
        f"`{args.preset}` preset ({weights} weights), fp32. *GPU busy*: mean of nvidia-smi's utilisation during the "
        f"run. The outputs of the batch sizes hold "
        f"{'the same lines' if same else 'lines that differ in the last digits'}.\n\n"
        + benchlib.markdown_table(["batch tokens", "lines", "seconds", "lines/s", "GPU busy", "peak RSS MB"], rows)
        + "\n"
    )


def last_feature(line: str) -> float:
    """The value of the last dense feature of an n-best line (the one ``rescore`` appended)."""
    return float(line.split(" ||| ")[2].split()[-1])


def feature_differences(a: Path, b: Path) -> List[float]:
    """|a - b| of the appended feature, line by line, over the lines both gzip lists have."""
    import gzip

    with gzip.open(a, "rt", encoding="utf-8") as x, gzip.open(b, "rt", encoding="utf-8") as y:
        return [abs(last_feature(p) - last_feature(q)) for p, q in zip(x, y)]


def rescore(args, work: Path) -> str:
    from bench_rescore import nbest_head, open_text

    if not (args.nbest and args.source and (args.forward or args.reverse or args.ensemble)):
        raise SystemExit("--parts rescore needs --nbest, --source and a model (--forward, --reverse or --ensemble)")
    nbest, source = Path(args.nbest), Path(args.source)
    head, head_source, _, _ = nbest_head(nbest, source, args.cpu_sentences, work)
    with open_text(nbest) as lines:
        hypotheses = sum(1 for _ in lines)  # rescore writes one line per line
    sets = []
    if args.forward:
        sets.append(("forward", ["-m", args.forward]))
    if args.reverse:
        sets.append(("reverse", ["-r", args.reverse]))
    if args.ensemble:
        members = [arg for d in args.ensemble.split(",") for arg in ("-m", d)]
        sets.append((f"ensemble of {len(members) // 2}", [*members, "--ensemble", "ensemble"]))
    rows, notes = [], []
    for label, models in sets:
        outputs = []
        for tokens in [int(t) for t in args.rescore_batch_tokens.split(",")]:
            out = work / f"rescored-{label.split()[0]}-{tokens}.gz"
            with BusySampler(args.device) as sampler:
                _, _, seconds, peak = benchlib.run_measured(benchlib.phrase_scorer_command(
                    "rescore", nbest, "--source", source, *models, "-o", out, "--device", args.device,
                    "--batch-tokens", tokens, "--overwrite"))
            rows.append([label, f"{tokens:,}", f"{hypotheses:,}", f"{seconds:.1f}", f"**{hypotheses / seconds:,.0f}**",
                         percent(sampler.busy), f"{peak:,.0f}"])
            outputs.append(out)
            print(rows[-1], flush=True)
        between = max([0.0, *(d for other in outputs[1:] for d in feature_differences(outputs[0], other))])
        cpu = work / f"cpu-{label.split()[0]}.gz"
        benchlib.run_measured(benchlib.phrase_scorer_command(
            "rescore", head, "--source", head_source, *models, "-o", cpu, "--device", "cpu", "--overwrite"))
        differences = feature_differences(cpu, outputs[-1])  # the head's lines only
        notes.append(f"{label}: the batch sizes' scores differ by at most {between:.2g} nats; over the "
                     f"first {args.cpu_sentences} sentences ({len(differences):,} hypotheses) the device's log p "
                     f"differs from the CPU's by at most {max(differences):.2g} nats "
                     f"(mean {sum(differences) / len(differences):.2g}; the feature is written with 6 significant "
                     f"digits)")
    return (
        f"`phrase-scorer rescore {nbest.name} --source {source.name} MODELS -o OUT.gz --device {args.device} "
        f"--batch-tokens N` (fp32), start-up and loading included. *GPU busy*: mean of nvidia-smi's utilisation "
        f"during the run.\n\n"
        + benchlib.markdown_table(["models", "batch tokens", "hypotheses", "seconds", "hypotheses/s", "GPU busy",
                                   "peak RSS MB"], rows)
        + "\n\n" + "; ".join(notes) + ".\n"
    )


def sentences(args, work: Path) -> str:
    if not args.corpus:
        raise SystemExit("--parts sentences needs --corpus SRC TGT")
    out = work / "sentences"
    source, target = args.corpus
    with BusySampler(args.device) as sampler:
        benchlib.run_measured(benchlib.phrase_scorer_command(
            "train", "--corpus", source, target, *(["--dev", *args.dev] if args.dev else []), "--arch", "rnnsearch",
            "--preset", args.preset, "--batch-size", args.corpus_batch_size, "--max-steps", args.steps,
            "--valid-every", args.steps, "--device", args.device, "--precision", args.train_precision,
            "--seed", 1, "-o", out, "--overwrite", *(["--threads", args.threads] if args.threads else [])))
    records = [json.loads(line) for line in (out / "train.log.jsonl").read_text().splitlines()]
    last = records[-1]
    per_500 = last["train_seconds"] * 500 / last["step"]
    return (
        f"`phrase-scorer train --corpus {Path(source).name} {Path(target).name} --arch rnnsearch --preset "
        f"{args.preset} --batch-size {args.corpus_batch_size} --max-steps {args.steps} --valid-every {args.steps} "
        f"--device {args.device} --precision {args.train_precision}`, alone on the machine: {last['step']:,} updates "
        f"and one validation (NLL and the BLEU of greedy translations of the dev set) in "
        f"{last['train_seconds']:.1f} s (the log's `train_seconds`), **{per_500:.0f} s per 500 updates** "
        f"with a validation, so about {per_500 * 16 / 60:.0f} minutes for the 8,000 updates of the sentence "
        f"models' recipe; GPU busy {percent(sampler.busy)}.\n"
    )


def train(args, work: Path) -> str:
    curves: Dict[int, List[dict]] = {}
    rates: Dict[int, float] = {}
    busy: Dict[int, Optional[float]] = {}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        out = work / f"train-{batch}"
        steps = math.ceil(args.pairs / batch)
        every = max(1, round(args.valid_pairs_every / batch))
        with BusySampler(args.device) as sampler:
            benchlib.run_measured(benchlib.phrase_scorer_command(
                "train", args.table, "-o", out, "--preset", args.preset, "--device", args.device, "--batch-size", batch,
                "--max-steps", steps, "--valid-every", every, "--patience", 10**6, "--seed", 1, "--overwrite",
                *(["--threads", args.threads] if args.threads else [])))
        records = [json.loads(line) for line in (out / "train.log.jsonl").read_text().splitlines()]
        curves[batch] = records
        rates[batch] = records[-1]["pairs_seen"] / max(records[-1]["train_seconds"], 1e-9)
        busy[batch] = sampler.busy
        print(batch, f"{rates[batch]:,.0f} pairs/s", [round(r["valid_nll_token"], 3) for r in records], flush=True)
        shutil.rmtree(out / "cache", ignore_errors=True)

    batches = sorted(curves)
    # the validation NLL at the same pairs seen (the points every batch size validated at, nearly)
    checkpoints = [r["pairs_seen"] for r in curves[batches[0]]]
    rows = []
    for pairs in checkpoints:
        row = [f"{pairs:,}"]
        for batch in batches:
            near = min(curves[batch], key=lambda r: abs(r["pairs_seen"] - pairs))
            row.append(f"{near['valid_nll_token']:.3f}")
        rows.append(row)
    # and at the same training time: the longest time every run reached
    common = min(curves[b][-1]["train_seconds"] for b in batches)
    at_time = []
    for batch in batches:
        reached = [r for r in curves[batch] if r["train_seconds"] <= common * 1.001]
        last = reached[-1] if reached else curves[batch][0]
        at_time.append(f"{last['valid_nll_token']:.3f}")
    speed = [[f"{b:,}", f"**{rates[b]:,.0f}**", percent(busy[b]), f"{curves[b][-1]['valid_nll_token']:.3f}"]
             for b in batches]
    return (
        f"`phrase-scorer train {Path(args.table).name} --preset {args.preset} --device {args.device} --batch-size B` "
        f"for {args.pairs:,} training pairs per batch size (seed 1), a validation every {args.valid_pairs_every:,} "
        f"pairs. *pairs/s*: training pairs per second of the run (the log's `train_seconds`: the same validations and "
        f"checkpoints in every run, their time included).\n\n"
        + benchlib.markdown_table(["batch size", "pairs/s", "GPU busy", f"valid NLL/token after {args.pairs:,} pairs"],
                                  speed)
        + "\n\nValidation NLL per token against training pairs seen:\n\n"
        + benchlib.markdown_table(["pairs seen", *[f"batch {b}" for b in batches]], rows)
        + f"\n\nAt the same training time ({common:,.0f} s, the shortest run's): "
        + ", ".join(f"batch {b}: {v}" for b, v in zip(batches, at_time)) + ".\n"
    )


def main() -> None:
    parser, _ = benchlib.bench_parser(__doc__)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--preset", default="paper", choices=["paper", "small", "tiny"])
    parser.add_argument("--trained", default=None, metavar="MODEL", help="annotate with this trained model")
    parser.add_argument("--lines", type=int, default=None, help="annotate the first N lines only")
    parser.add_argument("--batch-tokens", default="8192,32768,131072")
    parser.add_argument("--batch-sizes", default="64,256,1024")
    parser.add_argument("--pairs", type=int, default=2_000_000, help="training pairs per batch size")
    parser.add_argument("--valid-pairs-every", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--nbest", default=None, help="rescore: a Moses n-best list")
    parser.add_argument("--source", default=None, help="rescore: its source sentences")
    parser.add_argument("--forward", default=None, metavar="DIR", help="rescore: a forward model")
    parser.add_argument("--reverse", default=None, metavar="DIR", help="rescore: a reverse model")
    parser.add_argument("--ensemble", default=None, metavar="DIR,DIR", help="rescore: an ensemble's models")
    parser.add_argument("--rescore-batch-tokens", default="8192,65536")
    parser.add_argument("--cpu-sentences", type=int, default=50, help="rescore: sentences compared with the CPU")
    parser.add_argument("--corpus", nargs=2, default=None, metavar=("SRC", "TGT"), help="sentences: training pairs")
    parser.add_argument("--dev", nargs=2, default=None, metavar=("SRC", "TGT"), help="sentences: validation pairs")
    parser.add_argument("--steps", type=int, default=500, help="sentences: updates")
    parser.add_argument("--corpus-batch-size", type=int, default=80, help="sentences: pairs per update")
    parser.add_argument("--train-precision", default="fp32", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--parts", default="annotate,train")
    args = parser.parse_args()
    info = benchlib.machine()
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device here: run on a GPU machine, or pass --device cpu")
        where = f"{torch.cuda.get_device_name(torch.device(args.device))}, {info['cores']} CPU cores"
    else:
        where = f"CPU: {info['cpu']}, {info['cores']} cores"
    parts = {"annotate": ("Annotate", annotate), "rescore": ("Rescore n-best lists", rescore),
             "sentences": ("Train a sentence model", sentences),
             "train": ("Train: batch size, speed and learning", train)}
    with benchlib.work_dir(args.work_dir, "bench-gpu-") as work:
        for part in args.parts.split(","):
            title, measure = parts[part]
            body = measure(args, work)
            kind = "gpu" if args.device.startswith("cuda") else "cpu"
            benchlib.report(f"bench_device_{kind}_{part}",
                            f"## {title} on {where} (`tools/bench_gpu.py --device {args.device} --parts {part}`)\n\n"
                            f"torch {info['torch']}.\n\n{body}", args.write)


if __name__ == "__main__":
    main()
