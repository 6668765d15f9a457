"""An output is never replaced or removed until its successor is whole.

* An output that names an open descriptor (``/dev/stdout``, ``/dev/fd/N``, a link to either),
  whatever file the descriptor is, is written through the descriptor: the link stays a link, the
  redirected file gets the bytes, and nothing is made beside it.
* A model folder replaced with ``train --overwrite`` stays a whole model until the new one is
  complete (it is built beside it and swapped in), whatever ends the run.
* What a killed run left beside an output is recognised by the next run and removed while it is
  provably that run's own.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, error_line, head_lines
from phrase_scorer.errors import PhraseScorerError
from conftest import run_cli as run

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


@pytest.fixture()
def table(tmp_path) -> Path:
    """The first 60 lines of the example table, plain text."""
    path = tmp_path / "pt.txt"
    path.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 60)))
    return path


def beside(path: Path) -> list:
    """The names in ``path``'s folder that start with its name: the output and anything made beside it."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name))


# --- outputs that name a descriptor ------------------------------------------------------------------


def descriptor_link(tmp_path: Path, via: str) -> tuple:
    """A regular file opened for appending (as ``>> file`` opens standard output) and a link to its
    descriptor ``via`` /proc/self/fd or /dev/fd: (the link, the file, the descriptor)."""
    redirected = tmp_path / "redirected.txt"
    redirected.write_bytes(b"kept\n")
    fd = os.open(redirected, os.O_WRONLY | os.O_APPEND)
    link = tmp_path / "out"
    link.symlink_to(f"{via}/{fd}")
    return link, redirected, fd


@pytest.mark.parametrize("verb", ["score", "annotate", "translate", "rescore"])
@pytest.mark.parametrize("via", ["/proc/self/fd", "/dev/fd"])
def test_an_output_naming_a_descriptor_is_written_through_it_not_replaced(tmp_path, tiny_model, table, verb, via):
    link, redirected, fd = descriptor_link(tmp_path, via)
    target = os.readlink(link)
    args = {"score": ["score", "-m", tiny_model, table],
            "annotate": ["annotate", table, "-m", tiny_model],
            "translate": ["translate", "-m", tiny_model, table],
            "rescore": ["rescore", NBEST, "--source", SOURCE, "-m", tiny_model]}[verb]
    try:
        result = run(*args, "-o", link, "--overwrite")
    finally:
        os.close(fd)
    assert result.exit_code == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == target  # the link is not replaced by a file
    written = redirected.read_bytes()
    assert written.startswith(b"kept\n") and len(written.splitlines()) > 1  # appended through the descriptor
    assert beside(link) == ["out"]  # no out.json, out.lock or out.*.part


def test_rescore_to_a_link_to_standard_output_writes_to_standard_output(tmp_path, tiny_model):
    """The issue's case: ``-o /dev/stdout --overwrite`` with standard output redirected to a file.
    (A link in the test's folder stands for /dev/stdout, which the test must not risk replacing.)"""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    captured = tmp_path / "captured"
    with open(captured, "wb") as out:
        done = subprocess.run([sys.executable, "-m", "phrase_scorer", "rescore", str(NBEST), "--source", str(SOURCE),
                               "-m", str(tiny_model), "-o", str(link), "--overwrite"],
                              stdout=out, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    with gzip.open(NBEST, "rb") as f:
        assert captured.read_bytes().splitlines()[0].startswith(f.readline().split(b" ||| ")[0])
    assert beside(link) == ["stdout"]
    assert ".json" not in done.stderr  # no signature file is written beside standard output


@pytest.mark.parametrize("state, problem", [("read-only", "open for reading only"), ("closed", "which is not open")])
def test_an_output_naming_a_descriptor_that_cannot_be_written_is_refused_in_one_line(tmp_path, tiny_model, table,
                                                                                     state, problem):
    """``-o /dev/stdin`` (open for reading only), or a descriptor that is not open."""
    other = tmp_path / "notes.txt"
    other.write_bytes(b"kept\n")
    fd = os.open(other, os.O_RDONLY)
    if state == "closed":
        os.close(fd)
    try:
        line = error_line(run("score", "-m", tiny_model, table, "-o", f"/proc/self/fd/{fd}"))
    finally:
        if state != "closed":
            os.close(fd)
    assert f"/proc/self/fd/{fd}" in line and problem in line
    assert other.read_bytes() == b"kept\n"


# --- a model folder replaced with train --overwrite -----------------------------------------------


def folder_bytes(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def old_model(tmp_path, tiny_model) -> Path:
    """A copy of the tiny model, with a file of the user's kept beside its files."""
    model = tmp_path / "m5"
    shutil.copytree(tiny_model, model)
    (model / "notes.txt").write_text("mine\n")
    return model


TRAIN = ("--preset", "tiny", "--valid-every", 5, "--valid-pairs", 50, "--seed", 1)


def test_a_train_overwrite_that_fails_on_its_corpus_keeps_the_old_model_whole(tmp_path, old_model):
    """The issue's case: ``train -o m5 --overwrite`` with corpus files of different lengths."""
    source, target = tmp_path / "a.en", tmp_path / "a.fr"
    source.write_text("a man\nthe dog\na cat\n")
    target.write_text("un homme\nle chien\n")
    before = folder_bytes(old_model)
    line = error_line(run("train", "--corpus", source, target, "-o", old_model, "--overwrite", *TRAIN,
                          "--max-steps", 10))
    assert "a.en line 3" in line
    assert folder_bytes(old_model) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.en", "a.fr", "m5"]  # nothing left beside it


def test_a_killed_train_overwrite_keeps_the_old_model_readable_and_resume_swaps_the_new_in(tmp_path, old_model):
    from conftest import kill, start_halted
    from phrase_scorer.model_dir import load_model

    before = folder_bytes(old_model)
    args = ["train", EXAMPLE_TABLE, "-o", old_model, *TRAIN, "--max-steps", 12]
    proc = start_halted("step:7", [*args, "--overwrite"], tmp_path / "ready")  # a checkpoint at step 5
    try:
        load_model(old_model)  # a reader meanwhile finds the old model, whole
        assert folder_bytes(old_model) == before
    finally:
        kill(proc)
    assert folder_bytes(old_model) == before
    line = error_line(run(*args))  # neither continued nor replaced without being asked
    assert "m5.new" in line and "--resume" in line and "--overwrite" in line
    result = run(*args, "--resume")  # the interrupted replacement goes on, and takes the old model's place
    assert result.exit_code == 0, result.stderr
    after = folder_bytes(old_model)
    assert after["notes.txt"] == b"mine\n"  # the user's file stays in the folder
    assert after["model.pt"] != before["model.pt"] and after["config.json"] != before["config.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("m5")] == ["m5"]
    assert not any(name.startswith(".phrase-scorer") for name in after)
    steps = [json.loads(line)["step"] for line in (old_model / "train.log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 12  # the new run's log alone, without repeats
    load_model(old_model)


def marked_build(model: Path, new_model: Path) -> Path:
    """``model.new`` as a replacement being built: a copy of ``new_model`` with its mark."""
    from phrase_scorer.runtime.replacement import MARK, mark_text

    building = model.with_name(model.name + ".new")
    shutil.copytree(new_model, building)
    (building / MARK).write_bytes(mark_text(model.resolve()))
    return building


@pytest.mark.parametrize("killed_at", ["after the exchange", "after moving the old folder inside the new"])
def test_a_swap_a_killed_run_began_is_finished_by_the_next_run(tmp_path, old_model, sentence_models, killed_at):
    """The two states a kill during the swap can leave: the next train into the folder finishes
    the swap (the user's file back in the folder, the old model removed, the mark gone)."""
    from phrase_scorer.runtime.replacement import MARK, REPLACED

    new_model = sentence_models("encdec")
    building = marked_build(old_model, new_model)
    if killed_at == "after the exchange":
        swapped = tmp_path / "swapped"
        old_model.rename(swapped)
        building.rename(old_model)
        swapped.rename(building)  # the old model at m5.new, the new one (with its mark) at m5
    else:
        old_model.rename(building / REPLACED)  # m5 gone; the new one, holding the old, at m5.new
    assert not (old_model / "config.json").exists() or (old_model / MARK).exists()
    config = json.loads((new_model / "config.json").read_text())
    result = run("train", "--corpus", DATA / "multi30k.train500.en.gz", DATA / "multi30k.train500.fr.gz", "-o",
                 old_model, "--resume", "--max-steps", config["training"]["max_steps"])
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("m5")) == ["m5"]
    names = sorted(p.name for p in old_model.iterdir())
    assert "notes.txt" in names and MARK not in names and REPLACED not in names
    assert (old_model / "model.pt").read_bytes() == (new_model / "model.pt").read_bytes()


@pytest.mark.parametrize("leftover", ["a folder of the user's", "a build holding a file of the user's"])
def test_a_folder_at_the_replacements_name_that_is_not_provably_the_tools_is_never_removed(tmp_path, old_model,
                                                                                           leftover):
    building = old_model.with_name("m5.new")
    if leftover == "a folder of the user's":
        building.mkdir()
        (building / "results.txt").write_text("mine\n")
    else:
        from phrase_scorer.runtime.replacement import MARK, mark_text

        building.mkdir()
        (building / MARK).write_bytes(mark_text(old_model.resolve()))
        (building / "results.txt").write_text("mine\n")
    before, kept = folder_bytes(old_model), folder_bytes(building)
    line = error_line(run("train", EXAMPLE_TABLE, "-o", old_model, "--overwrite", *TRAIN, "--max-steps", 5))
    assert "m5.new" in line
    assert folder_bytes(old_model) == before and folder_bytes(building) == kept


# --- temporary files a killed run left --------------------------------------------------------------


def test_a_temporary_file_a_killed_run_left_is_removed_by_the_next_run_and_nothing_else(tmp_path, tiny_model, table):
    from conftest import kill, start_halted
    from phrase_scorer.io.atomic import writer_tag

    out = tmp_path / "scores.txt"
    proc = start_halted(f"write:{out}:1:0.5", ["score", "-m", tiny_model, table, "-o", out], tmp_path / "ready")
    kill(proc)
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("scores.txt.") and p.name.endswith(".part")]
    assert len(left) == 1  # the killed run's half-written temporary file
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    boot = writer_tag().rsplit("-", 1)[1]
    decoys = {"scores.txt.deadbeef.part": None,  # a name without the writer: not provably the tool's
              f"scores.txt.{writer_tag()}.0000000a.part": None,  # its writer (this process) still runs
              f"scores.txt.w1-1-{boot}.0000000b.part": precious}  # a link: never removed, never followed
    for name, target in decoys.items():
        if target is None:
            (tmp_path / name).write_text("mine\n")
        else:
            (tmp_path / name).symlink_to(target)
    result = run("score", "-m", tiny_model, table, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("scores.txt.")) == sorted(decoys)  # no lock
    assert precious.read_text() == "mine\n" and (tmp_path / "scores.txt.deadbeef.part").read_text() == "mine\n"


def test_the_temporary_files_of_a_killed_checkpoint_save_are_removed_by_the_next_train(tmp_path, old_model):
    from phrase_scorer.io.atomic import writer_tag

    boot = writer_tag().rsplit("-", 1)[1]
    gone = f"w999999999-5-{boot}"  # a process id above any the system gives: its writer is not running
    (old_model / "recent").mkdir(exist_ok=True)
    stale = [old_model / f"checkpoint.pt.{gone}.00000001.part", old_model / f"config.json.{gone}.00000002.part",
             old_model / "recent" / f"step-400.pt.{gone}.00000003.part"]
    kept = [old_model / "checkpoint.pt.deadbeef.part", old_model / f"notes.txt.{gone}.00000004.part"]
    for path in stale + kept:
        path.write_bytes(b"half a checkpoint")
    config = json.loads((old_model / "config.json").read_text())
    result = run("train", EXAMPLE_TABLE, "-o", old_model, "--resume", "--max-steps", config["training"]["max_steps"])
    assert result.exit_code == 0, result.stderr
    assert not any(path.exists() for path in stale)
    assert all(path.read_bytes() == b"half a checkpoint" for path in kept)  # not provably the model's


def test_translate_moses_makes_no_working_folder_beside_an_output_written_in_place(tmp_path):
    """``translate --moses`` keeps its working folder at OUTPUT.work: beside /dev/stdout (or a
    link to a descriptor) it would make one where nothing may be made; it is refused first."""
    from phrase_scorer.rescoring.translation import TunedSystem, translate_reranked

    source = tmp_path / "src.en"
    source.write_text("a man\n")
    link, redirected, fd = descriptor_link(tmp_path, "/proc/self/fd")
    try:
        with pytest.raises(PhraseScorerError, match="working folder would go beside it.*working_dir"):
            translate_reranked(source, link, TunedSystem(None, tmp_path / "moses.ini", tmp_path / "reranker.json"))
    finally:
        os.close(fd)
    assert beside(link) == ["out"] and redirected.read_bytes() == b"kept\n"


def test_the_folder_where_a_replacement_is_built_is_not_taken_as_an_output(tmp_path, old_model, tiny_model):
    building = marked_build(old_model, tiny_model)
    kept = folder_bytes(building)
    line = error_line(run("train", EXAMPLE_TABLE, "-o", building, "--overwrite", *TRAIN, "--max-steps", 5))
    assert "m5.new" in line and "replaces" in line and "--resume" in line
    assert folder_bytes(building) == kept


def test_an_output_in_a_folder_that_keeps_no_new_file_is_refused_in_one_line(tmp_path, tiny_model, table):
    """/proc/self/fdinfo is a folder in which creating a file fails as if it had vanished at once:
    the lock of the output was tried again and again, for ever."""
    done = subprocess.run([sys.executable, "-m", "phrase_scorer", "score", "-m", str(tiny_model), str(table), "-o",
                           "/proc/self/fdinfo/scores"], capture_output=True, text=True,
                          timeout=300)  # bounds a hang only
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("phrase-scorer: error: /proc/self/fdinfo/scores.lock: cannot create"), done.stderr


# --- a resumable part takes its name only once its record names it ---------------------------------

KILLED_AT = """
import os, signal, sys
from phrase_scorer.io.atomic import AtomicOutput
from phrase_scorer.runtime.job import OutputJob
def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[1] == "record":
    OutputJob._write_record = killed
else:
    AtomicOutput.publish = killed
from phrase_scorer.cli import main
sys.argv = ["phrase-scorer", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("point", ["record", "publish"])
def test_a_run_killed_before_its_part_is_named_leaves_nothing_in_the_next_runs_way(tmp_path, tiny_model, table,
                                                                                    point):
    """Killed after making its partial output and before its resume record names it (or before
    the part takes its name), a run leaves no OUT.part that no record names: the next run, with
    --resume, goes on to the bytes of a run never killed, and leaves nothing beside them."""
    args = ["annotate", str(table), "-m", str(tiny_model), "--workers", "0", "--threads", "1"]
    reference = tmp_path / "reference.txt"
    assert run(*args, "-o", reference).exit_code == 0
    out = tmp_path / "out.txt"
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, point, *args, "-o", str(out)],
                            capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert not Path(f"{out}.part").exists()  # before: an OUT.part no record names, refused by every later run
    resumed = run(*args, "-o", out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert out.read_bytes() == reference.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.txt")) == ["out.txt", "out.txt.json"]
