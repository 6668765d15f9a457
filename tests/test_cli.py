"""The command line: bad input gives one line naming the file and the line, and a non-zero status."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from conftest import EXAMPLE_TABLE
from phrase_scorer.cli import cli


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    """The error is the last line of stderr, alone (log lines may come before it), no traceback."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    errors = [l for l in lines if l.startswith("phrase-scorer: error: ")]
    assert errors == [lines[-1]], result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


def gz(tmp_path, name, content: bytes):
    path = tmp_path / name
    path.write_bytes(gzip.compress(content))
    return path


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"a ||| b ||| 0.5\nc ||| d\n", "line 2: expected at least 3 fields"),
        (b"a ||| b ||| 0.5\nc ||| d ||| 0.5 0.1\n", "line 2: found 2 scores where the first line has 1"),
        (b"a ||| b ||| 0.5\n\xff\xfe ||| d ||| 0.5\n", "line 2: invalid UTF-8"),
        (b"", "the file is empty"),
    ],
)
def test_train_reports_bad_tables_in_one_line(tmp_path, content, expect):
    table = gz(tmp_path, "pt.gz", content)
    line = one_error_line(run("train", table, "-o", tmp_path / "m", "--preset", "tiny"))
    assert f"{table}" in line and expect in line


def test_truncated_gzip(tmp_path):
    data = EXAMPLE_TABLE.read_bytes()
    table = tmp_path / "cut.gz"
    table.write_bytes(data[: len(data) // 3])
    line = one_error_line(run("train", table, "-o", tmp_path / "m", "--preset", "tiny"))
    assert str(table) in line and "truncated" in line and "after line" in line


def test_missing_model_directory(tmp_path):
    line = one_error_line(run("score", "-m", tmp_path / "nope", EXAMPLE_TABLE))
    assert f"{tmp_path / 'nope'}: model directory does not exist" in line


def test_not_a_model_directory(tmp_path):
    line = one_error_line(run("score", "-m", tmp_path, EXAMPLE_TABLE))
    assert "not a phrase-scorer model directory" in line


def test_score_prints_one_number_per_line(tmp_path, tiny_model):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a man ||| un homme\na man ||| une femme\nthe dog ||| le chien\n")
    result = run("score", "-m", tiny_model, pairs)
    assert result.exit_code == 0, result.output
    values = [float(v) for v in result.stdout.split()]
    assert len(values) == 3 and all(v < 0 for v in values)


def test_score_input_errors_name_the_line(tmp_path, tiny_model):
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a man ||| un homme\nonly a source\n")
    line = one_error_line(run("score", "-m", tiny_model, pairs))
    assert f"{pairs} line 2: expected at least 2 fields" in line


def test_help_and_version_start_without_torch():
    code = "import sys; from phrase_scorer.cli import main; sys.argv=['phrase-scorer','--help']; \n" \
           "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert run("--version").output.startswith("phrase-scorer, version ")


def test_other_running_tasks_sees_busy_cores():
    """The busy-machine warning counts programs running now, not the one-minute load average."""
    from phrase_scorer.runtime.threads import other_running_tasks

    if not os.path.exists("/proc/loadavg"):
        pytest.skip("needs Linux's /proc/loadavg")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        time.sleep(0.3)
        assert other_running_tasks() >= 2
    finally:
        for p in spinners:
            p.kill()
            p.wait()


@pytest.mark.parametrize("local_ranks", [1, 2])
def test_default_threads_share_this_process_cores_with_the_other_local_ranks(monkeypatch, local_ranks):
    """Under torchrun each of the ranks on a machine takes its share of the cores it may use
    (its CPU affinity), not all of them: N ranks x all cores would oversubscribe the machine."""
    import torch

    from phrase_scorer.runtime.threads import set_threads

    if local_ranks > 1:
        for name, value in (("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
            monkeypatch.setenv(name, value)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    before = torch.get_num_threads()
    try:
        set_threads(None)
        assert torch.get_num_threads() == max(1, cores // local_ranks)
        set_threads(3)
        assert torch.get_num_threads() == 3  # an explicit --threads wins
    finally:
        torch.set_num_threads(before)


def test_the_command_line_makes_waiting_openmp_threads_sleep_unless_told_otherwise():
    show = "import os, phrase_scorer.cli; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "PASSIVE"
    assert subprocess.run([sys.executable, "-c", show], env={**env, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True,
                          text=True, check=True).stdout.strip() == "ACTIVE"


def test_the_command_line_asks_torch_for_huge_pages_unless_told_otherwise():
    show = "import os, phrase_scorer.cli; print(os.environ['THP_MEM_ALLOC_ENABLE'])"
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    assert subprocess.run([sys.executable, "-c", show], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "1"
    assert subprocess.run([sys.executable, "-c", show], env={**env, "THP_MEM_ALLOC_ENABLE": "0"},
                          capture_output=True, text=True, check=True).stdout.strip() == "0"


def test_a_library_error_names_the_setting_in_python_and_the_flag_on_the_command_line(tmp_path):
    """A library message names a setting; a Python caller reads its Python name, the command
    line's user the flag: the same refusal of an existing output (no overwrite) both ways."""
    from conftest import A_MAN_TABLE, DATA
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    out = tmp_path / "moses.rnn.ini"
    out.write_text("kept\n", encoding="utf-8")
    with pytest.raises(PhraseScorerError) as raised:
        patch_moses_ini(DATA / "moses.ini", out, phrase_table=str(A_MAN_TABLE), options=MosesIniOptions(add_features=0))
    said = str(raised.value)
    assert said == (f"{out}: the patched moses.ini already exists "
                    "(pass overwrite=True to replace it, or choose another name)")
    line = one_error_line(run("moses-ini", DATA / "moses.ini", "--phrase-table", A_MAN_TABLE, "--add-features", 0,
                              "-o", out))
    assert line == f"phrase-scorer: error: {said}".replace("overwrite=True", "--overwrite")
    assert out.read_text(encoding="utf-8") == "kept\n"


def test_a_training_refusal_names_settings_with_values_both_ways(tmp_path):
    """A setting given with its value: ``valid_metric=bleu`` in Python, ``--valid-metric bleu`` on
    the command line."""
    from conftest import A_MAN_TABLE
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.training.run import train

    with pytest.raises(PhraseScorerError) as raised:
        train(str(A_MAN_TABLE), tmp_path / "py", TrainConfig(valid_metric="bleu", preset="tiny"))
    assert str(raised.value) == ("valid_metric=bleu needs sentence pairs (corpus); "
                                 "a phrase table validates by nll")
    line = one_error_line(run("train", A_MAN_TABLE, "-o", tmp_path / "cli", "--valid-metric", "bleu",
                              "--preset", "tiny"))
    assert line == ("phrase-scorer: error: --valid-metric bleu needs sentence pairs (--corpus); "
                    "a phrase table validates by nll")


def test_a_setting_survives_pickling_and_is_spelt_where_it_is_shown():
    """An error raised in a worker process crosses to the main one pickled, with the settings it
    names as data: they are written where the error is shown (the command line: as its flags);
    a message made of pieces and settings reads as the library's spelling everywhere else."""
    import logging
    import pickle

    from phrase_scorer.cli.group import FlagFormatter, flag, shown
    from phrase_scorer.errors import PhraseScorerError, Setting, Text, setting

    error = PhraseScorerError(Text(setting("resume"), " needs named files"), path="x",
                              hint=Text("run again with ", setting("resume", True), ", or fewer ", setting("workers")))
    assert str(error) == "x: resume needs named files (run again with resume=True, or fewer workers)"
    assert error.message == "resume needs named files" and error.hint.parts[1] == Setting("resume", True)
    again = pickle.loads(pickle.dumps(error))
    rescore = ("rescore",)  # shown as rescore shows it
    assert shown(again, rescore) == "x: --resume needs named files (run again with --resume, or fewer --workers)"
    assert str(again) == str(error) and again.render(lambda one: flag(one, rescore)) == shown(error, rescore)
    said = Text("pass ", setting("model_dir", "MODEL", short=True), ", ") + setting("tokenize", False)
    said = "" + said + Text(", ", setting("max_length", 0))  # adding keeps the settings
    assert said == "pass model_dir=MODEL, tokenize=False, max_length=0"
    assert shown(said, ("sample",)) == "pass -m MODEL, --no-tokenize, --max-length 0"
    assert shown(pickle.loads(pickle.dumps(said)), ("sample",)) == shown(said, ("sample",))
    assert shown("plain") == "plain"
    assert f"{setting('lang')}" == "lang" and str(setting("lang", "en")) == "lang=en"
    record = logging.LogRecord("phrase_scorer", logging.INFO, __file__, 1, "%s with %d in %s", (
        setting("threads", 2), 3, error), None)
    import click

    from phrase_scorer.cli import cli
    with click.Context(cli, info_name="phrase-scorer") as group, \
            click.Context(cli.commands["rescore"], info_name="rescore", parent=group):
        pickled = pickle.dumps(FlagFormatter("%(message)s"))  # a child process's copy, made while rescore runs
    formatter = pickle.loads(pickled)
    assert formatter.format(record) == f"--threads 2 with 3 in {shown(error, rescore)}"
    assert record.getMessage() == f"threads=2 with 3 in {error}"  # the record itself is left as it was


