"""tools/build_multi30k_moses.sh: its command line everywhere, and a whole (tiny) build with Moses."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR

SCRIPT = ROOT / "tools" / "build_multi30k_moses.sh"
ERROR = "build_multi30k_moses.sh: error: "


def run_script(*args, env=None, timeout=60):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def one_error_line(result) -> str:
    assert result.returncode != 0, result.stdout
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(ERROR), result.stderr
    return lines[0]


def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_help_names_the_inputs_and_the_steps():
    result = run_script("--help")
    assert result.returncode == 0, result.stderr
    for word in ("--multi30k", "--pair", "en-fr", "en-cs", "--moses", "--out", "--threads",
                 "train.lc.norm.tok", "eflomal", "grow-diag-final-and", "train-model.perl", "mert-moses.pl",
                 "lmplz", "sacrebleu"):
        assert word in result.stdout, word


def test_a_missing_multi30k_folder_is_one_clear_error(tmp_path):
    missing = tmp_path / "no-such-checkout"
    line = one_error_line(run_script("--multi30k", missing, "--pair", "en-fr", "--moses", tmp_path,
                                     "--out", tmp_path / "out"))
    assert str(missing) in line and "does not exist" in line
    assert not (tmp_path / "out").exists()  # nothing is written before the inputs are checked


def test_a_checkout_without_the_tokenised_files_is_one_clear_error(tmp_path):
    (tmp_path / "dataset" / "data" / "task1" / "tok").mkdir(parents=True)
    line = one_error_line(run_script("--multi30k", tmp_path / "dataset", "--pair", "en-cs", "--moses", tmp_path,
                                     "--out", tmp_path / "out"))
    assert "train.lc.norm.tok.en" in line


def test_a_missing_moses_folder_is_one_clear_error(tmp_path):
    checkout = fake_checkout(tmp_path / "dataset", lines=5)
    line = one_error_line(run_script("--multi30k", checkout, "--pair", "en-fr", "--moses", tmp_path / "no-moses",
                                     "--out", tmp_path / "out"))
    assert "Moses folder" in line and "no-moses" in line


@pytest.mark.parametrize("args, words", [
    ((), "--multi30k DIR is required"),
    (("--multi30k",), "--multi30k needs a value"),
    (("--pair", "en-de", "--multi30k", ".", "--moses", ".", "--out", "o"), "en-fr or en-cs"),
    (("--pair", "en-fr", "--multi30k", ".", "--moses", ".", "--out", "o", "--threads", "0"), "--threads"),
    (("--frobnicate",), "unknown argument"),
])
def test_bad_arguments_are_one_clear_error(args, words):
    assert words in one_error_line(run_script(*args))


def fake_checkout(folder: Path, lines=None) -> Path:
    """A Multi30k checkout's data/task1/tok/ made of the bundled slices of the English-French
    corpus: 500 training pairs (gzip, as a checkout may have them), 100 val pairs, and the first 50
    of those as test 2016."""
    tok = folder / "data" / "task1" / "tok"
    tok.mkdir(parents=True)
    for lang, train, val in (("en", TRAIN_EN, VAL_EN), ("fr", TRAIN_FR, VAL_FR)):
        with gzip.open(train, "rt", encoding="utf-8") as f:
            train_lines = f.readlines()[:lines]
        with gzip.open(tok / f"train.lc.norm.tok.{lang}.gz", "wt", encoding="utf-8") as f:
            f.writelines(train_lines)
        val_lines = Path(val).read_text(encoding="utf-8").splitlines(keepends=True)[:lines]
        (tok / f"val.lc.norm.tok.{lang}").write_text("".join(val_lines), encoding="utf-8")
        (tok / f"test_2016_flickr.lc.norm.tok.{lang}").write_text("".join(val_lines[:50]), encoding="utf-8")
    return folder


@pytest.mark.moses
def test_builds_a_tuned_system_that_moses_loads(tmp_path):
    home = os.environ.get("MOSES_HOME")
    if not home:
        pytest.skip("set MOSES_HOME to a Moses build (bin/moses, the mert tools, scripts/) to run Moses tests")
    # eflomal and sacrebleu from this environment first, else from PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    for program, package in (("eflomal-align", "eflomal"), ("sacrebleu", "sacrebleu")):
        if not shutil.which(program, path=path):
            pytest.skip(f"needs {program} on PATH (pip install {package})")
    env = {**os.environ, "PATH": path}
    checkout = fake_checkout(tmp_path / "dataset")
    out = tmp_path / "system"
    args = ("--multi30k", checkout, "--pair", "en-fr", "--moses", home, "--out", out, "--threads", "2",
            "--max-iterations", "2")

    result = run_script(*args, env=env, timeout=3600)
    assert result.returncode == 0, result.stderr[-5000:]
    bleu = re.fullmatch(r"test 2016 BLEU \(en-fr, tuned\): (\d+\.\d)", result.stdout.strip())
    assert bleu, result.stdout

    for name in ("phrase-table.gz", "reordering-table.wbe-msd-bidirectional-fe.gz", "lm.arpa.gz", "lm.bin",
                 "moses.ini", "moses.tuned.ini", "aligned.grow-diag-final-and.gz", "val.nbest.gz", "baseline.md"):
        assert (out / name).stat().st_size > 0, name
    with gzip.open(out / "aligned.grow-diag-final-and.gz", "rt") as f:
        assert sum(1 for _ in f) == 500
    for ini in ("moses.ini", "moses.tuned.ini"):
        text = (out / ini).read_text()
        paths = re.findall(r"path=(\S+)", text)
        assert sorted(paths) == ["lm.arpa.gz", "phrase-table.gz", "reordering-table.wbe-msd-bidirectional-fe.gz"], paths
        assert "KENLM name=LM0 factor=0 path=lm.arpa.gz order=5" in text
    tuned = (out / "moses.tuned.ini").read_text()
    assert tuned.startswith("# MERT optimized configuration") and re.search(r"on dev \S*val\.tok\.en\n", tuned)
    assert f"| {bleu.group(1)} |" in (out / "baseline.md").read_text()

    # Moses loads the tuned config from the output folder (its paths are relative to it).
    sentences = "a man in a blue shirt .\ntwo dogs play in the snow .\n"
    decoded = subprocess.run([str(Path(home) / "bin" / "moses"), "-f", "moses.tuned.ini", "-v", "0"], cwd=out,
                             input=sentences, capture_output=True, text=True, timeout=600)
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    assert len(decoded.stdout.splitlines()) == 2 and all(decoded.stdout.splitlines())

    # Run again: every step is skipped and the same BLEU comes out.
    again = run_script(*args, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == result.stdout
    assert again.stderr.count("done already") == 9
