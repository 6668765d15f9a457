"""An input is known by its bytes: --resume goes on with a touched file, a copy, or the same file
at another path, and refuses a file whose bytes changed, even at the same size and path; a
refusal names the one setting that changed, with both values where they differ."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR, kill, start_halted
from phrase_scorer.config import TrainConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.records import refuse_changed
from phrase_scorer.training.run import train

WINDOW = 250


def phrase_scorer(*args) -> list:
    return [sys.executable, "-m", "phrase_scorer", *map(str, args)]


def change_one_byte(path: Path) -> None:
    """Replace one digit near the end of ``path`` by another: the same size, other bytes, and the
    modification time the file had (so that only its content tells it apart)."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    at = next(i for i in range(len(data) - 1, 0, -1) if chr(data[i]).isdigit())
    data[at] = ord("1") if data[at] != ord("1") else ord("2")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size


def touch(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))


# --- annotate ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_table(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("table") / "table.txt"
    path.write_bytes(gzip.decompress(EXAMPLE_TABLE.read_bytes()))
    return path


@pytest.fixture(scope="module")
def annotated(tmp_path_factory, tiny_model, plain_table) -> Path:
    """The table annotated without interruption."""
    out = tmp_path_factory.mktemp("reference") / "ref.gz"
    subprocess.run(phrase_scorer("annotate", plain_table, "-m", tiny_model, "-o", out, "--window-lines", WINDOW,
                                 "--threads", 1), check=True, capture_output=True)
    return out


def killed_annotation(tmp_path, tiny_model, table: Path, model=None) -> Path:
    """``out.gz``: an annotation of ``table`` SIGKILLed in its third chunk, its resume record left."""
    out = tmp_path / "out.gz"
    proc = start_halted(f"write:{out}:3:0.5", ["annotate", table, "-m", model or tiny_model, "-o", out,
                                                "--window-lines", WINDOW, "--threads", 1], tmp_path / "ready")
    assert kill(proc) == -signal.SIGKILL
    assert json.loads(Path(f"{out}.part.json").read_text())["lines_done"] == 2 * WINDOW
    return out


def resume_annotation(table: Path, model: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(phrase_scorer("annotate", table, "-m", model, "-o", out, "--window-lines", WINDOW,
                                        "--threads", 1, "--resume"), capture_output=True, text=True)


@pytest.mark.parametrize("how", ["touched", "copied to another path"])
def test_annotate_resumes_an_input_whose_bytes_did_not_change(tmp_path, tiny_model, plain_table, annotated, how):
    table = tmp_path / "table.txt"
    shutil.copyfile(plain_table, table)
    out = killed_annotation(tmp_path, tiny_model, table)
    if how == "touched":
        touch(table)
    else:
        table = table.rename(tmp_path / "elsewhere.txt")  # a new path and a new time; the same bytes
        shutil.copyfile(table, tmp_path / "copy.txt")
        table = tmp_path / "copy.txt"
    done = resume_annotation(table, tiny_model, out)
    assert done.returncode == 0, done.stderr
    assert f"resuming after {2 * WINDOW} lines" in done.stderr
    assert out.read_bytes() == annotated.read_bytes()
    # the record now holds the new time: a later check takes the hash from it without reading the table
    signature = json.loads(Path(f"{out}.json").read_text())["input"]
    assert signature["mtime_ns"] == table.stat().st_mtime_ns and signature["size"] == table.stat().st_size


def test_annotate_refuses_to_resume_an_input_with_one_byte_changed_at_the_same_size(tmp_path, tiny_model, plain_table):
    table = tmp_path / "table.txt"
    shutil.copyfile(plain_table, table)
    out = killed_annotation(tmp_path, tiny_model, table)
    change_one_byte(table)
    touch(table)
    done = resume_annotation(table, tiny_model, out)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "cannot resume: input changed since the interrupted run (input.sha256: " in message, done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_a_resume_refusal_shows_where_two_long_settings_differ(tmp_path, tiny_model, plain_table):
    """The model directory's path is long and differs from the recorded one only in its last
    character: the message shows both paths' ends, where they differ."""
    long_name = "a-model-directory-with-a-name-long-enough-to-be-cut-" + "x" * 40
    first, second = tmp_path / (long_name + "1"), tmp_path / (long_name + "2")
    shutil.copytree(tiny_model, first, ignore=shutil.ignore_patterns("cache"))
    shutil.copytree(tiny_model, second, ignore=shutil.ignore_patterns("cache"))
    table = tmp_path / "table.txt"
    shutil.copyfile(plain_table, table)
    out = killed_annotation(tmp_path, tiny_model, table, model=first)
    done = resume_annotation(table, second, out)
    assert done.returncode != 0
    message = done.stderr.strip().splitlines()[-1]
    assert "cannot resume: model changed since the interrupted run (model.directory: " in message, done.stderr
    assert f"model.directory: ...{str(first)[-25:]} -> ...{str(second)[-25:]} " in message, message


def test_refuse_changed_shows_long_values_from_where_they_differ():
    saved = {"options": {"prefix": "p" * 200 + "-end-one"}}
    current = {"options": {"prefix": "p" * 200 + "-end-two"}}
    with pytest.raises(PhraseScorerError) as info:
        refuse_changed(saved, current)
    message = str(info.value)
    assert "cannot resume: options changed since the interrupted run (options.prefix: " in message
    assert "-end-one -> " in message and message.rstrip(")").split(" -> ")[1].startswith("...")
    assert "-end-two" in message and "from character 206" in message
    short = {"a": {"b": "x" * 80}}, {"a": {"b": "x" * 79 + "y"}}  # a SHA-256 (64 characters) is shown whole
    with pytest.raises(PhraseScorerError, match=f"a.b: {'x' * 80} -> {'x' * 79}y"):
        refuse_changed(*short)


# --- train -----------------------------------------------------------------------------------------


QUICK = dict(preset="tiny", valid_pairs=200, valid_every=20, batch_size=16, seed=11)


def checkpoint(directory: Path) -> dict:
    return torch.load(directory / "checkpoint.pt", weights_only=True)


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, plain_table) -> Path:
    out = tmp_path_factory.mktemp("whole") / "m"
    train(plain_table, out, TrainConfig(max_steps=40, **QUICK))
    return out


def interrupted_run(tmp_path, plain_table) -> tuple:
    table = tmp_path / "table.txt"
    shutil.copyfile(plain_table, table)
    out = tmp_path / "m"
    train(table, out, TrainConfig(max_steps=23, **QUICK))
    return table, out


@pytest.mark.parametrize("how", ["touched", "copied to another path"])
def test_train_resumes_on_a_table_whose_bytes_did_not_change(tmp_path, plain_table, whole_run, how):
    table, out = interrupted_run(tmp_path, plain_table)
    if how == "touched":
        touch(table)
    else:
        copy = tmp_path / "elsewhere" / "table.txt"
        copy.parent.mkdir()
        shutil.copyfile(table, copy)
        table.unlink()
        table = copy
    state = train(table, out, TrainConfig(max_steps=40, **QUICK), resume=True, explicit={"max_steps"})
    assert state.step == 40
    a, b = checkpoint(whole_run), checkpoint(out)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    meta = json.loads((out / "cache" / "meta.json").read_text())["table"]
    assert meta["mtime_ns"] == table.stat().st_mtime_ns and meta["path"] == os.path.abspath(table)


def test_train_refuses_to_resume_on_a_table_with_one_byte_changed_at_the_same_size(tmp_path, plain_table):
    table, out = interrupted_run(tmp_path, plain_table)
    change_one_byte(table)
    touch(table)
    with pytest.raises(PhraseScorerError, match=r"cannot resume: table changed since the interrupted run "
                                                r"\(table.sha256: [0-9a-f]{64} -> [0-9a-f]{64}\)"):
        train(table, out, TrainConfig(max_steps=40, **QUICK), resume=True, explicit={"max_steps"})


def test_train_cli_resumes_on_a_corpus_copied_to_another_path(tmp_path):
    options = ["--preset", "tiny", "--max-length", "12", "--valid-every", "4", "--valid-pairs", "20", "--seed", "2",
               "--threads", "1"]
    source, target = tmp_path / "en.gz", tmp_path / "fr.gz"
    shutil.copyfile(TRAIN_EN, source)
    shutil.copyfile(TRAIN_FR, target)
    out = tmp_path / "m"
    first = subprocess.run(phrase_scorer("train", "--corpus", source, target, "-o", out, "--max-steps", 4, *options),
                           capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copyfile(source, moved / "en.gz")
    shutil.copyfile(target, moved / "fr.gz")
    again = subprocess.run(phrase_scorer("train", "--corpus", moved / "en.gz", moved / "fr.gz", "-o", out,
                                         "--max-steps", 8, "--resume", *options[-2:]), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert checkpoint(out)["state"]["step"] == 8
    change_one_byte(moved / "fr.gz")
    touch(moved / "fr.gz")
    refused = subprocess.run(phrase_scorer("train", "--corpus", moved / "en.gz", moved / "fr.gz", "-o", out,
                                           "--max-steps", 12, "--resume", *options[-2:]),
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "cannot resume: target changed since the interrupted run (target.sha256: " in refused.stderr


# --- rescore and translate's resume record ----------------------------------------------------------


def test_the_resume_record_of_rescore_and_translate_knows_a_source_by_its_bytes(tmp_path):
    """``rescore`` and ``translate --moses --reranker`` record their inputs as every resumable
    job does: a copied source resumes, a same-size change is refused naming source.sha256."""
    from phrase_scorer.runtime.job import OutputJob, Resumable, input_identity, record_path

    class Stop(Exception):
        pass

    source = tmp_path / "src.txt"
    source.write_text("a man\nthe dog\n")
    out = str(tmp_path / "out.txt")
    settings = {"source": input_identity(source), "options": {"beam": 5}}
    with pytest.raises(Stop), OutputJob(out, resumable=Resumable(settings, source=source)) as job:
        job.write(1, b"un homme\n")
        raise Stop
    saved = json.loads(record_path(out).read_text())["settings"]["source"]
    assert len(saved["sha256"]) == 64 and "path" in saved

    copy = tmp_path / "copy.txt"
    shutil.copyfile(source, copy)
    with pytest.raises(Stop), OutputJob(out, resume=True, resumable=Resumable(
            {"source": input_identity(copy), "options": {"beam": 5}}, source=copy)) as job:
        assert (job.done_lines, job.out.tell()) == (1, len(b"un homme\n"))
        raise Stop
    change_one_byte_text(copy)
    with pytest.raises(PhraseScorerError, match=r"source changed since the interrupted run \(source.sha256: "):
        with OutputJob(out, resume=True,
                       resumable=Resumable({"source": input_identity(copy), "options": {"beam": 5}}, source=copy)):
            pass


def change_one_byte_text(path: Path) -> None:
    data = path.read_text()
    path.write_text(data.replace("dog", "cat"))
