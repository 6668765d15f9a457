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

LAST_RUN = "\n## Last run"


def written_intro() -> str:
    """The page above its last run: what each round guards, written in the page itself and kept."""
    text = REPORT.read_text(encoding="utf-8")
    return text[:text.index(LAST_RUN)] if LAST_RUN in text else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fuzz", action="store_true", help="also run the long fuzzing campaign")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reliability.jsonl"
        env = {**os.environ, "PHRASE_SCORER_RELIABILITY_LOG": str(log)}
        marker = "fuzz or not fuzz" if args.fuzz else "not fuzz"
        start = time.monotonic()
        tests = ["tests/test_reliability.py", "tests/test_outputs.py", "tests/test_writer_locks.py",
                 "tests/test_reranker_file.py", "tests/test_model_files.py", "tests/test_input_identity.py",
                 "tests/test_line_endings.py", "tests/test_companion_files.py", "tests/test_supervision.py",
                 "tests/test_input_rules.py", "tests/test_weights_identity.py", "tests/test_library_guards.py",
                 "tests/test_output_replacement.py", "tests/test_resume_checks.py", "tests/test_input_reading.py",
                 "tests/test_decoder_flags.py", "tests/test_reranker_system.py", "tests/test_option_values.py",
                 "tests/test_preflight.py", "tests/test_resource_limits.py"]
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
    outputs = [[r["case"], r["outcome"]] for r in records if r["kind"] == "outputs"]
    info = benchlib.machine()
    text = written_intro() + (
        f"{LAST_RUN}\n\n`python tools/reliability_report.py{' --fuzz' if args.fuzz else ''}` on "
        f"{time.strftime('%Y-%m-%d')} ({info['cpu']}, {info['cores']} cores): pytest says `{summary}` "
        f"({minutes:.1f} minutes).\n\n"
        "### Fuzz cases\n\n"
        + benchlib.markdown_table(["input", "cases", "parsed", "refused with the project's error", "lost"], rows)
        + "\n\n### Edge cases\n\n" + benchlib.markdown_table(["case", "outcome", "lost"], edges)
        + "\n\n### Kills and resumes\n\n" + benchlib.markdown_table(["command", "signal", "kills", "lost"], kills)
        + "\n\n### Faults\n\n" + benchlib.markdown_table(["fault", "how", "lost"], faults)
        + "\n\n### Untrusted and damaged model files\n\n"
        + benchlib.markdown_table(["file", "outcome", "cases"], [[k[0], k[1], v] for k, v in untrusted.items()])
        + "\n\n### Concurrent runs\n\n" + benchlib.markdown_table(["command", "outcome"], locks)
        + "\n\n### Outputs and the user's files\n\n" + benchlib.markdown_table(["case", "outcome"], outputs) + "\n"
    )
    REPORT.write_text(text)
    print(text)
    if done.returncode != 0:
        print(done.stdout[-5000:], done.stderr[-3000:], file=sys.stderr)
        sys.exit(done.returncode)


if __name__ == "__main__":
    main()
