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
[`tests/test_reliability.py`](../tests/test_reliability.py),
[`tests/test_outputs.py`](../tests/test_outputs.py),
[`tests/test_writer_locks.py`](../tests/test_writer_locks.py),
[`tests/test_reranker_file.py`](../tests/test_reranker_file.py),
[`tests/test_model_files.py`](../tests/test_model_files.py),
[`tests/test_input_identity.py`](../tests/test_input_identity.py),
[`tests/test_line_endings.py`](../tests/test_line_endings.py) and the five files of round four
below (with the phrase-table cases of
`tests/test_phrase_table.py` and `tests/test_cli.py`); they run in the default suite with
bounded effort, and `make test-fuzz` runs the fuzz properties with many more cases.
`python tools/reliability_report.py [--fuzz]` reruns them and rewrites this page.

What each kind of test checks:

- **Fuzzing** (hypothesis): generated phrase tables (random fields, separators, line ends,
  invalid UTF-8, BOMs, NULs, `nan`/`inf`/`-1`/`1e-400` scores, empty phrases, `|||` inside
  phrases, plain and gzip), moses.ini files, n-best lists and reranker files (random keys and
  types, NaN, infinities, strings, `null`, wrong counts), plus raw random bytes; and damaged
  model directories (config.json values of the wrong type or size, vocabularies truncated,
  swapped or garbled, weights truncated, garbled or with one bit flipped). Each input
  either parses, and then the parsed lines are exactly the input and valid by Moses' rules, or
  raises the project's error naming the file (and line). The command line, given the same
  tables, exits 0 or 1 with one `phrase-scorer: error:` line and never a traceback. Given the
  same tables as inputs of `score`, `annotate` and `translate` whose output is that input (by
  the same path, `./` or `dir/../` in it, a symbolic or a hard link, or with the input at
  `OUT.part`), even with `--overwrite`, it refuses with one line naming both and the input keeps
  every byte. And whatever stands at `OUT`, `OUT.lock`, `OUT.part`, `OUT.part.json` and `OUT.json`
  (nothing, a user's file, a link to one, a dangling link, a folder, a stale lock, a garbled
  resume record), with or without `--overwrite` and `--resume`: `score`, `annotate` and
  `translate` succeed or fail with one line, every file they did not create keeps its bytes, and
  nothing of theirs is left but a finished output (the companion-file fuzz).
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
- **Outputs and the user's files** (`tests/test_outputs.py`, one test or more per case; every
  verb that writes checks its output in one place, `phrase_scorer/io/outputs.py`):
  1. An output equal to an input (`translate src.en -o src.en`, `score pt.txt -o pt.txt`,
     `moses-ini moses.ini ... -o moses.ini`, and `annotate`, `rescore`) is refused with one line
     naming both paths, even with `--overwrite`; so is an output equal to a file of the model
     (`score -o MODEL/config.json`) or any file a moses.ini names.
  2. `moses-ini ... --phrase-table pt.rnn.gz -o pt.rnn.gz` and `annotate IN -o OUT --ini moses.ini
     --ini-output IN` (or `OUT`) are refused; annotate checks `--ini-output` before it starts.
  3. Inputs and outputs are compared by device and inode after following links: an output
     reached through a symbolic or hard link to an input is refused (`annotate`, `rescore`,
     `tune`, `rerank`, `evaluate`, `ems-config`, the three `plot` verbs and the experiments'
     `--report`), and so is an input that sits where a file is written beside the output
     (`annotate OUT.part -o OUT`).
  4. `-`, a character device (`mknod mynull c 1 3`, `/dev/null`, `/dev/full`) and a FIFO are
     written to directly: the node stays, and no `.part`, lock or signature is made beside it.
     A block device or a socket is refused. Outputs that are files by nature, with files
     written beside them (`tune`'s moses.ini, `rerank`'s 1-best and its `.json`, `evaluate`'s
     decoder output and its log, `ems-config`'s ini), refuse `-`, devices and FIFOs.
  5. `train -o DIR` into a folder holding a model's weights, checkpoint or training log but no
     `config.json` is refused without `--overwrite`, and `--resume` says it cannot continue it;
     nothing is replaced or erased.
  6. Every verb that writes a file (`annotate`, `rescore`, `translate`, `score`, `moses-ini`,
     `tune`, `rerank`, `evaluate`, `plot scores|embeddings|alignments`, and the `--report` of
     `experiment` and `rescore-experiment`, checked before any tuning starts) replaces an
     existing output only with `--overwrite` (the error says so; `--resume` continues its own
     output without it). `ems-config` is the one exception: EMS numbers its steps' outputs and
     re-runs a step into the same file, so it replaces its own ini (never an input). A
     failure that leaves nothing to resume (an empty table or n-best list, or one failing before
     its first chunk) leaves no `OUT.part`.
  7. The unknown-word column is e^min(n, 88): e^88 ≈ 1.65e38 is the largest e^n below the
     largest 32-bit float Moses reads, so 800 unknown words give a finite column, recorded in
     the signature, and `annotate` reads its own output.
  8. A weights file holding the one byte `0x87` (`score`, `train --resume`) and `sample -i FILE`
     or `-i -` with invalid UTF-8 give one line, not a traceback.
  9. Bytes after the end of the gzip data are named as such (with the last line); a truncated
     gzip names the last complete line read, not a window boundary; `moses-ini` on an ini already
     patched for the table says so; a full disk on standard output names `<stdout>`; `--resume`
     of a finished output says it is finished instead of printing a rate.
- **Nothing lost, round three** (one test or more per case, each failing on the code before it):
  10. Every command that writes a file takes the output's lock where its output is checked
      (`phrase_scorer/io/outputs.py`, `check_output`): a second `score`, `translate -m` (and
      every other writer) aimed at an output another run is writing is refused in one line, and
      the first run's output ends as it would alone (`tests/test_writer_locks.py`).
  11. A file `NAME.json` kept where a signature goes (a tuned reranker, say) is replaced by
      `annotate`, `rescore`, `translate --moses` only with `--overwrite`.
  12. The reranker file is read through one schema (`rescoring/reranker.py`, `RerankerFile`):
      a weight that is NaN, infinite, `1e400`, a string or `null`, per-feature counts that add up
      but do not match the layout, `"models": null`, an empty layout: one line naming the file
      and the key. A NaN feature in an n-best list is refused naming the list and line; sums
      that are -inf or undefined never drop a sentence or blank its line (the first hypothesis,
      Moses' own 1-best, wins ties). An n-best line with a tab is refused.
  13. `rescore` signs its list's size and SHA-256; a list rewritten since (by another model) is
      refused by `apply-reranker` and `translate --moses --reranker` instead of reranked.
  14. Every text input is read by one line reader that strips `\r\n` (`io/files.py`,
      `TextLines`): `rescore --source`, `score`, references, corpora and sources with CRLF line
      ends give what their LF twins give.
  15. An input file is known by its bytes (`io/files.py`, `file_identity`): size, then the SHA-256
      (a recorded one reused only for the untouched file: 21). `--resume` of `train`, `annotate` and
      `translate` goes on after a `touch`, a copy, or the same file at another path; a changed
      byte is refused. A resume refusal names each changed setting and shows the two values from
      where they differ.
  16. config.json records the vocabularies' SHA-256 and every load checks them: vocabularies
      swapped for another model's of the same size are refused. Sizes in a hand-edited
      config.json (negative, string, fractional, boolean, absurdly large) are refused naming the
      key; a weights file whose zip CRC-32s do not match is refused.
  17. A failed `train` leaves no folder a re-run takes for a model (config.json comes with the
      first checkpoint); `--valid-pairs 0` trains, keeping the weights of the lowest training
      NLL; `--max-time 0` is refused; a rank of `train --processes 2` killed by SIGKILL ends the
      job with one line naming the rank and the `--resume` command.
  18. `compare` with no source phrase to show says so in one line instead of printing a blank
      line.
- **Nothing lost, round four** (one test or more per case, each failing on the code before it;
  every writer goes through one job, `phrase_scorer/runtime/job.py`, `OutputJob`, library
  callers included; `tests/test_companion_files.py`, `tests/test_supervision.py`,
  `tests/test_input_rules.py`, `tests/test_weights_identity.py`, `tests/test_library_guards.py`):
  19. A file this run did not create is never opened for writing, truncated or removed. `OUT.lock`
      that is a symbolic link (to a user's file, or to the command's own input), a user's own file
      named `OUT.lock` or `DIR.lock` beside a model folder, or anything that is not a lock this
      tool wrote: refused in one line naming it, and kept byte for byte. A lock is made whole
      under a temporary name and linked into place; a stale one of a killed run is taken over; at
      the end it is removed only while it is the file this run held.
  20. The temporary file of an output is created exclusively and never through a link: a new
      `OUT.XXXXXXXX.part` for outputs that cannot resume, `OUT.part` for those that can. A link or
      a user's file at `OUT.part` is left alone (and refused where `OUT.part` is the resumable
      output's name); `OUT` never becomes a link. A stale `OUT.part` is removed only when its
      resume record names that very file (device and inode); a resume record that is not the
      tool's is refused and kept.
  21. `--resume` trusts nothing it does not check. An input's recorded SHA-256 is reused only
      when its device, inode, size, modification and change time all match, so bytes changed at
      the same size with the time put back (`touch -r`, `cp -p`, `rsync -t`) are refused by
      `annotate`, `rescore` and `train`. `OUT.part` is checked against the SHA-256 of the bytes its
      record holds before it is continued.
  22. Weights record what they were trained as (architecture, sizes, reading order, the
      vocabularies' and segmentations' SHA-256): a reverse or right-to-left model's `model.pt` or
      checkpoint copied into another model's folder is refused at load, on `train --resume` and
      when averaging; weights written before the record load as before. A config.json of a newer
      version than the package reads is refused.
  23. `--overwrite` keeps the permission bits of the file it replaces (a 0600 output stays 0600).
  24. Supervision: a worker killed with SIGKILL (what the out-of-memory killer does) ends
      `annotate --workers 2` with one line naming the worker and the signal, every worker reaped,
      the finished part kept for `--resume`; a killed resource-tracker process does not end the
      run; SIGTERM and SIGHUP end every verb as Ctrl-C does (one line, the `--resume` hint where it
      can resume, exit 143 and 129, no `.part` that cannot be resumed, no lock).
  25. One rule each, applied by every verb: an empty file name (an unset shell variable) is
      refused naming the option; a name ending in `.gz` is written gzipped (`score` too); a UTF-8
      byte-order mark at the start of a text input, phrase table, n-best list or moses.ini is
      refused naming the file, line 1 and how to remove it; whole numbers in files are ASCII
      digits, and a negative one is named as negative; a damaged pair cache is named as damaged,
      not as a changed corpus, and never gives a traceback.
  26. `rerank`, `tune`, `evaluate`, `moses-ini`, the plots and the experiments' reports check their
      output in the library function, not only on the command line: a library caller gets the
      same refusals; their files beside the output are made as in 20.
  27. What a hostile reading of 19-26 found, each now refused with the file kept: a file at
      `OUT.lock` that only begins like a lock (or holds a bare process number) is not taken for a
      stale lock; `annotate --resume --ini` no longer replaces a user's file where the patched
      moses.ini goes (the ini is written after the table, so an interrupted run never made it);
      files at a torchrun shard's names that no annotate run signed are neither replaced nor
      removed; `train -o DIR` takes vocabularies and a pair cache for a killed setup's leftovers
      by their content, not their names; `--resume` refuses an `OUT.part` with other names (hard
      links), which cutting it would cut too; `--overwrite` onto a link takes no permission bits
      from the link's target, and set-id bits are never carried over.
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
        tests = ["tests/test_reliability.py", "tests/test_outputs.py", "tests/test_writer_locks.py",
                 "tests/test_reranker_file.py", "tests/test_model_files.py", "tests/test_input_identity.py",
                 "tests/test_line_endings.py", "tests/test_companion_files.py", "tests/test_supervision.py",
                 "tests/test_input_rules.py", "tests/test_weights_identity.py", "tests/test_library_guards.py"]
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
    text = INTRO + (
        f"\n## Last run\n\n`python tools/reliability_report.py{' --fuzz' if args.fuzz else ''}` on "
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
