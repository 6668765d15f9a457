"""Make the frozen tiny models of tests/data/frozen/ and the scores they gave when they were made.

    python tools/make_frozen_models.py [--output tests/data/frozen] [--arch ARCH ...]

One tiny model of each architecture: an encoder-decoder trained on the bundled phrase table, an
RNNsearch and a Transformer trained on the tests' 500 Multi30k sentence pairs, each trained by the
command line with
the commands printed below (and written into README.md there). Only what loading needs is kept
(config.json, model.pt, the vocabularies, the training log). ``scores.txt`` holds what
``phrase-scorer score --threads 1`` gave for ``pairs.txt``; tests/test_backwards_compatibility.py
loads the models with today's code and expects the same scores. Run it again only when an old
model directory may no longer be read: a model made by an older version is the point. Without
``--arch`` it makes the models that are missing and leaves the others as they are; README.md names
the version that made each (its config.json's ``package_version``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
KEEP = {"config.json", "model.pt", "vocab.source.json", "vocab.target.json", "train.log.jsonl"}
PAIRS = [
    "a man ||| un homme",
    "a dog ||| un chien",
    "a man in a blue shirt ||| un homme en t-shirt bleu",
    "two women are walking ||| deux femmes marchent",
    "a man ||| une femme",
    "xyzzy ||| plugh",
]


def train_commands(out: Path) -> dict:
    """The train command of each frozen model (paths relative to the repository root)."""
    def rel(path: Path) -> str:
        return str(path.relative_to(ROOT))

    return {
        "encdec": ["phrase-scorer", "train", "examples/phrase-table.sample.gz", "-o", rel(out / "encdec"),
                   "--preset", "tiny", "--max-steps", "400", "--valid-every", "200", "--valid-pairs", "300",
                   "--seed", "3", "--threads", "1"],
        "rnnsearch": ["phrase-scorer", "train", "--corpus", rel(DATA / "multi30k.train500.en.gz"),
                      rel(DATA / "multi30k.train500.fr.gz"), "-o", rel(out / "rnnsearch"), "--arch", "rnnsearch",
                      "--preset", "tiny", "--max-length", "12", "--max-steps", "30", "--valid-every", "30",
                      "--valid-pairs", "50", "--seed", "2", "--threads", "1"],
        "transformer": ["phrase-scorer", "train", "--corpus", rel(DATA / "multi30k.train500.en.gz"),
                        rel(DATA / "multi30k.train500.fr.gz"), "-o", rel(out / "transformer"), "--arch",
                        "transformer", "--preset", "tiny", "--max-length", "12", "--max-steps", "60",
                        "--valid-every", "30", "--valid-pairs", "50", "--seed", "2", "--threads", "1"],
    }


def score_command(model: Path, out: Path) -> list:
    return ["phrase-scorer", "score", str((out / "pairs.txt").relative_to(ROOT)), "-m", str(model.relative_to(ROOT)),
            "--threads", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DATA / "frozen")
    parser.add_argument("--arch", action="append", choices=sorted(train_commands(DATA / "frozen")),
                        help="make (again) this architecture's model [default: the missing ones]")
    args = parser.parse_args()
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "pairs.txt").write_text("".join(p + "\n" for p in PAIRS))
    bin_dir = Path(sys.executable).parent
    commands = train_commands(out)
    lines = []
    for arch, command in commands.items():
        model = out / arch
        scoring = score_command(model, out)
        if arch in (args.arch or []) or not model.exists():
            make(model, command, scoring, bin_dir)
        version = json.loads((model / "config.json").read_text())["package_version"]
        lines += [f"- `{arch}/`, made with version {version}:", "", "      " + " ".join(command), "",
                  f"  `{arch}/scores.txt`: `" + " ".join(scoring) + "`", ""]
    (out / "README.md").write_text(
        "# Frozen tiny models\n\n"
        "Made by `python tools/make_frozen_models.py` with the version of phrase-scorer named beside each, and\n"
        "kept as they were made: tests/test_backwards_compatibility.py loads them with today's code and expects\n"
        "the scores they gave then (`scores.txt`, for the pairs of `pairs.txt`). The commands, run in the\n"
        "repository root:\n\n" + "\n".join(lines))


def make(model: Path, command: list, scoring: list, bin_dir: Path) -> None:
    """Train ``model`` by ``command``, keep what loading needs, and record its scores."""
    if model.exists():
        shutil.rmtree(model)
    print(" ".join(command), flush=True)
    subprocess.run([str(bin_dir / command[0]), *command[1:]], cwd=ROOT, check=True)
    for path in model.iterdir():
        if path.name not in KEEP:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    scores = subprocess.run([str(bin_dir / scoring[0]), *scoring[1:]], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    (model / "scores.txt").write_text(scores)


if __name__ == "__main__":
    main()
