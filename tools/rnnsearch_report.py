#!/usr/bin/env python3
"""RNNsearch, the RNN Encoder-Decoder and Moses on one test set: the results section of docs/rnnsearch.md.

    python tools/rnnsearch_report.py --encdec ENCDEC_DIR --rnnsearch RNNSEARCH_DIR \\
        --moses VAL_HYP TEST_HYP --dev VAL_SRC VAL_REF --test TEST_SRC TEST_REF \\
        --work WORK_DIR [--beam 10] [--write]

1. Translates the dev and test sources with both models by beam search (what `phrase-scorer
   translate` does), into WORK_DIR. A translation is reused while the model's weights, the
   source file, the search settings and the device are those recorded beside it.
2. Scores the three systems (Moses' tokenised 1-best outputs VAL_HYP and TEST_HYP, and the two
   models' translations) on both sets with phrase_scorer.moses.evaluate.score: sacrebleu BLEU
   and chrF, with their signatures.
3. Plots BLEU by source sentence length on test and dev (Bahdanau et al. 2015, Figure 2), and
   RNNsearch's soft alignments for 4 test sentences with its own translations (Figure 3), as
   PNGs in docs/images/ (--images).
4. Prints the Markdown section: the results table, the signatures, the training command and
   record of each model (from its config.json, checkpoint and training log), the machine, and
   the images. With --write it replaces the part of docs/rnnsearch.md (--doc) between
   <!-- rnnsearch_report: begin --> and <!-- rnnsearch_report: end -->.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import benchlib  # noqa: E402

from phrase_scorer.config import TrainConfig, TranslateOptions  # noqa: E402
from phrase_scorer.errors import PhraseScorerError  # noqa: E402
from phrase_scorer.io.atomic import write_text_atomically  # noqa: E402
from phrase_scorer.io.file_identity import file_identity, file_sha256  # noqa: E402
from phrase_scorer.model_dir import BEST_WEIGHTS, CHECKPOINT, TRAIN_LOG, ModelDirectory  # noqa: E402
from phrase_scorer.moses.installation import read_lines  # noqa: E402

DOC = ROOT / "docs" / "rnnsearch.md"
IMAGES = ROOT / "docs" / "images"
BEGIN, END = "<!-- rnnsearch_report: begin -->", "<!-- rnnsearch_report: end -->"

MOSES, ENCDEC, RNNSEARCH = "Moses (phrase-based)", "RNN Encoder–Decoder", "RNNsearch"
MODELS = {ENCDEC: "encdec", RNNSEARCH: "rnnsearch"}  # system -> the architecture its model must have
SETS = ("dev", "test")
ALIGNMENT_PNG = "rnnsearch-alignment.png"  # each pair's heat map: rnnsearch-alignment-LINE.png


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- translations, cached in the work folder ------------------------------------------------------


def translation_record(model_dir: Path, source: Path, options: TranslateOptions, device: str) -> dict:
    """What a cached translation depends on."""
    return {"model": str(model_dir.resolve()), "weights_sha256": file_sha256(model_dir / BEST_WEIGHTS),
            "source": file_identity(source), "options": asdict(options), "device": device}


def translate_cached(model_dir: Path, source: Path, output: Path, options: TranslateOptions, device) -> Path:
    """``output``: the model's translation of ``source``, made now unless a matching one is there."""
    from phrase_scorer.runtime.device import device_label
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.generation.translate import translate_file

    record = translation_record(model_dir, source, options, device_label(device))
    meta = output.with_name(output.name + ".json")
    if output.exists() and meta.exists() and json.loads(meta.read_text(encoding="utf-8")) == record:
        say(f"reusing {output}")
        return output
    say(f"translating {source} with {model_dir} into {output}")
    meta.unlink(missing_ok=True)
    lines = translate_file(source, output, load_model(model_dir, device), options, overwrite=True)  # out of date
    write_text_atomically(meta, json.dumps(record, indent=1) + "\n")
    say(f"  {lines} lines")
    return output


# --- what each model's directory records about its training ---------------------------------------


def training_command(model_dir: Path, config: dict) -> str:
    """The ``phrase-scorer train`` command line that makes a model with these settings: the
    architecture and preset, and every training option whose value is not the default (file
    names without their folders)."""
    from phrase_scorer.cli.training import train as train_command

    options = {p.name: p.opts[0] for p in train_command.params}
    training = config.get("training", {})
    args: List[str] = ["phrase-scorer", "train"]
    if "corpus" in config:
        corpus = config["corpus"]
        args += ["--corpus", Path(corpus["source"]["path"]).name, Path(corpus["target"]["path"]).name]
        if corpus.get("dev_source") and corpus.get("dev_target"):
            args += ["--dev", Path(corpus["dev_source"]["path"]).name, Path(corpus["dev_target"]["path"]).name]
    elif "table" in config:
        args.append(Path(config["table"]["path"]).name)
    args += ["-o", model_dir.name, "--arch", config["model"]["arch"], "--preset", config["preset"]]
    defaults = asdict(TrainConfig())
    for name, value in training.items():
        if name in ("arch", "preset") or name not in options or value is None or value == defaults.get(name):
            continue
        args += [options[name], str(value)]
    return shlex.join(args)


def training_record(model_dir: Path) -> dict:
    """Settings, size and progress of a trained model, from config.json, the checkpoint's state
    and the training log."""
    from phrase_scorer.config import model_config_from_dict
    from phrase_scorer.model_dir import safe_torch_load
    from phrase_scorer.models.architectures import build_model
    from phrase_scorer.models.base import count_parameters

    import torch

    config = ModelDirectory(model_dir).read_config()
    with torch.device("meta"):
        model = build_model(model_config_from_dict(config["model"]), config["source_vocab_size"],
                            config["target_vocab_size"])
    state = {}
    if (model_dir / CHECKPOINT).exists():
        state = safe_torch_load(model_dir / CHECKPOINT).get("state", {})
    log = []
    if (model_dir / TRAIN_LOG).exists():
        for line in (model_dir / TRAIN_LOG).read_text(encoding="utf-8").splitlines():
            try:
                log.append(json.loads(line))
            except ValueError:
                continue
    best = [r for r in log if r.get("best")]
    last = log[-1] if log else {}
    return {
        "command": training_command(model_dir, config),
        "arch": config["model"]["arch"],
        "preset": config.get("preset", ""),
        "parameters": count_parameters(model),
        "steps": state.get("step", last.get("step")),
        "epoch": state.get("epoch", last.get("epoch")),
        "best_nll_token": best[-1].get("valid_nll_token") if best else None,
        "best_nll_pair": best[-1].get("valid_nll_pair") if best else None,
        "best_step": best[-1]["step"] if best else None,
        "train_seconds": state.get("train_seconds", last.get("train_seconds")),
        "device": state.get("device", ""),
        "precision": state.get("precision", ""),
        "stopped": state.get("stop_reason", "") if state.get("finished") else "not finished",
    }


# --- the section ------------------------------------------------------------------------------------


def number(value, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def hours(seconds: Optional[float]) -> str:
    if seconds is None:
        return "not recorded"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def from_root(argument: str) -> str:
    """A path argument as the command would be typed in the repository's root (no absolute paths
    in the page: they name one machine's folders); any other argument as it is."""
    if os.path.isabs(argument) and os.path.exists(argument):
        return os.path.relpath(argument, ROOT)
    return argument


def section(args, scores: Dict[str, Dict[str, object]], sizes: Dict[str, int], records: Dict[str, dict],
            options: TranslateOptions, device: str, images: Dict[str, List[Path]], alignment_lines: List[int],
            alignment_peaks: List[float], uniform: List[float]) -> str:
    doc_dir = Path(args.doc).resolve().parent

    def link(path: Path) -> str:
        return os.path.relpath(Path(path).resolve(), doc_dir)

    evaluation = scores[MOSES]["test"]
    out = [
        "Made by:", "", "```", shlex.join(["python", "tools/rnnsearch_report.py", *map(from_root, args.argv)]),
        "```", "",
        "| system | BLEU val | BLEU test | chrF test |", "|---|---:|---:|---:|",
    ]
    for system in (MOSES, ENCDEC, RNNSEARCH):
        out.append(f"| {system} | {number(scores[system]['dev'].bleu)} | {number(scores[system]['test'].bleu)} | "
                   f"{number(scores[system]['test'].chrf)} |")
    out += [
        "",
        f"Val: `{Path(args.dev[0]).name}` → `{Path(args.dev[1]).name}` ({sizes['dev']:,} sentences); test: "
        f"`{Path(args.test[0]).name}` → `{Path(args.test[1]).name}` ({sizes['test']:,} sentences). "
        f"Moses: its 1-best outputs `{Path(args.moses[0]).name}` (val) and `{Path(args.moses[1]).name}` (test). "
        f"The two models translate by beam search (`phrase-scorer translate`): beam {options.beam}, "
        f"hypotheses ranked by {'log p per token' if options.length_normalize else 'log p'}, at most "
        f"{options.max_length_ratio:g} × the source's words, on {device}.",
        "",
        f"sacrebleu signatures: BLEU `{evaluation.bleu_signature}`, chrF `{evaluation.chrf_signature}` "
        f"(references: {evaluation.references}).",
        "",
        "Training (each model's `config.json`, checkpoint and `train.log.jsonl`):",
        "",
        "```",
        *(records[system]["command"] for system in (ENCDEC, RNNSEARCH)),
        "```",
        "",
        "| system | arch | preset | parameters | steps | epochs | best validation NLL per token (per sentence) | "
        "at step | training time | device | stopped |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for system in (ENCDEC, RNNSEARCH):
        r = records[system]
        out.append(f"| {system} | {r['arch']} | {r['preset']} | {r['parameters']:,} | {r['steps'] or '–'} | "
                   f"{r['epoch'] if r['epoch'] is not None else '–'} | {number(r['best_nll_token'], 3)} "
                   f"({number(r['best_nll_pair'], 2)}) | {r['best_step'] or '–'} | {hours(r['train_seconds'])} | "
                   f"{r['device'] or 'not recorded'}{' ' + r['precision'] if r['precision'] else ''} | "
                   f"{r['stopped'] or '–'} |")
    info = benchlib.machine()
    out += [
        "",
        f"Translated and scored on: {info['cpu']}, {info['cores']} cores"
        + (f", {info['gpu']}" if "gpu" in info else "")
        + f"; PyTorch {info['torch']}, Python {info['python']}.",
        "",
        "BLEU by source sentence length (buckets of 5 words; the numbers of sentences in brackets):",
        "",
        f"![BLEU by source sentence length, test]({link(images['length'][0])})",
        "",
        f"![BLEU by source sentence length, val]({link(images['length'][1])})",
        "",
        f"RNNsearch's soft alignments with its own translations of test lines "
        f"{', '.join(map(str, alignment_lines))} (white: weight 1, black: 0):",
        "",
        *(f"![soft alignments, test line {line}]({link(png)})"
          for line, png in zip(alignment_lines, images["alignments"])),
        "",
        "The largest weight of each row (target word or </s>), averaged over the rows of each drawn sentence "
        "(1 where every word attends to one source word; uniform attention gives 1/|x|): "
        + "; ".join(f"line {line}: {peak:.2f} (1/|x| = {flat:.2f})"
                    for line, peak, flat in zip(alignment_lines, alignment_peaks, uniform))
        + (f"; mean {sum(alignment_peaks) / len(alignment_peaks):.2f}." if alignment_peaks else "."),
    ]
    return "\n".join(out) + "\n"


# --- the run ----------------------------------------------------------------------------------------


def report(args) -> str:
    from phrase_scorer.analysis.alignments import plot_alignments
    from phrase_scorer.config import AlignmentPlotOptions
    from phrase_scorer.analysis.bleu_by_length import bleu_by_length, plot_bleu_by_length
    from phrase_scorer.runtime.device import device_label, resolve_device
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.moses.evaluate import score

    model_dirs = {ENCDEC: Path(args.encdec), RNNSEARCH: Path(args.rnnsearch)}
    for system, arch in MODELS.items():
        found = ModelDirectory(model_dirs[system]).model_config().arch
        if found != arch:
            raise PhraseScorerError(f"is a model of arch {found}, not {arch}", path=model_dirs[system],
                                    hint=f"give the {arch} model to --{arch}")
    device = resolve_device(args.device)
    options = TranslateOptions(beam=args.beam)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sets = {"dev": [Path(p) for p in args.dev], "test": [Path(p) for p in args.test]}
    hypotheses = {MOSES: {"dev": Path(args.moses[0]), "test": Path(args.moses[1])}}
    for system, model_dir in model_dirs.items():
        hypotheses[system] = {name: translate_cached(model_dir, source, work / f"{MODELS[system]}.{name}.hyp", options,
                                                     device)
                              for name, (source, _) in sets.items()}

    scores: Dict[str, Dict[str, object]] = {}
    lines = {name: {path: read_lines(path) for path in paths} for name, paths in sets.items()}
    for system, files in hypotheses.items():
        scores[system] = {}
        for name, (source, reference) in sets.items():
            hyps = read_lines(files[name])
            if len(hyps) != len(lines[name][source]):
                raise PhraseScorerError(f"has {len(hyps)} lines for the {len(lines[name][source])} of {source}",
                                        path=files[name])
            scores[system][name] = score(hyps, lines[name][reference], hypotheses_path=str(files[name]))
            say(f"{system}, {name}: BLEU {scores[system][name].bleu:.2f}, chrF {scores[system][name].chrf:.2f}")

    images_dir = Path(args.images)
    images_dir.mkdir(parents=True, exist_ok=True)
    length_pngs = []
    for name in ("test", "dev"):
        source, reference = sets[name]
        result = bleu_by_length(lines[name][source], lines[name][reference],
                                {system: read_lines(files[name]) for system, files in hypotheses.items()},
                                min_count=args.min_count)
        png = images_dir / f"rnnsearch-bleu-by-length-{name}.png"
        plot_bleu_by_length(result, png, title=f"{'test' if name == 'test' else 'val'}: {Path(source).name}")
        length_pngs.append(png)

    plots = plot_alignments(load_model(model_dirs[RNNSEARCH], device), sets["test"][0], hypotheses[RNNSEARCH]["test"],
                            images_dir / ALIGNMENT_PNG, AlignmentPlotOptions(count=args.alignments, seed=args.seed),
                            overwrite=True)
    kept = {Path(p.png).name for p in plots}
    for old in images_dir.glob(f"{Path(ALIGNMENT_PNG).stem}-*.png"):
        if old.name not in kept:
            old.unlink()  # a heat map of an earlier run's lines
    records = {system: training_record(model_dirs[system]) for system in model_dirs}
    return section(args, scores, {name: len(lines[name][paths[0]]) for name, paths in sets.items()}, records,
                   options, device_label(device), {"length": length_pngs, "alignments": [Path(p.png) for p in plots]},
                   [p.pair.line for p in plots], [float(p.pair.weights.max(axis=1).mean()) for p in plots],
                   [1.0 / p.pair.weights.shape[1] for p in plots])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--encdec", required=True, help="the RNN Encoder-Decoder's model directory")
    parser.add_argument("--rnnsearch", required=True, help="RNNsearch's model directory")
    parser.add_argument("--moses", nargs=2, required=True, metavar=("VAL_HYP", "TEST_HYP"),
                        help="Moses' tokenised 1-best outputs for the dev and test sources")
    parser.add_argument("--dev", nargs=2, required=True, metavar=("SRC", "REF"), help="dev (val) source and reference")
    parser.add_argument("--test", nargs=2, required=True, metavar=("SRC", "REF"), help="test source and reference")
    parser.add_argument("--work", required=True, help="folder for the models' translations (reused when current)")
    parser.add_argument("--beam", type=int, default=TranslateOptions.beam, help="beam width (default %(default)s)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the models translate")
    parser.add_argument("--min-count", type=int, default=50,
                        help="fewest sentences in a length bucket (default %(default)s)")
    parser.add_argument("--alignments", type=int, default=4, help="test sentences with heat maps (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="draws the heat maps' sentences (default %(default)s)")
    parser.add_argument("--images", default=str(IMAGES), help="folder for the PNGs (default docs/images)")
    parser.add_argument("--doc", default=str(DOC),
                        help="page whose marked section --write replaces (default docs/rnnsearch.md)")
    parser.add_argument("--write", action="store_true", help="put the section into --doc")
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    try:
        markdown = report(args)
    except PhraseScorerError as exc:
        raise SystemExit(f"rnnsearch_report.py: error: {exc}") from None
    print(markdown, end="")
    if args.write:
        benchlib.replace_marked(Path(args.doc), BEGIN, END, markdown)


if __name__ == "__main__":
    main()
