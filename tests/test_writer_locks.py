"""One run at a time writes an output, and a file kept where a signature goes is not replaced.

Every verb that writes a file claims its output where it checks it (phrase_scorer/io/outputs.py
``check_output``), by the lock ``OUT.lock``: a second run aimed at an output that a running
command holds is refused with one line naming it, and the first run's output is left as it is.
A writer that signs its output (``OUT.json``) replaces an ``OUT.json`` that stands without its
``OUT`` (a tuned reranker the user keeps there) only with ``--overwrite``.

Nothing here depends on timing: the first run is halted at an exact point (tests/pause_at.py),
or the lock is held by a process started for it, before the second run starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, VAL_EN, error_line, head_lines, kill, start_halted
from conftest import run_cli as run
from test_outputs import other_writers

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
LOG = os.environ.get("PHRASE_SCORER_RELIABILITY_LOG")
BUSY = "another phrase-scorer run is writing this output"


def record(kind: str, **fields) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


HOLD = """
import sys
from pathlib import Path
from phrase_scorer.io.output_lock import OutputLock

OutputLock(sys.argv[1]).acquire()
Path(sys.argv[2]).write_text("held")
sys.stdin.read()  # held until the test closes the pipe
"""


@contextlib.contextmanager
def another_run_writing(output: Path, ready: Path):
    """A process holding ``output``'s lock, as a phrase-scorer run writing it does, until the block ends."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(output), str(ready)], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # bounds a hang only; the outcome waits for the file
        while not ready.exists():
            if proc.poll() is not None:
                pytest.fail(f"the lock holder ended (status {proc.returncode}): {proc.stderr.read()}")
            if time.monotonic() > deadline:
                pytest.fail("the lock holder did not start")
            time.sleep(0.02)
        yield proc
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0


def go_on(proc: subprocess.Popen, ready: Path) -> subprocess.CompletedProcess:
    """Let a run halted by tests/pause_at.py go on, and wait for its end."""
    ready.unlink()
    _, stderr = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, None, stderr)


@pytest.fixture()
def table(tmp_path) -> Path:
    """The first 300 lines of the example table, plain text."""
    path = tmp_path / "pt.txt"
    path.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 300)))
    return path


# --- two real runs into one output ------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["score", "translate -m"])
def test_a_second_run_into_an_output_being_written_is_refused_and_the_first_finishes_intact(tmp_path, tiny_model,
                                                                                             table, verb):
    """The first run is halted half-way through writing its first chunk; the second, aimed at the
    same output (with --overwrite), must be refused before it writes anything; the first then
    finishes with exactly what it writes alone."""
    args = {
        "score": lambda out: ["score", "-m", tiny_model, table, "-o", out, "--threads", 1],
        "translate -m": lambda out: ["translate", "-m", tiny_model, VAL_EN, "-o", out, "--threads", 1,
                                     "--batch-sentences", 5],
    }[verb]
    alone = tmp_path / "alone.txt"
    assert run(*args(alone)).exit_code == 0
    out, ready = tmp_path / "out.txt", tmp_path / "ready"
    first = start_halted(f"write:{out}:1:0.5", args(out), ready)
    try:
        line = error_line(run(*args(out), "--overwrite"))
        assert f"{out}: {BUSY}" in line, line
        assert not out.exists() and Path(f"{out}.lock").exists()  # the first run's lock is left to it
        finished = go_on(first, ready)
    finally:
        if first.poll() is None:
            kill(first)
    assert finished.returncode == 0, finished.stderr
    assert out.read_bytes() == alone.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == ["out.txt"]  # no .part or .lock
    record("lock", command=verb, outcome="second run refused, first run's output intact")


# --- every writer --------------------------------------------------------------------------------------


def writers(tmp_path, tiny_model, search_model, table, ini, out):
    """Every verb that writes a file, as name -> (arguments writing ``out`` with --overwrite where the
    verb has it, the file it writes). The Moses verbs claim their output before they look for Moses."""
    args = {name: ([*a, "--overwrite"], out) for name, (a, _) in
            other_writers(tmp_path, tiny_model, search_model, table, ini, out).items()}
    args["plot alignments"] = (args["plot alignments"][0], out.with_name(f"{out.stem}-2.png"))
    sentences = tmp_path / "src.en"
    sentences.write_text("a man in a blue shirt\ntwo dogs\n")
    reranker, moses_home = fake_system(tmp_path)
    system = tmp_path / "system.ini"  # the decoder features the reranker weights
    shutil.copyfile(DATA / "moses.ini", system)
    args.update({
        "score": (["score", "-m", tiny_model, table, "-o", out, "--overwrite"], out),
        "translate -m": (["translate", "-m", tiny_model, sentences, "-o", out, "--overwrite"], out),
        "translate-system": (["translate-system", "--moses", system, "--reranker", reranker, sentences, "-o", out,
                               "--moses-home", moses_home, "--overwrite"], out),
        "annotate": (["annotate", table, "-m", tiny_model, "-o", out, "--overwrite"], out),
        "rescore": (["rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", out, "--overwrite"], out),
        "moses-ini": (["moses-ini", ini, "--phrase-table", table, "--add-features", 0, "-o", out, "--overwrite"], out),
        "apply-reranker": (["apply-reranker", reranker, "--test", NBEST, "-o", out, "--overwrite"], out),
        "ems-config": (["ems-config", ini, out, "--model", tiny_model], out),
    })
    return args


def fake_system(tmp_path):
    """A reranker over the decoder's features, and a Moses folder whose decoder is never run."""
    from phrase_scorer.io.nbest import read_nbest
    from phrase_scorer.io.nbest import dense_layout
    from phrase_scorer.rescoring.reranker import Reranker
    from phrase_scorer.rescoring.weights import Weights

    layout = dense_layout(next(iter(read_nbest(NBEST))))
    weights = Weights(layout, [0.1] * sum(count for _, count in layout))
    reranker = tmp_path / "reranker.json"
    reranker.write_text(json.dumps(Reranker(weights, (), {}, nbest_size=10).to_json()))
    home = tmp_path / "moses"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    decoder = home / "bin" / "moses"
    decoder.write_text("#!/bin/sh\nexit 3\n")
    decoder.chmod(0o755)
    return reranker, home


WRITERS = ["score", "translate -m", "translate-system", "annotate", "rescore", "moses-ini", "tune", "rerank",
           "apply-reranker", "evaluate", "plot scores", "plot embeddings", "plot alignments", "experiment --report",
           "rescore-experiment --report", "ems-config"]


@pytest.mark.parametrize("verb", WRITERS)
def test_every_writer_refuses_an_output_another_run_is_writing(tmp_path, tiny_model, sentence_models, table, verb):
    if verb.startswith("plot"):
        pytest.importorskip("matplotlib")
    ini = tmp_path / "moses.ini"
    ini.write_text(f"[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path={table} "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    out = tmp_path / "out.png"
    args, written = writers(tmp_path, tiny_model, sentence_models("rnnsearch"), table, ini, out)[verb]
    written.write_bytes(b"what the other run has written so far\n")
    with another_run_writing(written, tmp_path / "held"):
        result = run(*args)
        line = error_line(result)
        assert f"{written}: {BUSY}" in line, line
        assert written.read_bytes() == b"what the other run has written so far\n"
        assert Path(f"{written}.lock").exists()  # the holder's lock is left to it
        assert not Path(f"{written}.part").exists() and not Path(f"{written}.json").exists()
    # once the other run has let go, the same command goes on (to its end, or to the missing Moses),
    # and what it claimed is free when it ends, whether its writer released it or not
    again = run(*args)
    assert BUSY not in again.stderr and not Path(f"{written}.lock").exists(), again.stderr
    record("lock", command=verb, outcome="second run refused, the other run's output kept")


# --- a file kept where a signature goes -------------------------------------------------------------


def signers(tmp_path, tiny_model, table, out):
    reranker, moses_home = fake_system(tmp_path)
    ini = tmp_path / "moses.ini"
    shutil.copyfile(DATA / "moses.ini", ini)
    sentences = tmp_path / "src.en"
    sentences.write_text("a man\n")
    return {
        "annotate": ["annotate", table, "-m", tiny_model, "-o", out],
        "rescore": ["rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", out],
        "translate-system": ["translate-system", "--moses", ini, "--reranker", reranker, sentences, "-o", out,
                              "--moses-home", moses_home],
    }


@pytest.mark.parametrize("verb", ["annotate", "rescore", "translate-system"])
def test_a_json_kept_where_the_signature_goes_is_replaced_only_with_overwrite(tmp_path, tiny_model, table, verb):
    out = tmp_path / "out.txt"
    kept = tmp_path / "out.txt.json"
    users = json.dumps({"format": "the user's tuned reranker"})
    kept.write_text(users)
    args = signers(tmp_path, tiny_model, table, out)[verb]
    line = error_line(run(*args))
    assert f"{kept}: " in line and "already exists" in line and "--overwrite" in line, line
    assert kept.read_text() == users
    assert not out.exists() and not Path(f"{out}.part").exists() and not Path(f"{out}.lock").exists()
    result = run(*args, "--overwrite")
    if verb == "translate-system":  # past the check, the fake decoder fails: the file is kept
        assert "already exists" not in error_line(result) and kept.read_text() == users
    else:
        assert result.exit_code == 0, result.stderr
        assert json.loads(kept.read_text())["tool"] == f"phrase-scorer {verb}"
    record("outputs", case=f"6. {verb} -o NAME with NAME.json and no NAME",
           outcome="refused; replaced with --overwrite")
