#!/usr/bin/env python3
"""The Transformer beside RNNsearch: scoring speed on the CPU, the one-pass scores against the
step-by-step ones, and the learning curve of its training runs.

    python tools/bench_transformer.py --model NAME=DIR [--model NAME=DIR ...] [--reverse-model NAME=DIR ...]
        [--nbest NBEST --source SRC]
        [--sentences 200] [--threads 1,2] [--repeats 3] [--parts speed,agreement] [--write]
    python tools/bench_transformer.py --parts curve --run LABEL=DIR [--run ...] --idle-seconds LABEL=S [--write]

1. ``speed``: the hypotheses of the first --sentences sentences of NBEST, looked up once, scored
   by ``BatchScorer.score`` (the scorer alone, as ``rescore``'s main process runs it, without
   reading or writing the list) with each model, the best of --repeats timings, with each
   --threads count; a model that scores in one pass (the Transformer) also step by step
   through the trie of its targets (``ScoringOptions(one_pass=False)``) and as the CPU's default
   chooses batch by batch. A --reverse-model scores each source sentence given each hypothesis
   (as ``rescore --reverse-model`` does: one target per source). Every figure of a table comes
   from the same run on the same machine.
2. ``agreement``: for each model that scores in one pass, how far its one-pass scores of the same
   hypotheses are from the step-by-step ones and from the naive forward pass in fp64 (the
   reference): max and mean |Δ| in nats, and the share of scores whose 6 printed significant
   digits (what ``rescore`` writes) differ.
3. ``curve``: dev BLEU (greedy) and NLL at each validation of training runs (their
   ``train.log.jsonl``), placed at idle time by --idle-seconds LABEL=S, the idle seconds of one
   update of that run's command (measured alone on the machine; a model's weights at update k do
   not depend on the load, only its speed does), validations not counted.

Time ``speed`` on an otherwise idle machine: its figures are wall-clock rates.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SHARED = benchlib.ROOT.parent / "shared" / "data"
DEFAULT_NBEST = SHARED / "moses-multi30k-en-fr" / "val.nbest.gz"
DEFAULT_SOURCE = SHARED / "multi30k-en-fr" / "val.tok.en.gz"


def read_head(nbest: Path, source: Path, sentences: int) -> Tuple[List[List[str]], List[List[str]]]:
    """(source words, hypothesis words) of every hypothesis of the first ``sentences`` sentences."""
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt", encoding="utf-8") as f:
        lines = [next(f).split() for _ in range(sentences)]
    sources, hypotheses = [], []
    with (gzip.open if nbest.suffix == ".gz" else open)(nbest, "rt", encoding="utf-8") as f:
        for line in f:
            fields = line.split(" ||| ")
            if int(fields[0]) >= sentences:
                break
            sources.append(lines[int(fields[0])])
            hypotheses.append(fields[1].split())
    return sources, hypotheses


def ids_for(loaded, sources, hypotheses):
    """The ids of the pairs as the model reads them (a right-to-left model's targets reversed)."""
    src = [loaded.source_vocab.encode(s) for s in sources]
    tgt = [loaded.target_vocab.in_model_order(loaded.target_vocab.encode(h)) for h in hypotheses]
    return src, tgt


def timed(score, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        score()
        best = min(best, time.perf_counter() - began)
    return best


def speed(models: Dict[str, object], pairs, threads: Sequence[int], repeats: int) -> str:
    import torch

    from phrase_scorer.config import ScoringOptions
    from phrase_scorer.models.architectures import FORWARD_FLOPS
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    rows = []
    for name, loaded in models.items():
        src, tgt = pairs[name]
        modes = ([("one pass", True), ("step by step", False), ("the CPU's default", None)]
                 if loaded.model.scores_in_one_pass else [("steps", None)])
        flops = sum(FORWARD_FLOPS[loaded.config.arch](loaded.config, loaded.model.target_vocab_size, len(s), len(t))
                    ["total"] for s, t in zip(src, tgt))
        for count in threads:
            torch.set_num_threads(count)
            for mode, one_pass in modes:
                scorer = BatchScorer(loaded.model, ScoringOptions(one_pass=one_pass))
                scorer.score(src[:200], tgt[:200])  # warm up
                seconds = timed(lambda: scorer.score(src, tgt), repeats)
                rows.append((name, loaded.config.arch, mode, count, f"{len(src):,}",
                             f"{seconds:.2f}", f"{len(src) / seconds:,.0f}",
                             f"{sum(len(t) + 1 for t in tgt) / seconds:,.0f}", f"{flops / seconds / 1e9:.1f}"))
    return benchlib.markdown_table(["model", "network", "decoding", "threads", "hypotheses", "seconds",
                                    "hypotheses/s", "tokens/s", "GFLOP/s"], rows)


def agreement(models: Dict[str, object], pairs) -> str:
    from phrase_scorer.config import ScoringOptions
    from phrase_scorer.scoring.batch_scorer import BatchScorer, log_probs_by_forward

    rows = []
    for name, loaded in models.items():
        if not loaded.model.scores_in_one_pass:
            continue
        src, tgt = pairs[name]
        one = BatchScorer(loaded.model, ScoringOptions(one_pass=True)).score(src, tgt)
        steps = BatchScorer(loaded.model, ScoringOptions(one_pass=False)).score(src, tgt)
        reference = log_probs_by_forward(loaded.model.double(), src, tgt)
        loaded.model.float()
        printed = np.array([f"{v:.6g}" for v in one]) != np.array([f"{v:.6g}" for v in steps])
        for label, other in (("one pass against step by step", steps), ("one pass against fp64", reference),
                             ("step by step against fp64", None)):
            a, b = (one, other) if other is not None else (steps, reference)
            delta = np.abs(a - b)
            rows.append((name, label, f"{len(src):,}", f"{delta.max():.1e}", f"{delta.mean():.1e}",
                         f"{100 * printed.mean():.1f}%" if other is steps else "-"))
    return benchlib.markdown_table(["model", "scores", "hypotheses", "max |Δ| (nats)", "mean |Δ|",
                                    "6 printed digits differ"], rows)


def curve(runs: Dict[str, Path], idle: Dict[str, float]) -> str:
    rows = []
    for label, folder in runs.items():
        for line in (folder / "train.log.jsonl").read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "valid_bleu" not in record:
                continue
            minutes = record["step"] * idle[label] / 60
            rows.append((label, f"{record['step']:,}", f"{minutes:.1f}", f"{record['valid_bleu']:.2f}",
                         f"{record['valid_nll_token']:.3f}", f"{record['lr']:.2e}"))
    return benchlib.markdown_table(["run", "update", "idle minutes", "dev BLEU", "dev NLL/token", "rate"], rows)


def pairs_of(text: List[str]) -> Dict[str, str]:
    out = {}
    for item in text:
        name, _, value = item.partition("=")
        out[name] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--reverse-model", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--nbest", type=Path, default=DEFAULT_NBEST)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="speed,agreement")
    parser.add_argument("--run", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument("--idle-seconds", action="append", default=[], metavar="LABEL=SECONDS")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    parts = args.parts.split(",")
    info = benchlib.machine()
    where = f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}"
    command = "python tools/bench_transformer.py " + " ".join(sys.argv[1:])
    if "speed" in parts or "agreement" in parts:
        from phrase_scorer.model_dir import load_model

        models = {name: load_model(folder, "cpu") for name, folder in pairs_of(args.model).items()}
        reverse = {name: load_model(folder, "cpu") for name, folder in pairs_of(args.reverse_model).items()}
        sources, hypotheses = read_head(args.nbest, args.source, args.sentences)
        pairs = {name: ids_for(loaded, sources, hypotheses) for name, loaded in models.items()}
        pairs.update({name: ids_for(loaded, hypotheses, sources) for name, loaded in reverse.items()})
        models.update(reverse)
        head = (f"The hypotheses of the first {args.sentences} sentences of `{args.nbest.name}` "
                f"({len(hypotheses):,}), on {where}. Command: `{command}`.\n\n")
        if "speed" in parts:
            table = speed(models, pairs, [int(t) for t in args.threads.split(",")], args.repeats)
            benchlib.report("transformer_speed", "## The Transformer beside RNNsearch: scoring speed on the CPU "
                            "(`tools/bench_transformer.py --parts speed`)\n\n" + head + table, args.write)
        if "agreement" in parts:
            table = agreement(models, pairs)
            benchlib.report("transformer_agreement", "## The Transformer's one pass against its steps "
                            "(`tools/bench_transformer.py --parts agreement`)\n\n" + head + table, args.write)
    if "curve" in parts:
        idle = {k: float(v) for k, v in pairs_of(args.idle_seconds).items()}
        table = curve({k: Path(v) for k, v in pairs_of(args.run).items()}, idle)
        benchlib.report("transformer_curve", "## Learning: the Transformer `small` on 2 CPU cores "
                        "(`tools/bench_transformer.py --parts curve`)\n\n"
                        f"Dev BLEU (val 2016, greedy) at each validation, the update placed at idle time by "
                        f"the idle seconds per update of the same command alone on {where} "
                        f"({', '.join(f'{k}: {v:g} s' for k, v in idle.items())}). Command: `{command}`.\n\n"
                        + table, args.write)


if __name__ == "__main__":
    main()
