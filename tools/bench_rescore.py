#!/usr/bin/env python3
"""Rescoring speed: hypotheses per second of ``phrase-scorer rescore`` with sentence models on
the CPU, and where the time of the one-command path (``translate-system --moses --reranker``) goes.

    python tools/bench_rescore.py --model NAME=DIR [--model NAME=DIR ...] [--reverse-model NAME=DIR]
        [--nbest NBEST --source SRC] [--sentences 200] [--threads 1,2] [--repeats 2] [--before CHECKOUT]
        [--reranker RERANKER --moses-ini INI --translate-sentences 100 --references REF]
        [--parts throughput,int8,path] [--precisions fp32,int8] [--write]

1. Throughput: the first --sentences sentences of NBEST (default: the shared Moses system's
   100-best list of val and its source) are rescored by each model alone (one feature) and by
   all of them together (one feature each), with each --threads count: the best of --repeats
   runs of the whole command (start-up and model loading included), as hypotheses/s and
   predicted target tokens/s (words + </s>). *GFLOP/s* counts each hypothesis as the
   teacher-forced forward pass of its model(s) at the pair's own lengths
   (``models.architectures.FORWARD_FLOPS``: what scoring it on its own would compute, before the
   sharing of sources and prefixes), and *share* divides it by the fp32 matmul rate measured in
   the same run with the same thread count. With --before CHECKOUT (a checkout of an earlier
   version of the package) every command also runs with that checkout's package, alternating
   with this one's, so the table compares the two on the same machine in the same run.
2. The one-command path (with --reranker, --moses-ini and MOSES_HOME): ``phrase-scorer translate
   --moses INI --reranker RERANKER`` of the first --translate-sentences lines of SOURCE (its
   defaults: Moses and the models at once), the seconds it spent in Moses (decoding the n-best
   lists), rescoring and reranking, as the command reports them, and Moses' own n-best decoding
   of the same sentences (the reranker's list size and flags, the same decoder threads) in the
   same run; with --references, the BLEU of the translation (sacrebleu on the tokenised text).
   With --precisions fp32,int8 the path runs once with each ``--precision``, with --bounds
   bound,no-bound once with each of ``--bound`` and ``--no-bound``, and with --batch-tokens
   8192,65536 once with each ``--batch-tokens``; --device puts the models on that device
   (translate's ``--device``; the table names the GPU).
3. int8 (``--parts int8``): each model's ``rescore`` of the list's head with ``--precision fp32``
   and ``--precision int8``: hypotheses/s of each, and how far int8 moves the hypotheses' log p
   and the model's own choice of the best hypothesis of each sentence.

Time it on an otherwise idle machine: every figure is a wall-clock time.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

SHARED = benchlib.ROOT.parent / "shared" / "data"
DEFAULT_NBEST = SHARED / "moses-multi30k-en-fr" / "val.nbest.gz"
DEFAULT_SOURCE = SHARED / "multi30k-en-fr" / "val.tok.en.gz"
PHASES = re.compile(r"Moses ([\d.]+) s, rescoring ([\d.]+) s, reranking ([\d.]+) s; waiting for Moses ([\d.]+) s")


def open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")


def nbest_head(nbest: Path, source: Path, sentences: int, work: Path) -> Tuple[Path, Path, int, List[Tuple[int, int]]]:
    """The list's lines of its first ``sentences`` sentences and those source lines, as files in
    ``work``; the number of sentences found, and (source words, hypothesis words) per hypothesis."""
    head, head_source = work / f"head{sentences}.nbest", work / f"head{sentences}.src"
    hypothesis_words: List[Tuple[int, int]] = []  # (sentence id, words) per hypothesis
    found = 0  # sentences in the list's head (a shorter list has fewer than asked)
    with open_text(nbest) as lines, open(head, "w", encoding="utf-8") as out:
        for line in lines:
            sentence = int(line.split(" ||| ", 1)[0])
            if sentence >= sentences:
                break
            found = sentence + 1
            out.write(line)
            hypothesis_words.append((sentence, len(line.split(" ||| ")[1].split())))
    source_words = []
    with open_text(source) as lines, open(head_source, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if i >= found:
                break
            out.write(line)
            source_words.append(len(line.split()))
    return head, head_source, found, [(source_words[i], words) for i, words in hypothesis_words]


def forward_flops(directory: str, reverse: bool, lengths: Sequence[Tuple[int, int]]) -> float:
    """FLOPs of the teacher-forced forward pass of each (source words, hypothesis words) pair
    under the model in ``directory`` (a reverse model reads the hypothesis and predicts the
    source), summed: the work of scoring every hypothesis on its own, in words (a subword
    model's pieces are not counted)."""
    from phrase_scorer.config import model_config_from_dict
    from phrase_scorer.models.architectures import FORWARD_FLOPS

    record = json.loads((Path(directory) / "config.json").read_text())
    config = model_config_from_dict(record["model"])
    count = FORWARD_FLOPS[config.arch]
    return sum(count(config, record["target_vocab_size"], *((t, s) if reverse else (s, t)))["total"]
               for s, t in lengths)


def matmul_rates(threads: Sequence[int]) -> Dict[int, float]:
    """The fp32 matmul rate (FLOP/s) with each thread count."""
    import torch

    rates = {}
    for count in threads:
        torch.set_num_threads(count)
        rates[count] = benchlib.matmul_rate()
    return rates


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


def versions(before: Optional[str]) -> List[Tuple[str, Path]]:
    """(label, checkout) of each version a command runs with: this checkout's package, and with
    ``before`` that checkout's. A command runs in its checkout's folder with PYTHONPATH naming it
    (``python -m`` puts the working folder first on the path)."""
    if before is None:
        return [("this", benchlib.ROOT)]
    return [("before", Path(before).resolve()), ("after", benchlib.ROOT)]


def throughput(args, work: Path) -> str:
    nbest, source, sentences, lengths = nbest_head(Path(args.nbest), Path(args.source), args.sentences,
                                                   work.resolve())
    hypotheses, tokens = len(lengths), sum(t + 1 for _, t in lengths)
    forward = [(name, os.path.abspath(d)) for name, d in named(args.model)]
    reverse = [(name, os.path.abspath(d)) for name, d in named(args.reverse_model)]
    flops = {name: forward_flops(d, False, lengths) for name, d in forward}
    flops.update({name: forward_flops(d, True, lengths) for name, d in reverse})
    sets = [([m], []) for m in forward] + [([], [m]) for m in reverse]
    if len(forward) + len(reverse) > 1:
        sets.append((forward, reverse))
    rates = matmul_rates(args.threads)
    rows = []
    for models_forward, models_reverse in sets:
        label = " + ".join(n for n, _ in [*models_forward, *models_reverse])
        work_flops = sum(flops[n] for n, _ in [*models_forward, *models_reverse])
        for threads in args.threads:
            command = benchlib.phrase_scorer_command(
                "rescore", nbest, "--source", source, *model_args(models_forward, models_reverse),
                "--threads", threads, "-o", work.resolve() / "out.nbest", "--overwrite")
            best: Dict[str, float] = {}
            for _ in range(args.repeats):  # the versions alternate: a load that comes and goes hits both
                for version, checkout in versions(args.before):
                    seconds = benchlib.run_measured(command, env=dict(os.environ, PYTHONPATH=str(checkout)),
                                                    cwd=checkout)[2]
                    best[version] = min(best.get(version, seconds), seconds)
            for version, seconds in best.items():
                rate = work_flops / seconds
                rows.append([label, threads, version, f"{hypotheses:,}", f"{seconds:.1f}",
                             f"{hypotheses / seconds:,.0f}", f"{tokens / seconds:,.0f}", f"{rate / 1e9:.3g}",
                             f"{rate / rates[threads]:.2f}"])
                print(rows[-1], file=sys.stderr, flush=True)
    info = benchlib.machine()
    compared = (f" `before` is the package of the checkout `{Path(args.before).name}`, `after` this one's, the two "
                "alternating run by run." if args.before else "")
    return (
        "## Rescoring: hypotheses per second on the CPU (`tools/bench_rescore.py`)\n\n"
        f"`phrase-scorer rescore` of the first {sentences} sentences of `{Path(args.nbest).name}` "
        f"({hypotheses:,} hypotheses, {tokens:,} predicted target tokens), each model alone and all together, "
        f"best of {args.repeats} runs of the whole command (start-up and loading included), on {info['cpu']} "
        f"({info['cores']} cores), torch {info['torch']}; fp32 matmul rate in the same run: "
        + ", ".join(f"{rates[t] / 1e9:.0f} GFLOP/s on {t} thread{'s' if t > 1 else ''}" for t in args.threads)
        + ". *GFLOP/s*: the teacher-forced forward FLOPs of every hypothesis at its own lengths (before the sharing "
        "of sources and prefixes) per second; *share*: of the matmul rate with the same threads. Models: "
        + ", ".join(f"{n} `{d}`" for n, d in [*forward, *reverse]) + "." + compared + "\n\n"
        + benchlib.markdown_table(["models", "threads", "version", "hypotheses", "seconds", "hypotheses/s",
                                   "tokens/s", "GFLOP/s", "share"], rows)
        + f"\n\nCommand: `python tools/bench_rescore.py {' '.join(sys.argv[1:])}`.\n"
    )


def int8_effect(args, work: Path) -> str:
    """Each model's ``rescore`` of the list's head in fp32 and in int8: the speed of the whole
    command (best of --repeats, the two alternating), and how far int8 moves each hypothesis's
    log p (read back from the two outputs, 6 significant digits) and which hypothesis the model
    alone would rank first."""
    import numpy as np

    from phrase_scorer.io.nbest import read_nbest

    nbest, source, sentences, lengths = nbest_head(Path(args.nbest), Path(args.source), args.sentences,
                                                   work.resolve())
    hypotheses = len(lengths)
    models = [(name, os.path.abspath(d), False) for name, d in named(args.model)]
    models += [(name, os.path.abspath(d), True) for name, d in named(args.reverse_model)]
    speed_rows, score_rows = [], []
    for name, directory, reverse in models:
        model = model_args([] if reverse else [(name, directory)], [(name, directory)] if reverse else [])
        outputs = {}
        for threads in args.threads:
            best: Dict[str, float] = {}
            for _ in range(args.repeats):
                for precision in ("fp32", "int8"):
                    outputs[precision] = work.resolve() / f"{name}.{precision}.nbest"
                    command = benchlib.phrase_scorer_command(
                        "rescore", nbest, "--source", source, *model, "--threads", threads, "--precision", precision,
                        "-o", outputs[precision], "--overwrite")
                    seconds = benchlib.run_measured(command)[2]
                    best[precision] = min(best.get(precision, seconds), seconds)
            speed_rows.append([name, threads, f"{hypotheses / best['fp32']:,.0f}", f"{hypotheses / best['int8']:,.0f}",
                               f"{best['fp32'] / best['int8']:.2f}"])
            print(speed_rows[-1], file=sys.stderr, flush=True)
        values = {p: [(e.sentence_id, e.feature(name)[0], len(e.hypothesis.split())) for e in read_nbest(path)]
                  for p, path in outputs.items()}
        sentence_ids = np.array([v[0] for v in values["fp32"]])
        fp32, int8 = (np.array([v[1] for v in values[p]]) for p in ("fp32", "int8"))
        predicted = np.array([(lengths[i][0] if reverse else v[2]) + 1 for i, v in enumerate(values["fp32"])])
        moved = np.abs(int8 - fp32)
        firsts = np.flatnonzero(np.r_[True, sentence_ids[1:] != sentence_ids[:-1]])
        best_changed = sum(int(np.argmax(fp32[a:b]) != np.argmax(int8[a:b]))
                           for a, b in zip(firsts, [*firsts[1:], len(fp32)]))
        score_rows.append([name, "reverse" if reverse else "forward", f"{hypotheses:,}", f"{moved.mean():.4f}",
                           f"{np.percentile(moved, 99):.4f}", f"{moved.max():.4f}",
                           f"{(moved / predicted).mean():.5f}", f"{100 * best_changed / len(firsts):.1f}%"])
    info = benchlib.machine()
    return (
        "## int8 against fp32: the scores and the speed (`tools/bench_rescore.py --parts int8`)\n\n"
        f"`phrase-scorer rescore --precision fp32` and `--precision int8` of the first {sentences} sentences of "
        f"`{Path(args.nbest).name}` ({hypotheses:,} hypotheses), each model on its own, on {info['cpu']} "
        f"({info['cores']} cores), torch {info['torch']}. |Δ| is |log p(int8) - log p(fp32)| per hypothesis, in "
        "nats, as the two lists print them (6 significant digits); *per token*: divided by the predicted tokens "
        "(words + </s>); *best changed*: the sentences whose hypothesis with the highest log p under the model "
        "changes.\n\n"
        + benchlib.markdown_table(["model", "direction", "hypotheses", "mean \\|Δ\\|", "p99 \\|Δ\\|",
                                   "max \\|Δ\\|", "mean \\|Δ\\| per token", "best changed"], score_rows)
        + f"\n\nSpeed: hypotheses/s of the whole command (start-up and loading included), best of {args.repeats} "
        "runs of each, the two precisions alternating.\n\n"
        + benchlib.markdown_table(["model", "threads", "fp32", "int8", "int8 / fp32"], speed_rows)
        + f"\n\nCommand: `python tools/bench_rescore.py {' '.join(sys.argv[1:])}`.\n"
    )


def moses_alone(args, source: Path, work: Path) -> float:
    """Seconds of Moses' own n-best decoding of ``source``, with the reranker's list size and
    decoder flags and the same decoder threads (loading included)."""
    from phrase_scorer.moses.evaluate import Decoding, decode
    from phrase_scorer.moses.installation import MosesInstallation

    record = json.loads(Path(args.reranker).read_text())["decoder"]
    flags = f"{record.get('decoder_flags') or ''} -n-best-list {work / 'alone.nbest'} {record['nbest_size']} distinct"
    started = time.perf_counter()
    decode(args.moses_ini, source, work / "alone.1best", moses=MosesInstallation.find(None),
           decoding=Decoding(threads=args.decoder_threads or None, decoder_flags=flags.strip()))
    return time.perf_counter() - started


def one_command(args, work: Path) -> str:
    source = work / f"translate{args.translate_sentences}.src"
    with open_text(Path(args.source)) as lines, open(source, "w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            if i >= args.translate_sentences:
                break
            out.write(line)
    decoder_threads = ["--decoder-threads", args.decoder_threads] if args.decoder_threads else []  # 0: the default
    chunks = ["--chunk-sentences", args.chunk_sentences] if args.chunk_sentences else []
    references = None
    if args.references:
        with open_text(Path(args.references)) as lines:
            references = [line.rstrip("\n") for _, line in zip(range(args.translate_sentences), lines)]
    device = ["--device", args.device] if args.device else []
    runs = []
    for precision, bound, tokens in [(p, b, t) for t in args.batch_tokens for b in args.bounds
                                     for p in args.precisions]:  # each a whole translate run
        translation = work / f"translation.{precision}.{bound}.{tokens}.txt"
        batch = ["--batch-tokens", tokens] if tokens else []
        _, err, seconds, _ = benchlib.run_measured(benchlib.phrase_scorer_command(
            "translate-system", "--moses", args.moses_ini, "--reranker", args.reranker, source, "-o", translation,
            "--overwrite", "--precision", precision, f"--{bound}", *decoder_threads, *chunks, *device, *batch))
        match = PHASES.search(err)
        if not match:
            raise SystemExit(f"translate did not report its phases:\n{err[-2000:]}")
        _, rescoring, reranking, waiting = (float(g) for g in match.groups())
        bleu = None
        if references is not None:
            from phrase_scorer.moses.evaluate import score

            hypotheses = translation.read_text(encoding="utf-8").splitlines()
            bleu = score(hypotheses, references, kind="tokenized", lang=args.lang).bleu
        label = f"{precision}, --{bound}" + (f", --batch-tokens {tokens}" if tokens else "")
        runs.append((label, seconds, waiting, rescoring, reranking, bleu))
    alone = moses_alone(args, source, work)
    rows = [[precision, f"{seconds:.1f}", f"{args.translate_sentences / seconds:.1f}", f"{seconds / alone:.2f}",
             f"{waiting:.1f}", f"{rescoring:.1f}", f"{reranking:.1f}",
             f"{max(seconds - waiting - rescoring - reranking, 0):.1f}", "-" if bleu is None else f"{bleu:.2f}"]
            for precision, seconds, waiting, rescoring, reranking, bleu in runs]
    info = benchlib.machine()
    return (
        "## The one-command path: where the time goes (`tools/bench_rescore.py --reranker ...`)\n\n"
        f"`phrase-scorer translate-system --moses {Path(args.moses_ini).name} --reranker {Path(args.reranker).name}` "
        "of the "
        f"first {args.translate_sentences} sentences of `{Path(args.source).name}` (decoder threads "
        f"{args.decoder_threads or 'as translate sets them'}, chunks of "
        f"{args.chunk_sentences or 'the default'} sentences), each `--precision` and `--bound`/`--no-bound` a run "
        "of its own, on "
        f"{info['cpu']} ({info['cores']} cores)"
        + (f", the models on {info.get('gpu', args.device)} (torch {info['torch']})" if args.device else "")
        + ". Moses alone, the same lists of the same sentences with the same "
        f"flags in the same run: {alone:.1f} s ({args.translate_sentences / alone:.1f} sentences/s)."
        + (f" BLEU against `{Path(args.references).name}`." if references is not None else "") + "\n\n"
        + benchlib.markdown_table(["run", "seconds", "sentences/s", "x Moses alone", "waiting for Moses",
                                   "rescoring", "reranking", "the rest", "BLEU"], rows)
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
    parser.add_argument("--decoder-threads", type=int, default=1, help="Moses' threads; 0: translate's default")
    parser.add_argument("--chunk-sentences", type=int, default=0, help="translate's --chunk-sentences; 0: its default")
    parser.add_argument("--before", default=None, metavar="CHECKOUT",
                        help="a checkout of an earlier version: each rescore command also runs with its package")
    parser.add_argument("--references", default=None, help="references of SOURCE, for the path's BLEU")
    parser.add_argument("--lang", default="fr", help="the target language of --references")
    parser.add_argument("--parts", default="throughput,path",
                        help="throughput, int8 (each model in fp32 and int8), path (the path needs --reranker)")
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32"],
                        help="the path: translate's --precision of each run (fp32,int8: one run each)")
    parser.add_argument("--batch-tokens", type=lambda s: [int(t) for t in s.split(",")], default=[0],
                        help="the path: translate's --batch-tokens of each run (0: its default)")
    parser.add_argument("--device", default=None, help="the path: translate's --device (default: its own)")
    parser.add_argument("--bounds", type=lambda s: s.split(","), default=["bound"],
                        help="the path: bound, no-bound or both (translate's --bound/--no-bound; one run each)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    with benchlib.work_dir(args.work_dir, "bench-rescore-") as work:
        if "throughput" in parts:
            if not args.model and not args.reverse_model:
                parser.error("give at least one --model NAME=DIR")
            benchlib.report("bench_rescore_throughput", throughput(args, work), args.write)
        if "int8" in parts:
            if not args.model and not args.reverse_model:
                parser.error("give at least one --model NAME=DIR")
            benchlib.report("bench_rescore_int8", int8_effect(args, work), args.write)
        if "path" in parts and args.reranker:
            if not args.moses_ini:
                parser.error("--reranker needs --moses-ini")
            benchlib.report("bench_rescore_path", one_command(args, work), args.write)


if __name__ == "__main__":
    main()
