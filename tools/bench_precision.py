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

Results go to stdout and, with ``--write``, to docs/precision.md (the whole file is generated).
Models can also be measured in parallel processes, each saving its rows, then written together:

    python tools/bench_precision.py --model runs/small --lines 6000 --rows small.jsonl &
    python tools/bench_precision.py --model runs/paper --lines 800 --no-noise --rows paper.jsonl
    python tools/bench_precision.py --from-rows small.jsonl paper.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

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
    from phrase_scorer.scoring import BatchScorer

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
                        help="first lines of the table scored (repeatable: one per --model, in order) [default: 100000]")
    parser.add_argument("--precisions", default="bf16,fp16")
    parser.add_argument("--no-noise", action="store_true", help="skip the fp32 run with another batch size")
    parser.add_argument("--write", action="store_true", help="write docs/precision.md")
    parser.add_argument("--rows", type=Path, default=None, help="also append the result rows (JSON lines) to this file")
    parser.add_argument("--from-rows", nargs="+", type=Path, default=None,
                        help="write docs/precision.md from rows saved by earlier runs (one per model, run in "
                             "parallel) instead of scoring")
    args = parser.parse_args()
    if args.from_rows:
        rows = [json.loads(line) for path in args.from_rows for line in path.read_text().splitlines() if line.strip()]
        PRECISION_MD.write_text(render(rows))
        print(f"wrote {PRECISION_MD}")
        return
    if not args.model:
        parser.error("give --model DIR (or --from-rows FILE ...)")

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
        runs = {} if args.no_noise else {"fp32, batch 1024 tokens": score(loaded, sources, targets, "fp32", device, batch_tokens=1024)}
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
        PRECISION_MD.write_text(render(rows))
        print(f"wrote {PRECISION_MD}")


def decision(rows) -> str:
    def summary(precision: str) -> str:
        chosen = [r for r in rows if r["precision"] == precision]
        if not chosen:
            return f"{precision}: not measured"
        mean = ", ".join(f"{r['mean']:.1e} ({r['preset']})" for r in chosen)
        return (f"{precision} moves log p by {mean} nats on average, up to {max(r['max'] for r in chosen):.2f} on one "
                f"pair, and reorders the targets of up to {100 * max(r['order_changed'] for r in chosen):.1f}% of sources")

    return (
        f"{summary('bf16')}; {summary('fp16')}. fp32 with another batch size moves it by about "
        f"{max((r['max'] for r in rows if r['precision'].startswith('fp32')), default=float('nan')):.0e} at most. Half precision thus moves "
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
        "| model | preset | trained steps | valid NLL/token | valid margin | precision | lines | sources | mean \\|Δ\\| | p99 \\|Δ\\| | max \\|Δ\\| | order changed | best changed |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['preset']} | {r['steps']} | {r['valid_nll_token']} | {r['margin']} | {r['precision']} | {r['lines']:,} | "
            f"{r['sources']:,} | {r['mean']:.2e} | {r['p99']:.2e} | {r['max']:.2e} | {100 * r['order_changed']:.1f}% | "
            f"{100 * r['best_changed']:.1f}% |"
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
