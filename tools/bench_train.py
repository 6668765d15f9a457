#!/usr/bin/env python3
"""Benchmark `phrase-scorer train`: throughput, what a short CPU run learns, and memory.

--throughput  for each preset, training pairs/s on the table (after a warm-up), the analytic
              training FLOPs per pair (forward + backward = 3 x forward) and their share of the
              fp32 matmul rate measured in the same process.
--learning    trains the `small` preset on the whole table for --minutes (default 30) with each
              recipe of --recipes (one after the other, or --side-by-side on one core each) and
              reports, at equal training time, the held-out validation NLL per token, the
              perplexity and the margin between true held-out pairs and the same sources with
              shuffled targets.
--processes   `phrase-scorer train` under torchrun with 1 and with 2 CPU processes (gloo, one
              thread each) in the same run, same global batch: training pairs/s from the
              training log (second validation interval, after warm-up) and their ratio.
--sentences   RNNsearch `small` on the Multi30k sentence pairs: training pairs/s and target
              tokens/s, and their FLOPs' share of the matmul rate measured in the same run, by
              processes x threads x batch size (--sentence-configs).
--memory      peak RSS of `phrase-scorer train` (word counts, pair cache, 200 steps) on the table
              and on the table repeated ten times.

Results go to docs/benchmarks.md with --write.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib  # noqa: E402

HERE = Path(__file__).resolve()
STEPS = {"tiny": 300, "small": 150, "paper": 12}


def worker(args) -> None:
    """Time training steps of one preset (a separate process per preset)."""
    import numpy as np
    import torch

    from phrase_scorer.config import TrainConfig
    from phrase_scorer.data.cache import PairSet
    from phrase_scorer.models.encdec import forward_flops
    from phrase_scorer.training.run import train
    from phrase_scorer.model_dir import ModelDirectory

    torch.set_num_threads(args.threads or os.cpu_count())
    out = Path(args.out)
    # builds vocabularies and the pair cache, then a few warm-up steps
    train(args.table, out, TrainConfig(preset=args.preset, max_steps=3, valid_pairs=1000, valid_every=10**6),
          overwrite=True)
    from phrase_scorer.data.batches import BatchSampler

    loaded = ModelDirectory(out).load(weights="checkpoint.pt")
    model = loaded.model.train()
    pairs = PairSet(out / "cache", "train")
    sampler = BatchSampler(pairs, 64, seed=1)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-6)
    batches = sampler.epoch(0)
    lengths = []

    def step():
        batch = next(batches)
        src, src_len, tgt, tgt_len = pairs.batch_arrays(batch)
        lengths.append((src_len.mean(), tgt_len.mean()))
        loss = -model(*[torch.as_tensor(a) for a in (src, src_len, tgt, tgt_len)]).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for _ in range(3):
        step()
    lengths.clear()
    rate = benchlib.matmul_rate()
    steps = STEPS[args.preset]
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - start
    src_len, tgt_len = np.mean(lengths, axis=0)
    flops = 3 * forward_flops(model.config, len(loaded.target_vocab), src_len, tgt_len)["total"]
    pairs_per_second = steps * 64 / seconds
    print(json.dumps({
        "preset": args.preset, "pairs_per_second": pairs_per_second, "train_pairs": len(pairs),
        "train_mflops_per_pair": flops / 1e6, "matmul_gflops": rate / 1e9,
        "share_of_matmul": flops * pairs_per_second / rate,
        "epoch_hours": len(pairs) / pairs_per_second / 3600,
        "parameters": sum(p.numel() for p in model.parameters()),
    }))


def throughput(args, work: Path) -> str:
    rows = []
    for preset in args.presets.split(","):
        out, _, _, _ = benchlib.run_measured(benchlib.python_command(
            HERE, "worker", "--table", args.table, "--preset", preset, "--out", work / preset,
            *(["--threads", args.threads] if args.threads else [])))
        r = json.loads(out.strip().splitlines()[-1])
        print(json.dumps(r), flush=True)
        rows.append([preset, f"{r['parameters']:,}", f"{r['pairs_per_second']:,.0f}",
                     f"{r['train_mflops_per_pair']:.3g}", f"{r['matmul_gflops']:.0f}", f"{r['share_of_matmul']:.2f}",
                     f"{r['epoch_hours']:.2f}"])
    info = benchlib.machine()
    return (
        "## Train: throughput (`tools/bench_train.py --throughput`)\n\n"
        f"Training steps of 64 pairs on `{Path(args.table).name}`, CPU ({info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}, fp32). FLOPs per pair: 3 x the analytic forward FLOPs at the batches' mean "
        "lengths; *share*: of the fp32 matmul rate measured in the same process.\n\n"
        + benchlib.markdown_table(["preset", "parameters", "pairs/s", "train MFLOP/pair", "matmul GFLOP/s", "share",
                                   "hours per epoch"], rows) + "\n"
    )


def learning_run(args, out: Path, recipe: str) -> dict:
    """One `train` run of the `small` preset for --minutes with ``recipe``: its log, config and cost."""
    threads = learning_threads(args)
    command = benchlib.phrase_scorer_command(
        "train", args.table, "-o", out, "--preset", "small", "--recipe", recipe, "--max-time", f"{args.minutes}m",
        "--overwrite", *(["--threads", threads] if threads else []))
    _, _, seconds, peak = benchlib.run_measured(command)
    records = [json.loads(l) for l in (out / "train.log.jsonl").read_text().splitlines() if l.strip()]
    return {"recipe": recipe, "records": records, "seconds": seconds, "peak": peak,
            "config": json.loads((out / "config.json").read_text())}


def learning_threads(args) -> Optional[int]:
    """Threads per run: --threads, else one each when the runs share the machine side by side."""
    return args.threads or (1 if args.side_by_side else None)


def at_minutes(records: List[dict], minutes: float) -> Optional[dict]:
    """The last validation at or before ``minutes`` of training time."""
    before = [r for r in records if r["train_seconds"] <= minutes * 60 + 1e-6]
    return before[-1] if before else None


def learning(args, work: Path) -> str:
    """Each recipe of --recipes trained for the same --minutes: one after the other with the
    whole machine, or (--side-by-side) at the same time, one core each."""
    base = Path(args.model_out) if args.model_out else work
    recipes = args.recipes.split(",")
    jobs = [(base / recipe, recipe) for recipe in recipes]
    if args.side_by_side:
        with ThreadPoolExecutor(len(jobs)) as pool:
            runs = list(pool.map(lambda job: learning_run(args, *job), jobs))
    else:
        runs = [learning_run(args, *job) for job in jobs]
    info = benchlib.machine()
    threads = learning_threads(args)
    how = ("side by side, one thread each, nothing else running" if args.side_by_side else
           "one after the other, nothing else running") + (f", {threads} thread(s) per run"
                                                          if threads and not args.side_by_side else "")
    command = ["phrase-scorer", "train", Path(args.table).name, "-o", "MODEL", "--preset", "small",
               "--recipe", "RECIPE", "--max-time", f"{args.minutes}m",
               *(["--threads", str(threads)] if threads else [])]
    config = runs[0]["config"]
    text = (
        f"## Train: what {args.minutes} CPU minutes learn (`tools/bench_train.py --learning`)\n\n"
        f"Command: `python tools/bench_train.py --learning --recipes {args.recipes} --minutes {args.minutes}"
        f"{' --side-by-side' if args.side_by_side else ''}{f' --threads {args.threads}' if args.threads else ''} "
        f"--write`, which runs `{' '.join(command)}` for each recipe ({how}) on this machine "
        f"({info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}): {config['table']['unique_pairs']:,} unique pairs, shortlists of "
        f"{config['source_vocab_size'] - 3:,} source and {config['target_vocab_size'] - 3:,} target words. Validation: "
        "about 5,000 pairs whose sources never occur in training, scored without dropout or label smoothing. "
        "*margin*: mean log p(true target | source) - log p(another validation pair's target | source), in nats "
        "per pair; *true wins*: share of pairs where the true target scores higher.\n\n"
    )
    marks = [m for m in (2, 5, 10, 15, 20, 25, 30, 45, 60, 90, 120) if m <= args.minutes]
    if not marks or marks[-1] != args.minutes:
        marks.append(args.minutes)
    rows = []
    for minutes in marks:
        row = [minutes]
        for run in runs:
            r = at_minutes(run["records"], minutes)
            row += ([f"{r['valid_nll_token']:.3f}", f"{r['valid_margin_pair']:.2f}",
                     f"{100 * r['valid_true_beats_shuffled']:.1f}%"] if r else ["", "", ""])
        rows.append(row)
    header = ["minutes"]
    for run in runs:
        header += [f"{run['recipe']} NLL/token", f"{run['recipe']} margin", f"{run['recipe']} true wins"]
    text += ("At equal training time (the last validation at or before each mark):\n\n"
             + benchlib.markdown_table(header, rows) + "\n")
    for run in runs:
        records = run["records"]
        best = min(records, key=lambda r: r["valid_nll_token"])
        last = records[-1]
        pairs_per_second = last["pairs_seen"] / max(last["train_seconds"], 1e-9)
        every = 5 * records[0]["step"]
        table = [[r["step"], f"{r['pairs_seen']:,}", f"{r['train_seconds'] / 60:.1f}", f"{r['valid_nll_pair']:.2f}",
                  f"{r['valid_nll_token']:.3f}", f"{r['valid_ppl']:.1f}", f"{r['valid_margin_pair']:.2f}",
                  f"{100 * r['valid_true_beats_shuffled']:.1f}%"]
                 for r in records if r is records[0] or r is best or r is last or r["step"] % every == 0]
        text += (
            f"\n`--recipe {run['recipe']}`:\n\n"
            + benchlib.markdown_table(["step", "pairs seen", "minutes", "valid NLL/pair", "valid NLL/token",
                                       "perplexity", "margin (nats)", "true wins"], table)
            + f"\n\nBest: validation NLL {best['valid_nll_token']:.3f} per token (perplexity {best['valid_ppl']:.1f}), "
            f"margin {best['valid_margin_pair']:.2f} nats per pair; {pairs_per_second:,.0f} training pairs/s "
            f"({run['seconds'] / 60:.0f} minutes of wall time in all, counting words and writing the pair cache "
            f"included; peak RSS {run['peak']:,.0f} MB).\n"
        )
    return text


PROCESS_STEPS = {"tiny": 200, "small": 40, "paper": 6}


def processes(args, work: Path) -> str:
    """Training pairs/s with 1 and 2 torchrun processes on the CPU, one thread each."""
    rows = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent.parent)}
    for preset in args.presets.split(","):
        steps = PROCESS_STEPS[preset]
        rates = {}
        for n in (1, 2):
            out = work / f"processes-{preset}-{n}"
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                       "-m", "phrase_scorer", "-q", "train", args.table, "-o", str(out), "--preset", preset,
                       "--batch-size", "64", "--valid-pairs", "1000", "--valid-every", str(steps),
                       "--max-steps", str(2 * steps), "--threads", "1", "--overwrite"]
            _, err, _, _ = benchlib.run_measured(command, env=env)
            records = [json.loads(l) for l in (out / "train.log.jsonl").read_text().splitlines()]
            if len(records) < 2:
                raise SystemExit(f"training with {n} processes left no second record: {err[-2000:]}")
            rates[n] = records[1]["pairs_per_second"]
            print(json.dumps({"preset": preset, "processes": n, "pairs_per_second": rates[n]}), flush=True)
            shutil.rmtree(out, ignore_errors=True)
        rows.append([preset, f"{rates[1]:,.0f}", f"{rates[2]:,.0f}", f"{rates[2] / rates[1]:.2f}"])
    info = benchlib.machine()
    return (
        f"## Train: 2 processes against 1 (`tools/bench_train.py --processes --presets {args.presets}`)\n\n"
        f"`torchrun --standalone --nproc-per-node N -m phrase_scorer train {Path(args.table).name} --batch-size 64 "
        "--threads 1 ...` with N = 1 and N = 2 (gloo backend, CPU, `OMP_NUM_THREADS=1`), one after the other in "
        f"the same run, on this machine ({info['cpu']}, {info['cores']} cores, torch {info['torch']}). The global "
        "batch is 64 pairs in both (32 per process with 2). Training pairs/s of the second validation interval "
        "(after warm-up; validation excluded). The machine is shared with other jobs, so the absolute figures "
        "move from run to run; the ratio is the figure to read.\n\n"
        + benchlib.markdown_table(["preset", "1 process pairs/s", "2 processes pairs/s", "ratio"], rows) + "\n"
    )


DATA = benchlib.ROOT.parent / "shared" / "data" / "multi30k-en-fr"


def sentence_run(args, work: Path, processes: int, threads: int, batch: int, policy: str) -> dict:
    """`train --corpus` of RNNsearch `small` on the Multi30k sentences for --sentence-steps
    updates; training pairs/s and target tokens/s of the validation intervals after the first."""
    data = Path(args.data)
    out = work / f"sentences-{processes}x{threads}x{batch}-{policy}"
    every = args.sentence_steps // 3
    train_args = ["train", "--corpus", data / "train.tok.en.gz", data / "train.tok.fr.gz",
                  "--dev", data / "val.tok.en.gz", data / "val.tok.fr.gz", "--arch", "rnnsearch", "--preset", "small",
                  "--batch-size", batch, "--threads", threads, "--valid-metric", "nll", "--valid-every", every,
                  "--max-steps", 3 * every, "-o", out, "--overwrite"]
    command = benchlib.phrase_scorer_command(*train_args, "--processes", processes)
    _, err, _, _ = benchlib.run_measured(command, env={**os.environ, "OMP_WAIT_POLICY": policy.upper()})
    records = [json.loads(l) for l in (out / "train.log.jsonl").read_text().splitlines() if l.strip()]
    if len(records) < 2:
        raise SystemExit(f"{out}: training left fewer than 2 validations: {err[-2000:]}")
    later = records[1:]  # the first interval holds the start-up

    import numpy as np

    from phrase_scorer.config import model_config_from_dict
    from phrase_scorer.data.cache import PairSet
    from phrase_scorer.models.architectures import training_flops_per_pair

    config = json.loads((out / "config.json").read_text())
    pairs = PairSet(out / "cache", "train")
    lengths = pairs.lengths_of(np.arange(len(pairs))).astype(np.float64)  # (pairs, 2) source, target words
    flops = float(np.mean(training_flops_per_pair(model_config_from_dict(config["model"]), config["target_vocab_size"],
                                                  lengths[:, 0], lengths[:, 1])))
    shutil.rmtree(out, ignore_errors=True)
    return {"processes": processes, "threads": threads, "batch": batch, "policy": policy, "flops_per_pair": flops,
            "pairs_per_second": float(np.mean([r["pairs_per_second"] for r in later])),
            "tokens_per_second": float(np.mean([r["target_tokens_per_second"] for r in later])),
            "target_words_per_pair": float(lengths[:, 1].mean())}


def sentences(args, work: Path) -> str:
    """Sentence training speed against the matmul rate, by processes x threads x batch size."""
    import torch

    rates = {}
    for threads in (1, os.cpu_count()):
        torch.set_num_threads(threads)
        rates[threads] = benchlib.matmul_rate()
    machine_rate = rates[os.cpu_count()]
    specs = args.sentence_configs.split(",")
    best_of: Dict[str, dict] = {}
    for _ in range(args.repeats):  # every configuration once per round: slow spells of the machine hit all
        for spec in specs:
            shape, _, policy = spec.partition(":")
            processes, threads, batch = map(int, shape.split("x"))
            r = sentence_run(args, work, processes, threads, batch, policy or "passive")
            print(json.dumps(r), flush=True)
            if spec not in best_of or r["pairs_per_second"] > best_of[spec]["pairs_per_second"]:
                best_of[spec] = r
    rows, results = [], []
    for spec in specs:
        r = best_of[spec]
        processes, threads, batch = r["processes"], r["threads"], r["batch"]
        results.append(r)
        rows.append([processes, threads, batch, r["policy"], f"{r['pairs_per_second']:,.0f}",
                     f"{r['tokens_per_second']:,.0f}", f"{r['flops_per_pair'] / 1e6:.1f}",
                     f"{r['flops_per_pair'] * r['pairs_per_second'] / 1e9:.1f}",
                     f"{r['flops_per_pair'] * r['pairs_per_second'] / machine_rate:.2f}"])
    info = benchlib.machine()
    best = max(results, key=lambda r: r["tokens_per_second"])
    return (
        "## Train: sentence pairs on the CPU (`tools/bench_train.py --sentences`)\n\n"
        f"Command: `python tools/bench_train.py --sentences --sentence-configs {args.sentence_configs} "
        f"--sentence-steps {args.sentence_steps} --repeats {args.repeats} --write` on an otherwise idle machine "
        f"({info['cpu']}, "
        f"{info['cores']} cores, torch {info['torch']}, fp32). Each configuration (*processes* x *threads* per "
        "process x *batch* pairs per update) runs `phrase-scorer train --corpus train.tok.en.gz train.tok.fr.gz "
        "--arch rnnsearch --preset small --batch-size B --threads T --processes P "
        f"--max-steps {3 * (args.sentence_steps // 3)}` "
        "(2 processes: gloo) on the 29,000 Multi30k sentence pairs, with the "
        "default recipe; the figures are the mean of the training log's validation intervals after the first "
        "(validation excluded), the best of --repeats rounds that each run every configuration once. *OpenMP wait*: "
        "`OMP_WAIT_POLICY` of the run (`passive`, idle threads sleep, is what the command line sets unless the "
        "environment says otherwise; `active`, they spin). *train MFLOP/pair*: 3 x the analytic forward FLOPs "
        "(`models.architectures.FORWARD_FLOPS`, checked against torch's flop counter by a test) at each "
        f"training pair's own lengths, mean {results[0]['target_words_per_pair']:.1f} target words; *share*: of "
        f"the fp32 matmul rate of the whole machine measured in the same run ({machine_rate / 1e9:.0f} GFLOP/s on "
        f"{os.cpu_count()} threads, {rates[1] / 1e9:.0f} on 1).\n\n"
        + benchlib.markdown_table(["processes", "threads", "batch", "OpenMP wait", "pairs/s", "target tokens/s",
                                   "train MFLOP/pair", "GFLOP/s", "share"], rows)
        + f"\n\nFastest: {best['processes']} x {best['threads']} x {best['batch']}, "
        f"{best['tokens_per_second']:,.0f} target tokens/s.\n"
    )


def memory(args, work: Path) -> str:
    table = Path(args.table)
    big = benchlib.repeated_table(table, work / "table-x10.gz", times=10)
    rows, peaks = [], {}
    for name, path in (("table", table), ("table x 10", big)):
        out = work / f"model-{len(peaks)}"
        _, _, seconds, peak = benchlib.run_measured(benchlib.phrase_scorer_command(
            "train", path, "-o", out, "--preset", "tiny", "--max-steps", 200, "--valid-every", 100, "--overwrite"))
        config = json.loads((out / "config.json").read_text())
        cache = sum(f.stat().st_size for f in (out / "cache").iterdir())
        peaks[name] = peak
        rows.append([name, f"{config['table']['unique_pairs']:,}", f"{cache / 1e6:,.0f}", f"{seconds:,.0f}",
                     f"{peak:,.0f}"])
        print(rows[-1], flush=True)
        shutil.rmtree(out)
    return (
        "## Train: memory (`tools/bench_train.py --memory`)\n\n"
        f"Peak RSS of `phrase-scorer train --preset tiny --max-steps 200` (counting words, writing the pair cache, "
        f"training, validating) on `{table.name}` and on the table repeated ten times (its copies are not adjacent, "
        f"so all of them enter the cache). The larger table takes "
        f"{peaks['table x 10'] / peaks['table']:.2f}x the memory.\n\n"
        + benchlib.markdown_table(["input", "pairs in cache", "cache MB", "seconds", "peak RSS MB"], rows) + "\n"
    )


def main() -> None:
    parser, w = benchlib.bench_parser(__doc__, "worker")
    w.add_argument("--table", required=True)
    w.add_argument("--preset", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--threads", type=int, default=None)
    parser.add_argument("--presets", default="tiny,small,paper")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--throughput", action="store_true")
    parser.add_argument("--learning", action="store_true")
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--recipes", default="modern,paper", help="--learning: the recipes compared")
    parser.add_argument("--side-by-side", action="store_true",
                        help="--learning: train the recipes at the same time, one thread each")
    parser.add_argument("--model-out", default=None, help="where --learning keeps its models (a folder per recipe)")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--sentences", action="store_true",
                        help="RNNsearch small on the Multi30k sentences: speed by processes x threads x batch")
    parser.add_argument("--sentence-configs", default="1x1x80,1x2x80,1x2x80:active,2x1x80,1x2x40:active,1x2x160:active",
                        help="--sentences: PROCESSESxTHREADSxBATCH[:active|passive] (OpenMP wait policy, default "
                             "passive), comma-separated")
    parser.add_argument("--sentence-steps", type=int, default=120, help="--sentences: updates per configuration")
    parser.add_argument("--repeats", type=int, default=2, help="--sentences: rounds (each figure the best of them)")
    parser.add_argument("--data", default=str(DATA), help="--sentences: folder of the tokenised Multi30k files")
    parser.add_argument("--processes", action="store_true", help="1 against 2 torchrun processes on the CPU")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return
    if not (args.throughput or args.learning or args.memory or args.processes or args.sentences):
        args.throughput = args.learning = args.memory = args.processes = True
    with benchlib.work_dir(args.work_dir, "bench-train-") as work:
        for enabled, name, function in ((args.throughput, "bench_train_throughput", throughput),
                                        (args.learning, "bench_train_learning", learning),
                                        (args.memory, "bench_train_memory", memory),
                                        (args.processes, "bench_train_processes", processes),
                                        (args.sentences, "bench_train_sentences", sentences)):
            if enabled:
                benchlib.report(name, function(args, work), args.write)


if __name__ == "__main__":
    main()
