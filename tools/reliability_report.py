#!/usr/bin/env python3
"""Run the reliability tests and write what they tried, and what was lost, to docs/reliability.md.

    python tools/reliability_report.py            # the default-suite bounds
    python tools/reliability_report.py --fuzz     # plus the long fuzzing campaign (marker fuzz)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "reliability.md"

INTRO = """# Reliability

What phrase-scorer is tested against, and what it lost. The tests are in
[`tests/test_reliability.py`](../tests/test_reliability.py) (with the phrase-table cases of
`tests/test_phrase_table.py` and `tests/test_cli.py`); they run in the default suite with
bounded effort, and `make test-fuzz` runs the fuzz properties with many more cases.
`python tools/reliability_report.py [--fuzz]` reruns them and rewrites this page.

What each kind of test checks:

- **Fuzzing** (hypothesis): generated phrase tables (random fields, separators, line ends,
  invalid UTF-8, BOMs, NULs, `nan`/`inf`/`-1`/`1e-400` scores, empty phrases, `|||` inside
  phrases, plain and gzip), moses.ini files and n-best lists, plus raw random bytes. Each input
  either parses, and then the parsed lines are exactly the input and valid by Moses' rules, or
  raises the project's error naming the file (and line). The command line, given the same
  tables, exits 0 or 1 with one `phrase-scorer: error:` line and never a traceback.
- **Edge cases**: 1 MB lines, BOM, CRLF, empty files, gzip files cut at random offsets.
- **Kills**: `annotate` and `train` killed with SIGKILL at random moments and resumed with
  `--resume` until they finish; the result must equal an uninterrupted run (annotate: the same
  bytes; train: the same weights and step, a training log without repeats). Ctrl-C must end
  cleanly, keep the finished part and say how to resume.
- **Faults**: the disk filling up while annotating (a 600 kB tmpfs where the test may mount one,
  else a simulated ENOSPC) or while saving a checkpoint: a one-line error, the previous output
  untouched, the last checkpoint intact.
- **Untrusted model files**: weights carrying a pickled payload (in PyTorch's zip format and as
  a raw pickle) must be refused without running it; damaged configs, vocabularies and weights
  give clear errors.
- **Concurrent runs**: a second `train` or `annotate` aimed at the same output is refused while
  the first holds it.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fuzz", action="store_true", help="also run the long fuzzing campaign")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reliability.jsonl"
        env = {**os.environ, "PHRASE_SCORER_RELIABILITY_LOG": str(log)}
        marker = "fuzz or not fuzz" if args.fuzz else "not fuzz"
        start = time.monotonic()
        tests = ["tests/test_reliability.py"]
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, *tests],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        minutes = (time.monotonic() - start) / 60
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no output"
        records = [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []

    fuzz = defaultdict(Counter)
    for r in records:
        if r["kind"] == "fuzz":
            fuzz[r["reader"]][r["outcome"]] += 1
    rows = [[reader, sum(c.values()), c.get("parsed", 0) + c.get("ok", 0), c.get("error", 0), "nothing"]
            for reader, c in sorted(fuzz.items())]
    edges = [[r["case"], r["outcome"], "nothing"] for r in records if r["kind"] == "edge"]
    kills = [[r["command"], r.get("signal", "SIGKILL"), r["kills"], r["lost"]] for r in records if r["kind"] == "kill"]
    faults = [[r["fault"], r["how"], r["lost"]] for r in records if r["kind"] == "fault"]
    untrusted = Counter((r["container"], r["outcome"]) for r in records if r["kind"] == "untrusted")
    locks = [[r["command"], r["outcome"]] for r in records if r["kind"] == "lock"]
    info = benchlib.machine()
    text = INTRO + (
        f"\n## Last run\n\n`python tools/reliability_report.py{' --fuzz' if args.fuzz else ''}` on "
        f"{time.strftime('%Y-%m-%d')} ({info['cpu']}, {info['cores']} cores): pytest says `{summary}` "
        f"({minutes:.1f} minutes).\n\n"
        "### Fuzz cases\n\n" + benchlib.markdown_table(["input", "cases", "parsed", "refused with the project's error", "lost"], rows)
        + "\n\n### Edge cases\n\n" + benchlib.markdown_table(["case", "outcome", "lost"], edges)
        + "\n\n### Kills and resumes\n\n" + benchlib.markdown_table(["command", "signal", "kills", "lost"], kills)
        + "\n\n### Faults\n\n" + benchlib.markdown_table(["fault", "how", "lost"], faults)
        + "\n\n### Untrusted and damaged model files\n\n"
        + benchlib.markdown_table(["file", "outcome", "cases"], [[k[0], k[1], v] for k, v in untrusted.items()])
        + "\n\n### Concurrent runs\n\n" + benchlib.markdown_table(["command", "outcome"], locks) + "\n"
    )
    REPORT.write_text(text)
    print(text)
    if done.returncode != 0:
        print(done.stdout[-5000:], done.stderr[-3000:], file=sys.stderr)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
