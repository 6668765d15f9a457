"""`make example` (examples/run.sh) on the bundled data, with a few training steps: every output it
announces is there, with one line per input line, and (`slow`) a second run replaces the first's
outputs. Without MOSES_HOME it rescores and stops before `rerank --dev`; the `moses` test runs the
tuning too."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

EXAMPLES = ROOT / "examples"


def lines(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def run_example(out: Path, moses_home: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MOSES_HOME"}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", EXAMPLE_OUT=str(out),
               SENTENCE_STEPS="2", STEPS="2")
    if moses_home:
        env["MOSES_HOME"] = moses_home
    result = subprocess.run(["bash", str(EXAMPLES / "run.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def check_rescored_lists(out: Path) -> None:
    for name in ("dev", "test"):
        source, nbest, rescored = (lines(EXAMPLES / f"{name}.en"), lines(EXAMPLES / f"{name}.nbest.gz"),
                                   lines(out / f"{name}.rescored.gz"))
        assert len(rescored) == len(nbest) and all(" RNN0= " in line for line in rescored)
        # the list's sentences are the source file's lines
        assert {int(line.split(" ||| ")[0]) for line in rescored} == set(range(len(source)))
        assert (out / f"{name}.rescored.gz.json").exists()


def check_example(out: Path, result: subprocess.CompletedProcess) -> None:
    check_rescored_lists(out)
    assert len(lines(out / "phrase-table.rnn.gz")) == len(lines(EXAMPLES / "phrase-table.sample.gz"))
    assert len(lines(out / "pairs.txt")) == 4
    assert "MOSES_HOME is not set" in result.stdout
    assert not (out / "test.reranked.txt").exists()


def test_the_example_rescores_and_annotates_without_moses(tmp_path):
    out = tmp_path / "example"
    check_example(out, run_example(out))


@pytest.mark.slow
def test_the_example_runs_again_over_its_own_outputs(tmp_path):
    out = tmp_path / "example"
    run_example(out)
    check_example(out, run_example(out))


@pytest.mark.moses
def test_the_example_tunes_a_reranker_with_moses(tmp_path):
    home = os.environ.get("MOSES_HOME")
    if not home or not all((Path(home) / "bin" / tool).exists() for tool in ("extractor", "mert")):
        pytest.skip("set MOSES_HOME to a Moses build with its mert programs (bin/extractor, bin/mert)")
    out = tmp_path / "example"
    result = run_example(out, home)
    check_rescored_lists(out)
    assert len(lines(out / "test.reranked.txt")) == len(lines(EXAMPLES / "test.en"))
    assert (out / "test.reranked.txt.json").exists()
    assert "of the 20 test sentences" in result.stdout
