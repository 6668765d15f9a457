"""Nothing lost, round four: the files a command writes beside its output (``OUT.lock``,
``OUT.part``, ``OUT.part.json``), what ``--resume`` trusts, and the mode of a replaced output
(phrase_scorer/runtime/job.py, phrase_scorer/io/atomic.py, phrase_scorer/io/output_lock.py).

Every test names the case of docs/reliability.md ("Nothing lost, round four") it guards; each
failed on the code before the job runner.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import stat
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, error_line, head_lines
from conftest import run_cli as run

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
PRECIOUS = b"the user's own notes\n"


@pytest.fixture()
def table(tmp_path) -> Path:
    """The first 900 lines of the example table, plain text."""
    path = tmp_path / "pt.txt"
    path.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 900)))
    return path


@pytest.fixture()
def precious(tmp_path) -> Path:
    path = tmp_path / "important.txt"
    path.write_bytes(PRECIOUS)
    return path


@contextlib.contextmanager
def interrupted_after(monkeypatch, chunks: int):
    """Every job's ``write`` raises KeyboardInterrupt (Ctrl-C) when it would write chunk
    ``chunks`` + 1: a run interrupted there, its first chunks finished and recorded."""
    from phrase_scorer.runtime.job import OutputJob

    write, count = OutputJob.write, {"n": 0}

    def stop(self, lines, data):
        if count["n"] == chunks:
            raise KeyboardInterrupt
        count["n"] += 1
        write(self, lines, data)

    monkeypatch.setattr(OutputJob, "write", stop)
    try:
        yield
    finally:
        monkeypatch.setattr(OutputJob, "write", write)


def verbs(tmp_path, model, table, out):
    sentences = tmp_path / "sentences.en"
    sentences.write_text("a man\nthe dog runs\n")
    return {
        "translate": ["translate", "-m", model, sentences, "-o", out],
        "score": ["score", "-m", model, table, "-o", out],
        "annotate": ["annotate", table, "-m", model, "-o", out],
        "rescore": ["rescore", NBEST, "--source", SOURCE, "-m", model, "-o", out],
    }


# --- the lock ------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["translate", "score", "annotate", "rescore"])
def test_a_lock_that_is_a_link_to_a_users_file_is_refused_and_the_file_kept(tmp_path, tiny_model, table, precious,
                                                                             verb):
    out = tmp_path / "out.fr"
    Path(f"{out}.lock").symlink_to(precious)
    line = error_line(run(*verbs(tmp_path, tiny_model, table, out)[verb]))
    assert f"{out}.lock is a symbolic link, not a lock of this tool" in line
    assert precious.read_bytes() == PRECIOUS and os.path.islink(f"{out}.lock") and not out.exists()


def test_a_lock_that_links_to_the_commands_own_input_leaves_the_input_whole(tmp_path, tiny_model, table):
    saved = table.read_bytes()
    out = tmp_path / "scores"
    Path(f"{out}.lock").symlink_to(table)
    error_line(run("score", "-m", tiny_model, table, "-o", out))
    assert table.read_bytes() == saved


def test_moses_ini_never_truncates_its_input_through_a_planted_lock(tmp_path):
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.txt "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    saved = ini.read_bytes()
    table = tmp_path / "pt.rnn.gz"
    table.write_bytes(gzip.compress(b"a ||| un ||| 0.5 0.5 0.5 0.5 0.6 2.718281828\n"))
    out = tmp_path / "moses.rnn.ini"
    Path(f"{out}.lock").symlink_to(ini)
    error_line(run("moses-ini", ini, "--phrase-table", table, "-o", out))
    assert ini.read_bytes() == saved


@pytest.mark.parametrize("verb", ["translate", "score", "annotate"])
def test_a_users_own_file_named_like_the_lock_is_refused_and_never_removed(tmp_path, tiny_model, table, verb):
    out = tmp_path / "out.fr"
    mine = Path(f"{out}.lock")
    mine.write_bytes(PRECIOUS)
    line = error_line(run(*verbs(tmp_path, tiny_model, table, out)[verb]))
    assert "holds something else, not a lock of this tool" in line and f"move {mine} away" in line
    assert mine.read_bytes() == PRECIOUS


def test_a_users_file_beside_a_model_folder_named_like_its_lock_is_never_removed(tmp_path):
    model = tmp_path / "model"
    mine = tmp_path / "model.lock"
    mine.write_bytes(PRECIOUS)
    line = error_line(run("train", EXAMPLE_TABLE, "-o", model, "--preset", "tiny", "--max-steps", 2))
    assert "not a lock of this tool" in line
    assert mine.read_bytes() == PRECIOUS


def test_a_stale_lock_of_a_killed_run_is_taken_over_and_removed_at_the_end(tmp_path, tiny_model, table):
    """A killed run leaves its lock file (no process holds it): the next run takes it over."""
    from phrase_scorer.io.output_lock import LOCK_MAGIC

    out = tmp_path / "scores"
    Path(f"{out}.lock").write_bytes(LOCK_MAGIC + b"pid 999999\n")
    assert run("score", "-m", tiny_model, table, "-o", out).exit_code == 0
    assert out.exists() and not Path(f"{out}.lock").exists()


# --- OUT.part ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["annotate", "rescore"])
def test_a_partial_output_that_is_a_link_is_refused_and_its_target_kept(tmp_path, tiny_model, table, precious,
                                                                        verb):
    out = tmp_path / "out.gz"
    Path(f"{out}.part").symlink_to(precious)
    line = error_line(run(*verbs(tmp_path, tiny_model, table, out)[verb]))
    assert f"{out}.part" in line and "no resume record of this tool names it" in line
    assert precious.read_bytes() == PRECIOUS and not out.exists()


@pytest.mark.parametrize("verb", ["translate", "score"])
def test_a_link_where_a_partial_output_went_is_neither_followed_nor_made_the_output(tmp_path, tiny_model, table,
                                                                                   precious, verb):
    out = tmp_path / "out.fr"
    Path(f"{out}.part").symlink_to(precious)
    assert run(*verbs(tmp_path, tiny_model, table, out)[verb]).exit_code == 0
    assert precious.read_bytes() == PRECIOUS
    assert out.is_file() and not out.is_symlink()


def test_a_users_file_at_the_partial_outputs_name_is_refused_and_kept(tmp_path, tiny_model, table):
    out = tmp_path / "out.gz"
    mine = Path(f"{out}.part")
    mine.write_bytes(PRECIOUS)
    error_line(run("annotate", table, "-m", tiny_model, "-o", out))
    assert mine.read_bytes() == PRECIOUS


# --- what --resume trusts -------------------------------------------------------------------------


def same_size_change(path: Path) -> None:
    """Change one byte of ``path`` and put its modification time back (``touch -r``, ``cp -p``)."""
    info = path.stat()
    data = bytearray(path.read_bytes())
    i = data.index(b"man")
    data[i:i + 3] = b"men"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_mtime_ns == info.st_mtime_ns and path.stat().st_size == info.st_size


def test_annotate_resume_refuses_an_input_changed_with_its_time_restored(tmp_path, tiny_model, table, monkeypatch):
    out = tmp_path / "out.gz"
    with interrupted_after(monkeypatch, 1):
        assert run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300).exit_code == 130
    assert Path(f"{out}.part").exists()
    same_size_change(table)
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300, "--resume"))
    assert "cannot resume: input changed since the interrupted run (input.sha256: " in line
    assert not out.exists()


def test_rescore_resume_refuses_a_list_changed_with_its_time_restored(tmp_path, tiny_model, monkeypatch):
    nbest = tmp_path / "list.nbest"
    nbest.write_bytes(gzip.decompress(NBEST.read_bytes()))
    out = tmp_path / "out.nbest"
    with interrupted_after(monkeypatch, 1):
        assert run("rescore", nbest, "--source", SOURCE, "-m", tiny_model, "-o", out,
                   "--window-lines", 50).exit_code == 130
    same_size_change(nbest)
    line = error_line(run("rescore", nbest, "--source", SOURCE, "-m", tiny_model, "-o", out, "--window-lines", 50,
                          "--resume"))
    assert "cannot resume: input changed since the interrupted run (input.sha256: " in line


def test_a_recorded_hash_is_reused_only_for_the_very_same_untouched_file(tmp_path):
    from phrase_scorer.io.file_identity import file_identity, hash_identities, identity_change

    path = tmp_path / "a.txt"
    path.write_text("a man\n")
    saved = hash_identities(file_identity(path))
    assert identity_change(saved, file_identity(path)) is None  # untouched: the hash is taken as recorded
    path.write_text("a men\n")
    os.utime(path, ns=(saved["mtime_ns"], saved["mtime_ns"]))
    change = identity_change(saved, file_identity(path))
    assert change is not None and change[0] == "sha256"
    legacy = {key: saved[key] for key in ("path", "size", "mtime_ns", "sha256")}  # a record without the inode
    assert identity_change(legacy, file_identity(path)) is not None


def test_train_resume_refuses_a_corpus_changed_with_its_time_restored(tmp_path):
    from conftest import TRAIN_EN, TRAIN_FR

    en, fr = tmp_path / "c.en", tmp_path / "c.fr"
    en.write_bytes(gzip.decompress(TRAIN_EN.read_bytes()))
    fr.write_bytes(gzip.decompress(TRAIN_FR.read_bytes()))
    out = tmp_path / "model"
    options = ["--preset", "tiny", "--arch", "encdec", "--valid-pairs", 20, "--valid-every", 4]
    assert run("train", "--corpus", en, fr, "-o", out, "--max-steps", 4, *options).exit_code == 0
    same_size_change(en)
    line = error_line(run("train", "--corpus", en, fr, "-o", out, "--max-steps", 8, "--resume", *options))
    assert "changed" in line and "source" in line


def test_a_partial_output_changed_at_the_same_size_is_not_continued(tmp_path, tiny_model, table, monkeypatch):
    out = tmp_path / "out.txt"
    with interrupted_after(monkeypatch, 2):
        assert run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300).exit_code == 130
    part = Path(f"{out}.part")
    data = bytearray(part.read_bytes())
    data[5] = ord("Z") if data[5] != ord("Z") else ord("Y")
    part.write_bytes(bytes(data))
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300, "--resume"))
    assert "the partial output's bytes changed since its resume record was written" in line
    assert part.read_bytes() == bytes(data) and not out.exists()


def test_an_interrupted_annotation_resumes_to_the_same_bytes(tmp_path, tiny_model, table, monkeypatch):
    whole = tmp_path / "whole.gz"
    assert run("annotate", table, "-m", tiny_model, "-o", whole, "--window-lines", 300).exit_code == 0
    out = tmp_path / "out.gz"
    with interrupted_after(monkeypatch, 1):
        assert run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300).exit_code == 130
    assert run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300, "--resume").exit_code == 0
    assert out.read_bytes() == whole.read_bytes()
    assert not Path(f"{out}.part").exists() and not Path(f"{out}.part.json").exists()


def test_a_resume_record_that_is_not_the_tools_is_refused_and_kept(tmp_path, tiny_model, table):
    out = tmp_path / "out.gz"
    mine = Path(f"{out}.part.json")
    mine.write_bytes(PRECIOUS)
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out))
    assert "not a resume record this run can trust" in line
    assert mine.read_bytes() == PRECIOUS


# --- the mode of a replaced output -------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["translate", "score", "annotate", "rescore"])
def test_overwrite_keeps_the_mode_of_the_output_it_replaces(tmp_path, tiny_model, table, verb):
    out = tmp_path / "out.txt"
    out.write_bytes(PRECIOUS)
    out.chmod(0o600)
    assert run(*verbs(tmp_path, tiny_model, table, out)[verb], "--overwrite").exit_code == 0
    assert out.read_bytes() != PRECIOUS
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_a_missing_output_folder_is_named_not_the_lock(tmp_path, tiny_model, table):
    line = error_line(run("score", "-m", tiny_model, table, "-o", tmp_path / "nodir" / "x"))
    assert "the output folder does not exist" in line and ".lock" not in line


def test_a_failed_run_leaves_no_temporary_file(tmp_path, tiny_model):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a ||| b\n\xff\xfe ||| c\n")
    error_line(run("score", "-m", tiny_model, bad, "-o", tmp_path / "out.txt"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


# --- what a hostile reading of the rules above found --------------------------------------------------


def test_resume_never_replaces_a_users_file_where_the_patched_ini_goes(tmp_path, tiny_model, table):
    """The patched moses.ini is written after the table: an interrupted run never wrote one, so
    one found by --resume is not the run's own and is replaced only with --overwrite."""
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.txt "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    out = tmp_path / "out.gz"
    mine = Path(f"{out}.moses.ini")
    mine.write_bytes(PRECIOUS)
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out, "--ini", ini, "--resume"))
    assert "already exists" in line and mine.read_bytes() == PRECIOUS


@pytest.mark.parametrize("content", [b"phrase-scorer output lock\nmy notes: keep them\n", b"4242\n",
                                     b"phrase-scorer output lock\npid 12x\n"])
def test_a_file_that_only_looks_like_a_lock_is_refused_and_kept(tmp_path, tiny_model, table, content):
    out = tmp_path / "scores"
    mine = Path(f"{out}.lock")
    mine.write_bytes(content)
    line = error_line(run("score", "-m", tiny_model, table, "-o", out))
    assert "not a lock of this tool" in line and mine.read_bytes() == content


def test_files_at_a_shards_names_that_no_annotate_run_wrote_are_neither_replaced_nor_removed(tmp_path):
    from phrase_scorer.scoring.annotate import own_shard, remove_shards

    first, second = str(tmp_path / "out.gz.shard-00001-of-00002"), str(tmp_path / "out.gz.shard-00002-of-00002")
    Path(first).write_bytes(PRECIOUS)
    Path(second + ".json").write_bytes(PRECIOUS)
    assert not own_shard(first) and not own_shard(second)
    remove_shards([first, second])
    assert Path(first).read_bytes() == PRECIOUS and Path(second + ".json").read_bytes() == PRECIOUS


def test_a_shard_an_annotate_run_wrote_is_its_own(tmp_path, loaded_tiny, table):
    from phrase_scorer.config import AnnotateOptions, RunOptions
    from phrase_scorer.scoring.annotate import annotate, own_shard, remove_shards

    shard = str(tmp_path / "out.gz.shard-00001-of-00001")
    annotate(table, shard, loaded_tiny, AnnotateOptions(window_lines=300), run=RunOptions(workers=0))
    signature = Path(shard + ".json")
    data = json.loads(signature.read_text())
    data["shard"] = {"rank": 0, "ranks": 1, "lines": [0, 900]}
    signature.write_text(json.dumps(data))
    assert own_shard(shard)
    remove_shards([shard])
    assert not Path(shard).exists() and not signature.exists()


def test_train_never_replaces_a_users_files_that_carry_a_models_names(tmp_path):
    model = tmp_path / "m"
    (model / "cache").mkdir(parents=True)
    (model / "vocab.source.json").write_bytes(PRECIOUS)
    (model / "cache" / "notes.txt").write_bytes(PRECIOUS)
    line = error_line(run("train", EXAMPLE_TABLE, "-o", model, "--preset", "tiny", "--max-steps", 2))
    assert "holds no phrase-scorer model" in line and "vocab.source.json" in line
    assert (model / "vocab.source.json").read_bytes() == PRECIOUS
    assert (model / "cache" / "notes.txt").read_bytes() == PRECIOUS


def test_resume_refuses_a_partial_output_with_another_name(tmp_path, tiny_model, table, monkeypatch):
    """Continuing OUT.part cuts it to its recorded size: never while another name shares its bytes."""
    out = tmp_path / "out.txt"
    with interrupted_after(monkeypatch, 1):
        assert run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300).exit_code == 130
    part = Path(f"{out}.part")
    with part.open("ab") as f:
        f.write(b"a torn chunk")
    backup = tmp_path / "backup"
    os.link(part, backup)
    saved = backup.read_bytes()
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out, "--window-lines", 300, "--resume"))
    assert "has other names" in line
    assert backup.read_bytes() == saved


def test_overwrite_through_a_link_takes_no_mode_from_the_links_target(tmp_path, tiny_model, table):
    target = tmp_path / "private"
    target.write_bytes(PRECIOUS)
    target.chmod(0o600)
    out = tmp_path / "out.txt"
    out.symlink_to(target)
    assert run("score", "-m", tiny_model, table, "-o", out, "--overwrite").exit_code == 0
    assert target.read_bytes() == PRECIOUS and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not out.is_symlink() and stat.S_IMODE(out.stat().st_mode) == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
