#!/usr/bin/env python3
"""Benchmark the scorer behind `phrase-scorer annotate`, and the memory of annotating.

Speed (default): on the first --lines lines of a phrase table, for each preset, the pairs/s and
peak memory of
  * scorer      -- BatchScorer as annotate uses it (sources encoded once, shared prefixes,
                   token-budget batches, cache-sized softmax chunks);
  * no-sharing  -- BatchScorer with prefix sharing off (each distinct source still encoded once);
  * sorted-512  -- the teacher-forced forward on length-sorted batches of 512, every pair
                   encoded on its own (paper preset only);
  * naive       -- pairs in file order, fixed chunks of 64, every pair encoded on its own;
  * annotate    -- the whole command (read, score, write gzip) on the same lines.
Each runs in its own process, right after measuring that process's fp32 matmul rate. The
effective rate is (naive FLOPs per pair) x (pairs/s); its share of the matmul rate can pass 1 only
by doing less work than the naive scorer, which the "work done" column measures. The "floor" of
the scorer strategies is the pairs/s their arithmetic would allow at that matmul rate and the
measured exp rate, with nothing else taking time.

Memory (--memory): peak RSS of `phrase-scorer annotate` on the table and on the table repeated
ten times.

Whole table (--whole-table): the time and peak RSS of `phrase-scorer annotate` on the whole table
with each model given by --trained.

Models are untrained (the paper's initialisation) with shortlists counted on the whole table, so
every network has the size it would have after training on that table, unless `--trained
PRESET=DIR` names a trained model for a preset. Weights can matter to speed: the scorer's
softmax recomputes a row exactly when its shifted sum overflows, and the *exact* column counts
those rows. Results go to docs/benchmarks.md (--write) and stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import benchlib  # noqa: E402

HERE = Path(__file__).resolve()


# --- model directories -------------------------------------------------------------------------


def make_model_dir(directory: Path, preset: str, table: Path, counts_cache: Path) -> Path:
    """An untrained model of ``preset`` whose shortlists are counted on ``table``."""
    import torch

    from phrase_scorer.config import PRESETS
    from phrase_scorer.data.phrase_pairs import count_words
    from phrase_scorer.models.encdec import RNNEncoderDecoder
    from phrase_scorer.model_dir import BEST_WEIGHTS, SOURCE_VOCAB, TARGET_VOCAB, ModelDirectory
    from phrase_scorer.vocab import Vocabulary
    from collections import Counter

    if counts_cache.exists():
        data = json.loads(counts_cache.read_text())
        source_counts, target_counts = Counter(data["source"]), Counter(data["target"])
    else:
        source_counts, target_counts, _ = count_words(table)
        counts_cache.write_text(json.dumps({"source": source_counts, "target": target_counts}))
    config = PRESETS[preset]
    source_vocab = Vocabulary.from_counts(source_counts, config.source_shortlist)
    target_vocab = Vocabulary.from_counts(target_counts, config.target_shortlist)
    directory.mkdir(parents=True, exist_ok=True)
    model_dir = ModelDirectory(directory)
    source_vocab.save(directory / SOURCE_VOCAB)
    target_vocab.save(directory / TARGET_VOCAB)
    model_dir.write_config({"preset": preset, "model": config.to_dict(), "source_vocab_size": len(source_vocab),
                            "target_vocab_size": len(target_vocab), "note": "untrained, for benchmarks"})
    torch.manual_seed(0)
    model_dir.save_weights(RNNEncoderDecoder(config, len(source_vocab), len(target_vocab)).state_dict(), BEST_WEIGHTS)
    return directory


# --- one measurement per process ---------------------------------------------------------------------


def worker(args) -> None:
    import numpy as np
    import torch

    from phrase_scorer.config import AnnotateOptions, ScoringOptions
    from phrase_scorer.io.phrase_table import read_phrase_table
    from phrase_scorer.models.encdec import forward_flops
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.scoring.batch_scorer import BatchScorer, log_probs_by_forward

    torch.set_num_threads(args.threads or os.cpu_count())
    loaded = load_model(args.model_dir)
    model = loaded.model
    lines = list(read_phrase_table(args.pairs))
    sources = [loaded.source_vocab.encode(l.source_words) for l in lines]
    targets = [loaded.target_vocab.encode(l.target_words) for l in lines]
    V = len(loaded.target_vocab)
    parts = [forward_flops(model.config, V, len(s), len(t)) for s, t in zip(sources, targets)]
    naive_flops = float(np.mean([p["total"] for p in parts]))
    rate = benchlib.matmul_rate()

    stats = None
    if args.strategy in ("scorer", "no-sharing"):
        share = args.strategy == "scorer"
        options = ScoringOptions(share_source_prefixes=share, share_target_prefixes=share)
        BatchScorer(model, options).score(sources[:300], targets[:300])  # warm-up
        scorer = BatchScorer(model, options)
        start = time.perf_counter()
        scorer.score(sources, targets)
        seconds = time.perf_counter() - start
        stats = scorer.stats
    elif args.strategy in ("naive", "sorted-512"):
        log_probs_by_forward(model, sources[:128], targets[:128], 64)  # warm-up
        order = list(range(len(sources)))
        batch = 64
        if args.strategy == "sorted-512":
            order.sort(key=lambda i: (len(targets[i]), len(sources[i])))
            batch = 512
        start = time.perf_counter()
        log_probs_by_forward(model, [sources[i] for i in order], [targets[i] for i in order], batch)
        seconds = time.perf_counter() - start
    elif args.strategy == "annotate":
        from phrase_scorer.scoring.annotate import annotate

        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            annotate(args.pairs, Path(tmp) / "out.gz", loaded, AnnotateOptions())
            seconds = time.perf_counter() - start
    else:
        raise SystemExit(f"unknown strategy {args.strategy}")

    pairs_per_second = len(lines) / seconds
    result = {
        "pairs": len(lines),
        "seconds": seconds,
        "pairs_per_second": pairs_per_second,
        "matmul_gflops": rate / 1e9,
        "naive_mflops_per_pair": naive_flops / 1e6,
        "share_of_matmul": naive_flops * pairs_per_second / rate,
        "peak_rss_mb": benchlib.peak_rss_mb(),
        "target_vocab": V,
    }
    if stats is not None:
        unit = parts[0]
        done = (stats.encoder_steps * unit["encoder_step"]
                + stats.distinct_sources * (unit["context"] + unit["per_source"])
                + stats.decoder_steps * unit["decoder_step"])
        # The arithmetic floor: the products this strategy ran at the large-product rate, and one exp
        # per softmax entry (every decoder step's row of V' logits) at the measured exp rate.
        outputs = model.output_layer.out_features
        exps = stats.decoder_steps * outputs
        floor_seconds = done / rate + exps / benchlib.exp_rate(scorer.chunk_rows, outputs)
        result.update({
            "floor_pairs_per_second": len(lines) / floor_seconds,
            "work_done_share": done / (naive_flops * len(lines)),
            "distinct_sources": stats.distinct_sources,
            "encoder_steps_saved": 1 - stats.encoder_steps / stats.source_words,
            "decoder_steps_saved": 1 - stats.decoder_steps / stats.target_steps,
            "exact_softmax_share": stats.exact_softmax_rows / max(stats.decoder_steps, 1),
        })
    print(json.dumps(result))


# --- the report ----------------------------------------------------------------------------------------


def trained_models(args) -> Dict[str, str]:
    """--trained PRESET=DIR options as {preset: model directory}."""
    models = {}
    for item in args.trained:
        preset, _, directory = item.partition("=")
        if not directory:
            raise SystemExit(f"--trained takes PRESET=DIR, got {item!r}")
        models[preset] = directory
    return models


def speed(args, work: Path) -> str:
    table = Path(args.table)
    pairs = work / "slice.gz"
    benchlib.write_slice(table, args.lines, pairs)
    rows = []
    results = {}
    trained = trained_models(args)
    for preset in args.presets.split(","):
        if preset in trained:
            model_dir = Path(trained[preset])
            config = json.loads((model_dir / "config.json").read_text())
            if config["preset"] != preset:
                raise SystemExit(f"--trained {preset}={model_dir}: that model is a {config['preset']} model")
        else:
            model_dir = make_model_dir(work / preset, preset, table, work / "counts.json")
        weights = "trained" if preset in trained else "initial"
        strategies = ["scorer", "no-sharing", "naive", "annotate"]
        if preset == "paper":
            strategies.insert(2, "sorted-512")
        for strategy in strategies:
            out, _, _, _ = benchlib.run_measured(benchlib.python_command(
                HERE, "worker", "--model-dir", model_dir, "--pairs", pairs, "--strategy", strategy,
                *(["--threads", args.threads] if args.threads else [])))
            r = json.loads(out.strip().splitlines()[-1])
            r["weights"] = weights
            results[(preset, strategy)] = r
            print(f"{preset:6s} {strategy:11s} {r['pairs_per_second']:9.0f} pairs/s  share {r['share_of_matmul']:.2f}"
                  f"  matmul {r['matmul_gflops']:.0f} GFLOP/s  peak {r['peak_rss_mb']:.0f} MB", flush=True)
    for (preset, strategy), r in results.items():
        naive = results[(preset, "naive")]["pairs_per_second"]
        rows.append([
            preset, r["weights"], strategy, f"{r['pairs_per_second']:,.0f}", f"{r['pairs_per_second'] / naive:.2f}x",
            f"{r['naive_mflops_per_pair']:.1f}", f"{r['matmul_gflops']:.0f}", f"**{r['share_of_matmul']:.2f}**",
            f"{r['work_done_share']:.2f}" if "work_done_share" in r
            else ("1.00" if strategy in ("naive", "sorted-512") else "as scorer"),
            f"{100 * r['exact_softmax_share']:.1f}%" if "exact_softmax_share" in r else "",
            f"{r['floor_pairs_per_second']:,.0f}" if "floor_pairs_per_second" in r else "",
            f"{r['peak_rss_mb']:,.0f}",
        ])
    info = benchlib.machine()
    floors = "".join(
        f"\n- `{preset}`: the scorer runs at {r['pairs_per_second']:,.0f} pairs/s, "
        f"{r['pairs_per_second'] / r['floor_pairs_per_second']:.2f} of its floor "
        f"({r['floor_pairs_per_second']:,.0f} pairs/s), so a scorer doing the same arithmetic could be at most "
        f"{r['floor_pairs_per_second'] / r['pairs_per_second']:.1f}x "
        f"faster on this machine; `annotate`, start-up included, runs at "
        f"{results[(preset, 'annotate')]['pairs_per_second']:,.0f} pairs/s."
        for (preset, strategy), r in results.items() if strategy == "scorer")
    if floors:
        floors = "\nWhat the floor says, per preset:\n" + floors + "\n"
    scorer = results.get(("paper", "scorer"))
    sharing = ""
    if scorer:
        sharing = (
            f"\nOn these lines: {scorer['pairs'] / scorer['distinct_sources']:.2f} pairs per distinct source; "
            f"sharing source prefixes saves {100 * scorer['encoder_steps_saved']:.0f}% of the encoder steps of "
            f"encoding each distinct source on its own, and sharing target prefixes "
            f"{100 * scorer['decoder_steps_saved']:.0f}% of the decoder steps.\n"
        )
    return (
        f"## Annotate: scoring speed (`tools/bench_annotate.py`)\n\n"
        f"Command: `python tools/bench_annotate.py --lines {args.lines}"
        + "".join(f" --trained {preset}=MODEL" for preset in trained) + " --write` "
        f"on the first {args.lines:,} lines of `{table.name}` ({info['cpu']}, {info['cores']} cores, "
        f"torch {info['torch']}, fp32, {args.threads or info['cores']} threads).\n\n"
        "*weights*: `trained` (a model trained on the table) or `initial` (the paper's initialisation); "
        "*share* = naive FLOPs per pair x pairs/s / fp32 matmul rate measured in the same process just before; "
        "*work* = FLOPs the strategy actually runs / naive FLOPs; *vs naive* = speed-up over the naive scorer "
        "(pairs in file order, chunks of 64, every pair encoded on its own); *exact* = share of decoder steps whose "
        "softmax normaliser had to be recomputed exactly; *floor* = the pairs/s the scorer would reach if "
        "every product it runs went at the large-product rate (2048 x 2048 matrices) and every softmax entry's exp at "
        "the measured exp rate, with nothing else taking time: an upper bound for any scorer doing the same "
        "arithmetic. `annotate` is the whole command (read, score, gzip, write).\n\n"
        + benchlib.markdown_table(
            ["preset", "weights", "strategy", "pairs/s", "vs naive", "naive MFLOP/pair", "matmul GFLOP/s", "share",
             "work", "exact", "floor pairs/s", "peak RSS MB"],
            rows)
        + "\n" + sharing + floors
    )


def memory(args, work: Path) -> str:
    table = Path(args.table)
    big = benchlib.repeated_table(table, work / "table-x10.gz", times=10)
    model_dir = make_model_dir(work / "tiny", "tiny", table, work / "counts.json")
    rows = []
    peaks = {}
    for name, path in (("table", table), ("table x 10", big)):
        out = work / "annotated.gz"
        _, _, seconds, peak = benchlib.run_measured(
            benchlib.phrase_scorer_command("annotate", path, "-m", model_dir, "-o", out))
        lines = json.loads(Path(str(out) + ".json").read_text())["lines"]
        peaks[name] = peak
        rows.append([name, f"{lines:,}", f"{os.path.getsize(path) / 1e6:,.0f}", f"{seconds:,.0f}", f"{peak:,.0f}"])
        print(f"{name}: {lines} lines, {seconds:.0f}s, peak RSS {peak:.0f} MB", flush=True)
        out.unlink()
    ratio = peaks["table x 10"] / peaks["table"]
    return (
        "## Annotate: memory (`tools/bench_annotate.py --memory`)\n\n"
        f"Peak RSS of `phrase-scorer annotate` (tiny preset: the pipeline's own memory) on `{table.name}` and on the "
        f"same table repeated ten times. The larger table takes {ratio:.2f}x the memory.\n\n"
        + benchlib.markdown_table(["input", "lines", "gzip MB", "seconds", "peak RSS MB"], rows) + "\n"
    )


def whole_table(args, work: Path) -> str:
    table = Path(args.table)
    trained = trained_models(args)
    if not trained:
        raise SystemExit("--whole-table needs at least one --trained PRESET=DIR")
    rows = []
    for preset, model_dir in trained.items():
        out = work / "annotated.gz"
        _, _, seconds, peak = benchlib.run_measured(
            benchlib.phrase_scorer_command("annotate", table, "-m", model_dir, "-o", out))
        lines = json.loads(Path(str(out) + ".json").read_text())["lines"]
        rows.append([preset, f"{lines:,}", f"{seconds:,.0f}", f"{lines / seconds:,.0f}", f"{peak:,.0f}"])
        print(rows[-1], flush=True)
        out.unlink()
    info = benchlib.machine()
    return (
        "## Annotate: a whole table with a trained model (`tools/bench_annotate.py --whole-table`)\n\n"
        f"`phrase-scorer annotate {table.name} -m MODEL -o OUT.gz`, read, scored, gzipped and written, on this machine "
        f"({info['cpu']}, {info['cores']} cores, torch {info['torch']}, fp32); MODEL trained on that table.\n\n"
        + benchlib.markdown_table(["preset", "lines", "seconds", "lines/s", "peak RSS MB"], rows) + "\n"
    )


def main() -> None:
    parser, w = benchlib.bench_parser(__doc__, "worker")
    w.add_argument("--model-dir", required=True)
    w.add_argument("--pairs", required=True)
    w.add_argument("--strategy", required=True)
    w.add_argument("--threads", type=int, default=None)
    parser.add_argument("--lines", type=int, default=8000)
    parser.add_argument("--presets", default="tiny,small,paper")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--trained", action="append", default=[], metavar="PRESET=DIR",
                        help="use this trained model for PRESET instead of an untrained one (repeatable)")
    parser.add_argument("--memory", action="store_true", help="measure peak memory on the table and on 10 copies")
    parser.add_argument("--whole-table", action="store_true", help="annotate the whole table with each --trained model")
    args = parser.parse_args()
    if args.command == "worker":
        worker(args)
        return
    with benchlib.work_dir(args.work_dir, "bench-annotate-") as work:
        if args.memory:
            benchlib.report("bench_annotate_memory", memory(args, work), args.write)
        elif args.whole_table:
            benchlib.report("bench_annotate_whole", whole_table(args, work), args.write)
        else:
            benchlib.report("bench_annotate", speed(args, work), args.write)


if __name__ == "__main__":
    main()
