#!/usr/bin/env python3
"""Write docs/examples.md and its figures from a trained model: real output of `sample`,
`compare`, `plot scores` and `plot embeddings`.

    python tools/make_examples.py -m runs/small-30m --annotated runs/phrase-table.rnn.gz
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SOURCES = ["a man in a blue shirt", "at the end of the", "two young girls are playing", "a dog is running in the snow",
           "people are sitting on a bench"]


def run(*args: str) -> str:
    command = [sys.executable, "-m", "phrase_scorer", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
    return done.stdout.rstrip()


def shown(*args: str) -> str:
    return "phrase-scorer " + " ".join(shlex.quote(a) for a in args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--annotated", required=True, help="the model's annotation of the table")
    parser.add_argument("--table", default=str(ROOT.parent / "shared/data/moses-multi30k-en-fr/phrase-table.gz"))
    args = parser.parse_args()
    model = args.model
    config = json.loads((Path(model) / "config.json").read_text())
    records = [json.loads(l) for l in (Path(model) / "train.log.jsonl").read_text().splitlines()]
    best = min(records, key=lambda r: r["valid_nll_token"])
    model_line = (f"The model: preset `{config['preset']}`, trained with `phrase-scorer train phrase-table.gz "
                  f"--preset {config['preset']} --max-time 30m` on the {config['table']['unique_pairs']:,} unique "
                  f"pairs of the Multi30k English→French phrase table ({best['pairs_seen']:,} pairs seen, best "
                  f"validation NLL {best['valid_nll_token']:.2f} per token, perplexity {best['valid_ppl']:.1f}).")

    sample_args = ["sample", "-m", model, *SOURCES, "-n", "100", "--top", "5", "--seed", "1"]
    beam_args = ["sample", "-m", model, *SOURCES[:3], "--beam", "5", "--no-allow-unk"]
    compare_args = ["compare", "-m", model, args.annotated, "--frequent", "4", "--rare", "4", "--top", "3"]
    scores_args = ["plot", "scores", args.annotated, "-o", "docs/images/scores.png", "--overwrite"]
    direct_args = ["plot", "scores", args.annotated, "--table-column", "2", "-o", "docs/images/scores-direct.png",
                   "--overwrite"]
    words_args = ["plot", "embeddings", "-m", model, "-o", "docs/images/words.png", "--html", "docs/images/words.html",
                  "--words", "1000", "--overwrite"]
    phrases_args = ["plot", "embeddings", "-m", model, "--kind", "phrases", "--table", args.table, "--phrases", "2000",
                    "-o", "docs/images/phrases.png", "--html", "docs/images/phrases.html", "--overwrite"]
    (DOCS / "images").mkdir(parents=True, exist_ok=True)
    outputs = {name: run(*a) for name, a in (("sample", sample_args), ("beam", beam_args), ("compare", compare_args),
                                            ("scores", scores_args), ("direct", direct_args), ("words", words_args),
                                            ("phrases", phrases_args))}
    text = f"""# Examples: what the model proposes and prefers

Real output of the commands below; regenerate with
`python tools/make_examples.py -m MODEL --annotated TABLE`. {model_line}

## Generating target phrases (paper, Table 3)

`{shown(*sample_args).replace(model, 'MODEL')}` draws 100 samples per source by ancestral
sampling, merges duplicates (×count) and ranks them by log p(y|x); the number on the left is the
natural-log log p(y|x) that `phrase-scorer score` gives the same pair. Escapes are undone for
display.

```
{outputs['sample']}
```

Beam search, `{shown(*beam_args).replace(model, 'MODEL')}`:

```
{outputs['beam']}
```

## Top targets by table and by model (paper, Table 2)

`{shown(*compare_args).replace(model, 'MODEL').replace(args.annotated, 'phrase-table.rnn.gz')}`: long source phrases
(four or more words) with the largest and the smallest corpus counts; the table ranks their
targets by p(e|f), the model by log p(y|x) (read from the annotated column).

{outputs['compare']}

## Model scores against table scores (paper, Fig. 3)

`{shown(*scores_args).replace(args.annotated, 'phrase-table.rnn.gz')}`: {outputs['scores'].split(': ', 1)[1]}

![model log p(y|x) against table log p(f|e)](images/scores.png)

The same against the direct translation probability p(e|f), the table's estimate of the
model's own quantity: `{shown(*direct_args).replace(args.annotated, 'phrase-table.rnn.gz')}`:
{outputs['direct'].split(': ', 1)[1]}

![model log p(y|x) against table log p(e|f)](images/scores-direct.png)

## Word and phrase representations (paper, Figs. 4-5)

`{shown(*words_args).replace(model, 'MODEL')}` ([interactive page](images/words.html): hover to read the labels)

![2-D map of source word embeddings](images/words.png)

`{shown(*phrases_args).replace(model, 'MODEL').replace(args.table, 'phrase-table.gz')}`
([interactive page](images/phrases.html))

![2-D map of phrase representations](images/phrases.png)
"""
    (DOCS / "examples.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
