#!/usr/bin/env python3
"""How much half precision moves the scores: fp32 against bf16 and fp16, on trained models.

For each model (``--model DIR``, repeatable) the first ``--lines`` lines of a phrase table are
scored by :class:`BatchScorer` in fp32 (the reference), once more in fp32 with another batch size
(the noise floor of fp32 summation order), and in bf16 and fp16. Reported per precision: the mean,
99th percentile and maximum of |delta log p| in nats over all lines, and over the sources with two
or more targets, the fraction whose targets come out in a different order by score and the
fraction whose best target changes.

Where CUDA is available the half-precision runs are the real GPU path (``--device cuda``: the
scorer under ``torch.autocast``). Without it the GPU path is emulated on the CPU: the scorer runs
under ``torch.autocast("cpu", dtype)``, which puts every ``nn.Linear`` in half precision as CUDA
autocast does, and the encoder's ``torch.gru_cell`` gets all its inputs cast to half precision,
which is what CUDA autocast does with that op (the CPU policy would leave it in fp32). So, as on a
GPU, every matrix product, the recurrent states and the logits are half precision and only the
log-softmax is fp32. The rounding points inside a fused GPU kernel can differ from the CPU's, so
the emulated figures are estimates of the GPU's, not its exact values.

Results go to stdout and, with ``--write``, to docs/precision.md (the whole file is generated,
but for its batching section and the sections after it, which stay as they are). Models can also
be measured in parallel processes, each saving its rows, then written together:

    python tools/bench_precision.py --model runs/small --lines 6000 --rows small.jsonl &
    python tools/bench_precision.py --model runs/paper --lines 800 --no-noise --rows paper.jsonl
    python tools/bench_precision.py --from-rows small.jsonl paper.jsonl

``--batching`` measures instead how much a pair's fp32 score depends on its batch neighbours: one
model scores the same lines under several batchings (``--batch-tokens``, the rows of logits formed
at once, the CPU threads, windows of lines), and in fp64 under the same batchings, with the speed
of each; with ``--write`` it replaces the batching section of docs/precision.md:

    python tools/bench_precision.py --batching --model runs/small --table examples/phrase-table.sample.gz --write
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PRECISION_MD = ROOT / "docs" / "precision.md"


@contextlib.contextmanager
def emulated_gpu_autocast(dtype):
    """CUDA autocast's policy for the scorer's ops, on the CPU (see the module docstring)."""
    import torch

    from phrase_scorer.models.encdec import Encoder

    original = Encoder.step

    def step(self, emb, h):
        gru = self.gru
        weights = (gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0)
        with torch.autocast(device_type="cpu", enabled=False):
            return torch.gru_cell(emb.to(dtype), h.to(dtype), *(w.to(dtype) for w in weights))

    Encoder.step = step
    try:
        with torch.autocast(device_type="cpu", dtype=dtype):
            yield
    finally:
        Encoder.step = original


def read_pairs(table: Path, lines: int, loaded):
    from phrase_scorer.io.phrase_table import PhraseTableReader

    sources, targets, keys = [], [], []
    for i, line in enumerate(PhraseTableReader(table, min_fields=2, check_scores=False)):
        if i == lines:
            break
        sources.append(loaded.source_vocab.encode(line.source_words))
        targets.append(loaded.target_vocab.encode(line.target_words))
        keys.append(" ".join(line.source_words))
    return sources, targets, keys


def score(loaded, sources, targets, precision: str, device: str, batch_tokens: int = 8192):
    """(scores, seconds) for one precision; on a CPU, bf16/fp16 go through the emulation."""
    import torch

    from phrase_scorer.config import ScoringOptions
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    model = loaded.model.to(device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    emulate = device == "cpu" and dtype is not None
    scorer = BatchScorer(model, ScoringOptions(batch_tokens=batch_tokens, precision="fp32" if emulate else precision))
    context = emulated_gpu_autocast(dtype) if emulate else contextlib.nullcontext()
    start = time.perf_counter()
    with context:
        out = scorer.score(sources, targets)
    return out, time.perf_counter() - start


def source_groups(keys: List[str]) -> List[np.ndarray]:
    """Line indices of each source with two or more targets (a table is sorted by source)."""
    groups, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            if i - start >= 2:
                groups.append(np.arange(start, i))
            start = i
    return groups


def compare(reference: np.ndarray, other: np.ndarray, groups: List[np.ndarray]) -> Dict[str, float]:
    delta = np.abs(other - reference)
    order_changed = best_changed = 0
    for g in groups:
        a, b = np.argsort(-reference[g], kind="stable"), np.argsort(-other[g], kind="stable")
        order_changed += not np.array_equal(a, b)
        best_changed += a[0] != b[0]
    return {
        "mean": float(delta.mean()),
        "p99": float(np.quantile(delta, 0.99)),
        "max": float(delta.max()),
        "order_changed": order_changed / max(len(groups), 1),
        "best_changed": best_changed / max(len(groups), 1),
    }


BATCHING_SECTION = "batching"  # docs/precision.md's block between <!-- batching:start/end --> markers


@dataclass
class Batching:
    """One way of scoring the same lines: the scorer's batches and rows of logits, the CPU threads,
    the lines given to the scorer at once (0: all of them), and the model's dtype."""

    name: str
    batch_tokens: int = 8192
    chunk_rows: Optional[int] = None
    threads: Optional[int] = None  # None: the reference's
    window_lines: int = 0
    dtype: str = "fp32"


BATCHINGS = [
    Batching("reference: 8192 tokens, 128 rows of logits"),
    Batching("1024 tokens", batch_tokens=1024),
    Batching("256 tokens", batch_tokens=256),
    Batching("16 rows of logits", chunk_rows=16),
    Batching("windows of 1,000 lines", window_lines=1000),
    Batching("1 thread", threads=1),
]


def score_batched(model, sources, targets, batching: Batching, threads: int) -> np.ndarray:
    import torch

    from phrase_scorer.config import ScoringOptions
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    torch.set_num_threads(batching.threads or threads)
    try:
        scorer = BatchScorer(model, ScoringOptions(batch_tokens=batching.batch_tokens, chunk_rows=batching.chunk_rows))
        step = batching.window_lines or len(sources)
        return np.concatenate([scorer.score(sources[i : i + step], targets[i : i + step])
                               for i in range(0, len(sources), step)])
    finally:
        torch.set_num_threads(threads)


def differ_as_printed(a: np.ndarray, b: np.ndarray, digits: int) -> int:
    return sum(f"{x:.{digits}g}" != f"{y:.{digits}g}" for x, y in zip(a, b))


def measure_batching(directory: Path, table: Path, lines: int, repeats: int) -> List[Dict[str, object]]:
    """One row per batching and dtype: how many scores differ from the same dtype's reference
    (in any bit, as ``score``/``annotate`` print them (9 digits), as ``rescore`` does (6)), by how
    much, and the speed (best of ``repeats`` timings, taken in turns so that a busy machine slows
    every batching alike)."""
    import copy

    import torch

    from phrase_scorer.model_dir import ModelDirectory

    loaded = ModelDirectory(directory).load("cpu")
    sources, targets, _ = read_pairs(table, lines, loaded)
    models = {"fp32": loaded.model.float().eval(), "fp64": copy.deepcopy(loaded.model).double().eval()}
    threads = torch.get_num_threads()
    runs = [(b, dtype) for dtype in models for b in BATCHINGS]
    scores: Dict[int, np.ndarray] = {}
    seconds: Dict[int, float] = {}
    for _ in range(repeats):
        for i, (batching, dtype) in enumerate(runs):
            start = time.perf_counter()
            scores[i] = score_batched(models[dtype], sources, targets, batching, threads)
            seconds[i] = min(seconds.get(i, float("inf")), time.perf_counter() - start)
    reference = {dtype: next(i for i, (b, d) in enumerate(runs) if d == dtype) for dtype in models}
    rows = []
    for i, (batching, dtype) in enumerate(runs):
        ref = scores[reference[dtype]]
        delta = np.abs(scores[i] - ref)
        rows.append({
            "model": directory.name, "batching": batching.name, "dtype": dtype, "lines": len(sources),
            "threads": batching.threads or threads,
            "differ": int((delta > 0).sum()), "differ_9": differ_as_printed(scores[i], ref, 9),
            "differ_6": differ_as_printed(scores[i], ref, 6), "max_abs": float(delta.max()),
            "max_rel": float((delta / np.abs(ref)).max()), "pairs_per_s": len(sources) / seconds[i],
            # fp64 against fp32 with the same batching
            "speed_vs_fp32": ((seconds[runs.index((batching, "fp32"))] / seconds[i]) if dtype == "fp64"
                              else float("nan")),
        })
    # fp32 against fp64: the error of fp32 itself, for scale
    delta = np.abs(scores[reference["fp32"]] - scores[reference["fp64"]])
    rows.append({"model": directory.name, "batching": "fp32 reference against fp64 reference", "dtype": "fp32 vs fp64",
                 "lines": len(sources), "threads": threads, "differ": int((delta > 0).sum()),
                 "differ_9": differ_as_printed(scores[reference["fp32"]], scores[reference["fp64"]], 9),
                 "differ_6": differ_as_printed(scores[reference["fp32"]], scores[reference["fp64"]], 6),
                 "max_abs": float(delta.max()), "max_rel": float((delta / np.abs(scores[reference["fp64"]])).max()),
                 "pairs_per_s": float("nan"), "speed_vs_fp32": float("nan")})
    return rows


def render_batching(rows, command: str, info: Dict[str, str], busy: str) -> str:
    fp32 = [r for r in rows if r["dtype"] == "fp32" and not r["batching"].startswith("reference")]
    fp64 = [r for r in rows if r["dtype"] == "fp64" and not r["batching"].startswith("reference")]
    ratio = [r["speed_vs_fp32"] for r in rows if r["dtype"] == "fp64"]  # fp64 against fp32, batching by batching
    lines = [
        "## Batching: how much a pair's fp32 score depends on its neighbours",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; {busy}.",
        "",
        f"One model scores the same {rows[0]['lines']:,} lines of the example table under several batchings; each row "
        "is compared with its dtype's reference (8192 tokens per batch, 128 rows of logits, "
        f"{rows[0]['threads']} threads, all lines at once). *Differ* counts the scores that differ in any bit, "
        "*as printed* those that differ once written as `score` and `annotate` write them (9 significant "
        "digits) and as `rescore` does (6). Speeds are the best of a few timings taken in turns.",
        "",
        benchmarks_table(rows),
        "",
        f"In fp32 the batching changes {max(r['differ'] for r in fp32):,} of {rows[0]['lines']:,} scores at most, "
        f"by at most {max(r['max_abs'] for r in fp32):.1e} nats ({max(r['max_rel'] for r in fp32):.1e} of the value); "
        f"up to {max(r['differ_9'] for r in fp32):,} scores print differently at 9 digits and "
        f"{max(r['differ_6'] for r in fp32):,} at 6. The matrix products (whose blocking and split over the "
        "threads follow the shape of the batch) and the softmax sums add in another order when the batch "
        "changes shape, so the per-word log-probabilities move in their last bits; the sum over a pair's "
        "words is already fp64. In fp64 the same batchings move a score by at most "
        f"{max(r['max_abs'] for r in fp64):.1e} nats and change {max(r['differ_9'] for r in fp64):,} printed scores "
        f"at 9 digits, but fp64 scores at {min(ratio):.2f}-{max(ratio):.2f}x the speed of fp32 with the same "
        "batching, and even fp64 scores still differ in their last bits: fp64 makes a printed difference "
        "rare, not impossible. A score independent of its neighbours would need matrix products and sums "
        "whose order does not depend on the batch shape; `torch.use_deterministic_algorithms` makes a run "
        "repeatable, not independent of the batch shape.",
        "",
        "**Decision:** scores stay fp32; a pair's score depends on its batch neighbours in its last bits, by "
        f"the amounts above (at most {max(r['max_abs'] for r in fp32):.0e} nats, far below the ~1e-3 nats that "
        "would matter). So the batching (`--batch-tokens`, the rows of logits, `--window-lines`) and a CPU's "
        "thread count are part of the signature of every scored output, and outputs are byte-identical only "
        "under the same settings; compare scores from runs with different settings to within about "
        f"{10 * max(r['max_abs'] for r in fp32):.0e} nats, or one unit in the last printed digit.",
    ]
    return "\n".join(lines)


def benchmarks_table(rows) -> str:
    def number(value: float, fmt: str) -> str:
        return "-" if value != value else format(value, fmt)

    header = ["dtype", "batching", "threads", "lines", "differ", "differ as printed (9 digits)",
              "differ as printed (6 digits)", "max \\|Δ\\| (nats)", "max relative Δ", "pairs/s", "speed vs fp32"]
    body = [[r["dtype"], r["batching"], r["threads"], f"{r['lines']:,}", f"{r['differ']:,}", f"{r['differ_9']:,}",
             f"{r['differ_6']:,}", f"{r['max_abs']:.1e}", f"{r['max_rel']:.1e}", number(r["pairs_per_s"], ",.0f"),
             number(r["speed_vs_fp32"], ".2f")] for r in rows]
    return benchlib.markdown_table(header, body)


def kept_sections(text: Optional[str] = None) -> str:
    """What the half-precision table's rewrite of docs/precision.md keeps as it stands: the batching
    block and every section after it (the measured changes of the scoring method, written by hand)."""
    if text is None:
        text = PRECISION_MD.read_text() if PRECISION_MD.exists() else ""
    start = text.find("<!-- batching:start -->")
    return "" if start < 0 else "\n" + text[start:]


def describe_model(directory: Path) -> Dict[str, str]:
    config = json.loads((directory / "config.json").read_text())
    records = [json.loads(line) for line in (directory / "train.log.jsonl").read_text().splitlines() if line.strip()]
    best = min(records, key=lambda r: r.get("valid_nll_token", float("inf"))) if records else {}
    return {
        "preset": config.get("preset", "?"),
        "steps": str(records[-1]["step"]) if records else "?",  # of the last weights, which are the ones scored
        "best_step": str(best.get("step", "?")),
        "valid_nll_token": f"{best.get('valid_nll_token', float('nan')):.3f}",
        "margin": f"{best.get('valid_margin_pair', float('nan')):.2f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], type=Path, help="trained model directory (repeatable)")
    parser.add_argument("--table", type=Path, default=benchlib.DEFAULT_TABLE)
    parser.add_argument("--lines", type=int, action="append", default=None,
                        help="first lines of the table scored (repeatable: one per --model, in order) "
                             "[default: 100000]")
    parser.add_argument("--precisions", default="bf16,fp16")
    parser.add_argument("--no-noise", action="store_true", help="skip the fp32 run with another batch size")
    parser.add_argument("--write", action="store_true", help="write docs/precision.md")
    parser.add_argument("--rows", type=Path, default=None, help="also append the result rows (JSON lines) to this file")
    parser.add_argument("--from-rows", nargs="+", type=Path, default=None,
                        help="write docs/precision.md from rows saved by earlier runs (one per model, run in "
                             "parallel) instead of scoring")
    parser.add_argument("--batching", action="store_true",
                        help="measure how batching moves fp32 (and fp64) scores instead, with the first --model")
    parser.add_argument("--repeats", type=int, default=3, help="timings per batching (with --batching)")
    parser.add_argument("--busy", default="other work running beside it",
                        help="how busy the machine was, for the docs (with --batching)")
    args = parser.parse_args()
    if args.from_rows:
        rows = [json.loads(line) for path in args.from_rows for line in path.read_text().splitlines() if line.strip()]
        PRECISION_MD.write_text(render(rows) + kept_sections())
        print(f"wrote {PRECISION_MD}")
        return
    if not args.model:
        parser.error("give --model DIR (or --from-rows FILE ...)")
    if args.batching:
        lines = (args.lines or [100000])[0]
        command = (f"python tools/bench_precision.py --batching --model {args.model[0]} --table {args.table} "
                   f"--lines {lines} --repeats {args.repeats}")
        rows = measure_batching(args.model[0], args.table, lines, args.repeats)
        for row in rows:
            print(json.dumps(row), flush=True)
        markdown = render_batching(rows, command, benchlib.machine(), args.busy)
        print(markdown)
        if args.write:
            benchlib.update_section(BATCHING_SECTION, markdown, PRECISION_MD)
            print(f"wrote {PRECISION_MD}")
        return

    import torch

    from phrase_scorer.model_dir import CHECKPOINT, ModelDirectory

    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = benchlib.machine()
    command = "python tools/bench_precision.py " + " ".join(
        [f"--model {m}" for m in args.model] + [f"--table {args.table.name}"]
        + [f"--lines {n}" for n in (args.lines or [])] + (["--no-noise"] if args.no_noise else [])
    )
    rows = []
    lines = args.lines or [100000]
    lines += [lines[-1]] * (len(args.model) - len(lines))
    for directory, count in zip(args.model, lines):
        loaded = ModelDirectory(directory).load(device, weights=CHECKPOINT)  # the last weights trained
        sources, targets, keys = read_pairs(args.table, count, loaded)
        groups = source_groups(keys)
        model_info = describe_model(directory)
        reference, fp32_seconds = score(loaded, sources, targets, "fp32", device)
        runs = {} if args.no_noise else {
            "fp32, batch 1024 tokens": score(loaded, sources, targets, "fp32", device, batch_tokens=1024)}
        for precision in args.precisions.split(","):
            runs[precision] = score(loaded, sources, targets, precision, device)
        for name, (scores, seconds) in runs.items():
            row = {"model": directory.name, **model_info, "precision": name, "lines": len(sources),
                   "sources": len(groups), "seconds": seconds, "fp32_seconds": fp32_seconds,
                   **compare(reference, scores, groups)}
            row.update(command=command, machine=info, device=device)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(row) + "\n")

    if args.write:
        PRECISION_MD.write_text(render(rows) + kept_sections())
        print(f"wrote {PRECISION_MD}")


def decision(rows) -> str:
    def summary(precision: str) -> str:
        chosen = [r for r in rows if r["precision"] == precision]
        if not chosen:
            return f"{precision}: not measured"
        mean = ", ".join(f"{r['mean']:.1e} ({r['preset']})" for r in chosen)
        return (f"{precision} moves log p by {mean} nats on average, up to {max(r['max'] for r in chosen):.2f} on one "
                f"pair, and reorders the targets of up to "
                f"{100 * max(r['order_changed'] for r in chosen):.1f}% of sources")

    return (
        f"{summary('bf16')}; {summary('fp16')}. fp32 with another batch size moves it by about "
        f"{max((r['max'] for r in rows if r['precision'].startswith('fp32')), default=float('nan')):.0e} at most. "
        "Half precision thus moves "
        "scores by more than the ~1e-3 nats below which a user's scores would be unchanged for practical purposes, "
        "so **fp32 is the default precision of scoring on every device**. bf16 or fp16 is an explicit choice "
        "(`annotate --precision`); the device, the precision and the batching (`--batch-tokens` and the rows of "
        "logits formed at once) are recorded in the annotated table's signature (`OUT.json`, key `scoring`), and "
        "`annotate --resume` refuses to continue a run on another device, in another precision or with other "
        "batches."
    )


def render(rows) -> str:
    info, device = rows[0]["machine"], rows[0]["device"]
    mode = "the GPU path itself" if device == "cuda" else "the GPU path emulated on the CPU (see below)"
    commands = list(dict.fromkeys(r["command"] for r in rows))
    lines = [
        "# Precision: what bf16 and fp16 do to the scores",
        "",
        "Command" + ("s (run in parallel, then `--from-rows` to write this file)" if len(commands) > 1 else "")
        + ": " + ", ".join(f"`{c}`" for c in commands),
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info.get('gpu', 'no GPU')}; torch {info['torch']}. "
        f"Half precision: {mode}.",
        "",
        "Each model scores the first lines of the Multi30k en-fr phrase table in fp32 (the reference), in fp32 "
        "with a smaller batch (the noise of fp32 summation order, for scale), and in bf16 and fp16. |Δ log p| "
        "is in nats, over all lines; *order changed* is the fraction of sources (with two or more targets) "
        "whose targets come out in a different order by score, *best changed* the fraction whose best target "
        "changes. *Valid margin* is the model's mean log p margin between held-out true pairs and the same sources "
        "with shuffled targets, in nats, at its best validation: how far it had learned (near 0: not yet). The "
        "scored weights are the last ones trained (*trained steps*).",
        "",
        "| model | preset | trained steps | valid NLL/token | valid margin | precision | lines | sources | "
        "mean \\|Δ\\| | p99 \\|Δ\\| | max \\|Δ\\| | order changed | best changed |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['preset']} | {r['steps']} | {r['valid_nll_token']} | {r['margin']} | "
            f"{r['precision']} | {r['lines']:,} | {r['sources']:,} | {r['mean']:.2e} | {r['p99']:.2e} | "
            f"{r['max']:.2e} | {100 * r['order_changed']:.1f}% | {100 * r['best_changed']:.1f}% |"
        )
    lines += [
        "",
        "## What each precision does",
        "",
        "- **fp32** (the default of `annotate`, `score`, `sample` and `compare`, on every device): every operation "
        "in single precision; on a GPU, TF32 tensor-core arithmetic is turned off for the run, so GPU and CPU "
        "compute the same function up to summation order, whose effect the *fp32, batch 1024 tokens* row shows; "
        "tests/test_gpu.py checks GPU fp32 against CPU fp32 within 1e-3 nats where a GPU is present.",
        "- **bf16 / fp16** (`annotate --precision`, GPU only; a CPU always computes in fp32): `torch.autocast`. "
        "Every matrix product and GRU step runs in half precision, so the recurrent states are carried from "
        "step to step in half precision and the logits come out of a half-precision output layer; only the "
        "log-softmax and the sum over a phrase's words are fp32.",
        "- **int8** (`--precision int8` of `rescore`, `annotate`, `rescore-experiment` "
        "and `translate-system --moses`; a CPU only, refused on a GPU): the output layer's product W_o t_i in 8-bit "
        "integers (PyTorch's fbgemm kernels: W_o int8 per output word, each row of t_i in 7 bits over its own "
        "range, so a row's logits do not depend on the rows beside it), everything else fp32. What it does to "
        "n-best scores, to the model's own choice of hypothesis, to BLEU and to the speed: docs/benchmarks.md, "
        "\"int8 against fp32\". The signature records `precision: int8` and the kernels' engine; a resumed run "
        "refuses another precision.",
        "- Training (`train --precision auto`, GPU only) uses bf16 autocast (fp16 with loss scaling where bf16 is "
        "not supported) with fp32 weights and optimiser state; its validation figures are computed in the same "
        "precision.",
        "",
        "## Decision",
        "",
        decision(rows),
        "",
        "## How the GPU path is emulated on a CPU",
        "",
        "The scorer runs under `torch.autocast(\"cpu\", dtype)`, which puts every `nn.Linear` in half precision "
        "as CUDA autocast does; the encoder's `torch.gru_cell` gets all its inputs cast to half precision, as "
        "CUDA autocast's policy does for that op (the CPU policy would leave it in fp32). The rounding points "
        "inside a fused GPU kernel can differ, so emulated figures estimate the GPU's rather than reproduce "
        "them. The tests marked `gpu` (tests/test_gpu.py) compare real GPU scores with CPU fp32 scores.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
