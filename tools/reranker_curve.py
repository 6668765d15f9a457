"""What build-reranker buys against training time: test BLEU of the reranked system after each
training budget, one Markdown table row per budget.

    python tools/reranker_curve.py --system SYSTEM/moses.tuned.ini --corpus train.S train.T \\
        --tuning-set dev.S dev.T --test test.S test.T --lang T --work WORK --budgets 1,3,8 \\
        [-- BUILD-RERANKER OPTIONS...]

For each budget B (hours of training for all models together), in increasing order, it runs
``phrase-scorer build-reranker ... --budget B -o WORK`` (a larger budget trains each model on from
its checkpoint, and the steps after training run again on the models it gives), translates the
test set through the reranked system (``translate-system --moses --reranker``) and scores it against
Moses' own 1-best of the tuned system (sacrebleu BLEU and chrF, paired bootstrap p). A row gives
the updates each model reached and its training seconds (from the models' train.log.jsonl): a
budget is wall-clock time, so on a busy machine fewer updates fit in it; the updates are what
decide the quality. MOSES_HOME must point to a Moses build. The figures are written to
WORK/curve.md as well.

Each budget's row is kept in WORK/curve/row.budgetB.json once its test set is scored, and a later
run prints that row again instead of building it: the models have trained on past that budget
since, so building it again would measure the larger budget under the smaller one's name.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def phrase_scorer(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "phrase_scorer", *args], check=True, cwd=ROOT)


def training_figures(work: Path) -> Dict[str, Tuple[int, float]]:
    """Model -> (the last update logged, its training seconds)."""
    figures = {}
    for log in sorted((work / "models").glob("*/train.log.jsonl")):
        step, seconds = 0, 0.0
        for line in log.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            step = max(step, int(record.get("step", 0)))
            seconds = max(seconds, float(record.get("train_seconds", 0.0)))
        figures[log.parent.name] = (step, seconds)
    return figures


def main(argv: List[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--system", required=True, help="the tuned moses.ini")
    parser.add_argument("--corpus", nargs=2, required=True)
    parser.add_argument("--tuning-set", nargs=2, required=True)
    parser.add_argument("--test", nargs=2, required=True)
    parser.add_argument("--lang", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--budgets", default="1,3,8", help="hours, comma-separated, increasing")
    parser.add_argument("build_options", nargs="*", help="more build-reranker options (after --)")
    args = parser.parse_args(argv)

    from phrase_scorer.experiments.statistics import paired_bootstrap_p
    from phrase_scorer.moses.evaluate import decode, score
    from phrase_scorer.moses.installation import MosesInstallation, read_lines

    references = read_lines(args.test[1])
    moses_output = args.work / "curve" / "test.moses"
    moses_output.parent.mkdir(parents=True, exist_ok=True)
    if not moses_output.exists():
        decode(args.system, args.test[0], moses_output, moses=MosesInstallation.find())
    baseline = [line.strip(" ") for line in read_lines(moses_output)]
    base = score(baseline, references, lang=args.lang)
    rows = [f"| Moses 1-best | – | – | – | {base.bleu:.2f} | {base.chrf:.2f} | – |"]
    for budget in (float(b) for b in args.budgets.split(",")):
        kept = args.work / "curve" / f"row.budget{budget:g}.json"
        if kept.exists():
            rows.append(json.loads(kept.read_text(encoding="utf-8"))["row"])
            print(rows[-1], flush=True)
            continue
        phrase_scorer("build-reranker", args.system, "--corpus", *args.corpus, "--tuning-set", *args.tuning_set,
                      "--lang", args.lang, "--budget", f"{budget:g}", "-o", str(args.work), *args.build_options)
        output = args.work / "curve" / f"test.budget{budget:g}"
        phrase_scorer("translate-system", "--moses", args.system, "--reranker", str(args.work / "reranker.json"),
                      args.test[0], "-o", str(output), "--overwrite")
        hypotheses = read_lines(output)
        ours = score(hypotheses, references, lang=args.lang)
        p = paired_bootstrap_p(baseline, hypotheses, references, lang=args.lang)
        results = json.loads((args.work / "results.json").read_text(encoding="utf-8"))
        trained = training_figures(args.work)
        updates = ", ".join(f"{name} {step:,}" for name, (step, _) in trained.items())
        hours = sum(seconds for _, seconds in trained.values()) / 3600
        rows.append(f"| {budget:g} h | {updates} | {hours:.2f} | {results['chosen']} | {ours.bleu:.2f} "
                    f"({ours.bleu - base.bleu:+.2f}) | {ours.chrf:.2f} | {p:.3f} |")
        kept.write_text(json.dumps({"row": rows[-1], "chosen": results["chosen"], "bleu": ours.bleu,
                                    "moses_bleu": base.bleu, "chrf": ours.chrf, "p": p,
                                    "updates": {name: step for name, (step, _) in trained.items()},
                                    "training_seconds": {name: s for name, (_, s) in trained.items()}},
                                   indent=1) + "\n", encoding="utf-8")
        print(rows[-1], flush=True)
    table = "\n".join(["| budget | updates per model | training hours (logged) | row kept | test BLEU | chrF | "
                       "p vs Moses |", "|---|---|---|---|---|---|---|", *rows])
    text = f"{table}\n\nsacrebleu: {base.bleu_signature}\n"
    (args.work / "curve.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
