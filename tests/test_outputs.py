"""What a command may write over: outputs that are inputs, links, devices, existing files and
models; and the one-line errors of damaged inputs (phrase_scorer/io/outputs.py and its callers).

The tests are numbered like the list in docs/reliability.md ("Outputs and the user's files").
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, VAL_EN, VAL_FR, error_line, head_lines
from conftest import run_cli as run

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
LOG = os.environ.get("PHRASE_SCORER_RELIABILITY_LOG")


def record(case: str, outcome: str) -> None:
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"kind": "outputs", "case": case, "outcome": outcome}) + "\n")


@pytest.fixture()
def table(tmp_path) -> Path:
    """The first 60 lines of the example table, plain text."""
    path = tmp_path / "pt.txt"
    path.write_bytes(b"".join(head_lines(EXAMPLE_TABLE, 60)))
    return path


@pytest.fixture()
def ini(tmp_path) -> Path:
    path = tmp_path / "moses.ini"
    path.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.txt "
                    "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    return path


@pytest.fixture()
def annotated(tmp_path, table, tiny_model) -> Path:
    out = tmp_path / "pt.rnn.gz"
    assert run("annotate", table, "-m", tiny_model, "-o", out).exit_code == 0
    return out


def snapshot(*paths):
    return [(p, p.read_bytes()) for p in paths]


def unchanged(saved) -> bool:
    return all(p.read_bytes() == data for p, data in saved)


# --- 1. an output that is an input ----------------------------------------------------------------


@pytest.mark.parametrize("verb", ["translate", "score", "moses-ini", "annotate", "rescore"])
def test_1_an_output_equal_to_an_input_is_refused(tmp_path, tiny_model, table, ini, verb):
    sentences = tmp_path / "src.en"
    sentences.write_text("a man in a blue shirt\ntwo dogs\n")
    nbest = tmp_path / "nbest.txt"
    nbest.write_bytes(gzip.decompress(NBEST.read_bytes()))
    args, target = {
        "translate": (["translate", "-m", tiny_model, sentences, "-o", sentences], sentences),
        "score": (["score", "-m", tiny_model, table, "-o", table], table),
        "moses-ini": (["moses-ini", ini, "--phrase-table", table, "--add-features", 0, "-o", ini], ini),
        "annotate": (["annotate", table, "-m", tiny_model, "-o", table, "--overwrite"], table),
        "rescore": (["rescore", nbest, "--source", SOURCE, "-m", tiny_model, "-o", nbest, "--overwrite"], nbest),
    }[verb]
    saved = snapshot(target)
    line = error_line(run(*args))
    assert f"{target} is the same file as" in line
    assert unchanged(saved)
    assert not list(tmp_path.glob("*.part"))
    record(f"1. {verb}: output = input", "refused, input kept")


# --- 2. a moses.ini written over a phrase table ---------------------------------------------------


def test_2_moses_ini_output_equal_to_the_new_table_is_refused(tmp_path, ini, annotated):
    saved = snapshot(annotated, ini)
    line = error_line(run("moses-ini", ini, "--phrase-table", annotated, "-o", annotated))
    assert f"{annotated} is the same file as the phrase table {annotated}" in line
    assert unchanged(saved)
    record("2. moses-ini -o = --phrase-table", "refused, table kept")


@pytest.mark.parametrize("where", ["input table", "output table"])
def test_2_annotate_ini_output_on_a_table_is_refused_before_any_work(tmp_path, tiny_model, table, ini, where):
    out = tmp_path / "out.gz"
    ini_output = table if where == "input table" else out
    saved = snapshot(table, ini)
    line = error_line(run("annotate", table, "-m", tiny_model, "-o", out, "--ini", ini, "--ini-output", ini_output))
    assert str(ini_output) in line and ("same file" in line or "is the annotated table" in line)
    assert unchanged(saved)
    assert not out.exists()  # refused before the table was annotated
    record(f"2. annotate --ini-output = {where}", "refused before annotating")


# --- 3. links --------------------------------------------------------------------------------------


def test_3_an_output_reached_through_a_link_is_refused(tmp_path, tiny_model, annotated):
    link = tmp_path / "link.gz"
    link.symlink_to(annotated.name)
    saved = snapshot(annotated)
    line = error_line(run("annotate", link, "-m", tiny_model, "-o", annotated, "--overwrite"))
    assert f"the output {annotated} is the same file as the phrase table {link} (through a link)" in line
    assert unchanged(saved)
    hard = tmp_path / "hard.gz"
    os.link(annotated, hard)
    error_line(run("annotate", hard, "-m", tiny_model, "-o", annotated, "--overwrite"))
    assert unchanged(saved)
    record("3. annotate: output = input through a symbolic or hard link", "refused, input kept")


@pytest.mark.parametrize("linked", ["nbest", "source"])
def test_3_rescore_through_a_link_is_refused(tmp_path, tiny_model, linked):
    nbest, source = tmp_path / "nbest.gz", tmp_path / "src.en"
    shutil.copy(NBEST, nbest)
    shutil.copy(SOURCE, source)
    target = nbest if linked == "nbest" else source
    link = tmp_path / "link"
    link.symlink_to(target)
    saved = snapshot(nbest, source)
    args = (["rescore", link, "--source", source] if linked == "nbest" else ["rescore", nbest, "--source", link])
    line = error_line(run(*args, "-m", tiny_model, "-o", target, "--overwrite"))
    assert "same file" in line and str(link) in line
    assert unchanged(saved)
    record(f"3. rescore: output = the {linked} through a link", "refused, input kept")


def test_3_a_file_written_beside_the_output_that_is_an_input_is_refused(tmp_path, tiny_model, table):
    part = tmp_path / "out.txt.part"
    shutil.copy(table, part)
    saved = snapshot(part)
    line = error_line(run("annotate", part, "-m", tiny_model, "-o", tmp_path / "out.txt"))
    assert f"{part}, written beside the output" in line
    assert unchanged(saved)
    model_file = Path(tiny_model) / "config.json"
    saved = snapshot(model_file)
    error_line(run("score", "-m", tiny_model, table, "-o", model_file, "--overwrite"))
    assert unchanged(saved)
    record("3. annotate IN.part -o IN; score -o MODEL/config.json", "refused, input kept")


# --- 4. devices and pipes ----------------------------------------------------------------------------


def test_4_a_character_device_is_written_to_not_replaced(tmp_path, tiny_model, table):
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    node = tmp_path / "mynull"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    for args in (["score", "-m", tiny_model, table, "-o", node],
                 ["annotate", table, "-m", tiny_model, "-o", node],
                 ["translate", "-m", tiny_model, table, "-o", node]):
        result = run(*args)
        assert result.exit_code == 0, result.stderr
        assert stat.S_ISCHR(os.stat(node).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mynull", "pt.txt"]  # no .part, .lock or .json
    record("4. score/annotate/translate -o a character device", "written to, node kept")


def test_4_a_fifo_is_written_to_not_replaced(tmp_path, tiny_model, table):
    fifo = tmp_path / "scores.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = run("score", "-m", tiny_model, table, "-o", fifo)
    reader.join(timeout=120)  # bounds a hang only: the write above has ended
    assert result.exit_code == 0, result.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert received and len(received[0].splitlines()) == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt", "scores.fifo"]  # no .part, .lock or .json
    record("4. score -o a FIFO", "written to, FIFO kept")


def test_4_a_block_device_is_refused(tmp_path, tiny_model, table):
    if os.geteuid() != 0:
        pytest.skip("mknod of a block device needs root")
    node = tmp_path / "disk"
    os.mknod(node, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device number; never opened
    line = error_line(run("score", "-m", tiny_model, table, "-o", node))
    assert "is a block device" in line
    assert stat.S_ISBLK(os.stat(node).st_mode)


# --- 5. a model directory without config.json ---------------------------------------------------------


@pytest.mark.parametrize("resume", [False, True])
def test_5_a_model_without_config_is_not_replaced(tmp_path, tiny_model, resume):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns("cache"))
    (model / "config.json").unlink()
    saved = snapshot(model / "model.pt", model / "checkpoint.pt", model / "train.log.jsonl")
    args = ["train", EXAMPLE_TABLE, "-o", model, "--preset", "tiny", "--max-steps", 5, "--valid-pairs", 100]
    line = error_line(run(*args, *(["--resume"] if resume else [])))
    assert "holds a model without its config.json" in line and "--overwrite" in line
    assert unchanged(saved)
    record(f"5. train {'--resume ' if resume else ''}into a model without config.json", "refused, model kept")


# --- 6. existing outputs and leftovers --------------------------------------------------------------


@pytest.mark.parametrize("verb", ["annotate", "rescore", "translate", "score"])
def test_6_an_existing_output_is_replaced_only_with_overwrite(tmp_path, tiny_model, table, verb):
    out = tmp_path / "out.txt"
    out.write_bytes(b"the user's file\n")
    args = {
        "annotate": ["annotate", table, "-m", tiny_model, "-o", out],
        "rescore": ["rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", out],
        "translate": ["translate", "-m", tiny_model, SOURCE, "-o", out],
        "score": ["score", "-m", tiny_model, table, "-o", out],
    }[verb]
    line = error_line(run(*args))
    assert f"{out}: the output already exists" in line and "--overwrite" in line
    assert out.read_bytes() == b"the user's file\n"
    result = run(*args, "--overwrite")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() != b"the user's file\n"
    record(f"6. {verb} -o an existing file", "refused; replaced with --overwrite")


@pytest.mark.parametrize("verb", ["annotate", "rescore"])
def test_6_a_failure_on_an_empty_input_leaves_no_part(tmp_path, tiny_model, verb):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    out = tmp_path / "out.gz"
    args = (["annotate", empty, "-m", tiny_model, "-o", out] if verb == "annotate"
            else ["rescore", empty, "--source", empty, "-m", tiny_model, "-o", out])
    assert "is empty" in error_line(run(*args))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]
    record(f"6. {verb} of an empty input", "error, nothing left behind")


def test_6_resume_continues_without_overwrite(tmp_path, tiny_model, table):
    """--resume of a finished output does nothing and needs no --overwrite."""
    out = tmp_path / "out.gz"
    assert run("annotate", table, "-m", tiny_model, "-o", out).exit_code == 0
    before = out.read_bytes()
    result = run("annotate", table, "-m", tiny_model, "-o", out, "--resume")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == before


# --- 6. the verbs that write figures, reports and Moses files ---------------------------------------


def other_writers(tmp_path, tiny_model, search_model, table, ini, out):
    """Every other verb that writes, as name -> (arguments writing ``out``, one of its inputs).
    The inputs are copies in ``tmp_path``. The Moses verbs check their output before they look for
    Moses, so their refusals need no Moses build."""
    dev_src, dev_ref = tmp_path / "dev.en", tmp_path / "dev.fr"
    dev_src.write_text("a man\n")
    dev_ref.write_text("un homme\n")
    nbest, source = tmp_path / "nbest.gz", tmp_path / "val.en"
    shutil.copyfile(NBEST, nbest)
    shutil.copyfile(VAL_EN, source)
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(tiny_model, model)
    return {
        "tune": (["tune", ini, "--dev", dev_src, dev_ref, "-o", out], ini),
        "rerank": (["rerank", "--dev", nbest, dev_ref, "--test", nbest, "-o", out], nbest),
        "evaluate": (["evaluate", ini, "--test", dev_src, dev_ref, "-o", out], dev_ref),
        "plot scores": (["plot", "scores", table, "-o", out], table),
        "plot embeddings": (["plot", "embeddings", "-m", model, "-o", out, "--words", 20, "--labels", 5],
                            model / "config.json"),
        "plot alignments": (["plot", "alignments", "-m", search_model, "--source", source, "--target", VAL_FR,
                             "--lines", 2, "-o", out], source),
        "experiment --report": (["experiment", ini, "--annotated", table, "--dev", dev_src, dev_ref,
                                 "--test", dev_src, dev_ref, "-o", tmp_path / "work", "--report", out], table),
        "rescore-experiment --report": (["rescore-experiment", ini, "--dev", dev_src, dev_ref, "--test", dev_src,
                                         dev_ref, "-m", f"m={model}", "-o", tmp_path / "work", "--report", out],
                                        dev_src),
    }


OTHER_WRITERS = ["tune", "rerank", "evaluate", "plot scores", "plot embeddings", "plot alignments",
                 "experiment --report", "rescore-experiment --report"]
WRITTEN_FILE = {"plot alignments": "out-2.png"}  # OUT.png -> OUT-LINE.png


@pytest.mark.parametrize("verb", OTHER_WRITERS)
def test_6_every_other_writer_replaces_an_existing_output_only_with_overwrite(tmp_path, tiny_model, sentence_models,
                                                                               table, ini, verb, monkeypatch):
    if verb.startswith("plot"):
        pytest.importorskip("matplotlib")
    monkeypatch.setenv("MOSES_HOME", str(tmp_path / "no-moses"))
    out = tmp_path / "out.png"
    written = tmp_path / WRITTEN_FILE.get(verb, out.name)
    written.write_bytes(b"the user's file\n")
    args, _ = other_writers(tmp_path, tiny_model, sentence_models("rnnsearch"), table, ini, out)[verb]
    line = error_line(run(*args))
    assert f"{written}: the " in line and "already exists" in line and "--overwrite" in line, line
    assert written.read_bytes() == b"the user's file\n"
    result = run(*args, "--overwrite")
    if verb.startswith("plot"):
        assert result.exit_code == 0, result.stderr
        assert written.read_bytes().startswith(b"\x89PNG")
    else:  # past the output check, the verb goes on to look for Moses, which is not there
        last = error_line(result)
        assert "already exists" not in last and "no-moses" in last, last
        assert written.read_bytes() == b"the user's file\n"
    record(f"6. {verb} -o an existing file", "refused; replaced with --overwrite")


@pytest.mark.parametrize("verb", OTHER_WRITERS)
def test_3_every_other_writer_refuses_an_output_linked_to_an_input(tmp_path, tiny_model, sentence_models, table, ini,
                                                                   verb):
    out = tmp_path / "out.png"
    args, victim = other_writers(tmp_path, tiny_model, sentence_models("rnnsearch"), table, ini, out)[verb]
    written = tmp_path / WRITTEN_FILE.get(verb, out.name)
    saved = snapshot(victim)
    os.symlink(victim, written)
    line = error_line(run(*args, "--overwrite"))
    assert "is the same file as" in line and "(through a link)" in line, line
    assert unchanged(saved) and written.is_symlink()
    record(f"3. {verb} -o a link to one of its inputs", "refused, input kept")


@pytest.mark.parametrize("verb", ["tune", "rerank", "evaluate"])
def test_4_moses_file_outputs_refuse_devices(tmp_path, tiny_model, sentence_models, table, ini, verb):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args, _ = other_writers(tmp_path, tiny_model, sentence_models("rnnsearch"), table, ini, fifo)[verb]
    line = error_line(run(*args))
    assert f"{fifo}: the " in line and "must be a regular file" in line, line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not list(tmp_path.glob("fifo.*"))
    record(f"4. {verb} -o a FIFO", "refused: its output is a file with files beside it")


# --- 7. many unknown words ---------------------------------------------------------------------------


def test_7_the_unknown_word_column_is_capped_and_annotate_reads_its_output(tmp_path, tiny_model):
    from phrase_scorer.scoring.columns import UNK_CAP

    table = tmp_path / "t.txt"
    words = " ".join(f"zzunknown{i}" for i in range(800))
    table.write_text(f"a man ||| {words} ||| 0.5 0.5 0.5 0.5\na man ||| un homme ||| 0.5 0.5 0.5 0.5\n")
    out = tmp_path / "o.txt"
    assert run("annotate", table, "-m", tiny_model, "-o", out).exit_code == 0
    unk = [float(line.split(" ||| ")[2].split()[-1]) for line in out.read_text().splitlines()]
    assert UNK_CAP == 88 and unk[0] == pytest.approx(math.exp(88), rel=1e-8)
    assert unk[0] < 3.4028235e38  # a finite 32-bit float: what Moses reads
    signature = json.loads((tmp_path / "o.txt.json").read_text())
    assert "min(unknown words, 88)" in signature["column_values"]["unk"]
    again = run("annotate", out, "-m", tiny_model, "-o", tmp_path / "o2.txt")
    assert again.exit_code == 0, again.stderr
    record("7. 800 unknown words", "column e^88; the output annotates again")


# --- 8. tracebacks -------------------------------------------------------------------------------------


def test_8_a_one_byte_weights_file_gives_one_line(tmp_path, tiny_model, table):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model, ignore=shutil.ignore_patterns("cache"))
    (model / "model.pt").write_bytes(b"\x87")
    (model / "checkpoint.pt").write_bytes(b"\x87")
    assert "not a readable PyTorch weights file" in error_line(run("score", "-m", model, table))
    line = error_line(run("train", EXAMPLE_TABLE, "-o", model, "--preset", "tiny", "--max-steps", 5, "--resume"))
    assert "checkpoint.pt" in line and "not a readable PyTorch weights file" in line
    record("8. weights file holding one byte 0x87 (score, train --resume)", "one-line error")


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_8_sample_with_invalid_utf8_gives_one_line(tmp_path, tiny_model, source):
    data = b"a man\n\xff\xfe dog\n"
    path = tmp_path / "in.txt"
    path.write_bytes(data)
    if source == "file":
        result = run("sample", "-m", tiny_model, "-i", path)
    else:
        result = run("sample", "-m", tiny_model, "-i", "-", input=data)
    line = error_line(result)
    assert "line 2: invalid UTF-8" in line
    record(f"8. sample -i {source} with invalid UTF-8", "one-line error")


# --- 9. messages ------------------------------------------------------------------------------------


def complete_lines(compressed: bytes) -> int:
    """The lines a reader can get whole out of a (possibly cut) gzip stream."""
    d = zlib.decompressobj(31)
    return d.decompress(compressed).count(b"\n")


def test_9_trailing_bytes_after_gzip_are_named(tmp_path, tiny_model):
    path = tmp_path / "t.gz"
    data = gzip.decompress(EXAMPLE_TABLE.read_bytes())
    path.write_bytes(gzip.compress(data) + b"garbage\n")
    lines = data.count(b"\n")
    line = error_line(run("annotate", path, "-m", tiny_model, "-o", tmp_path / "o.gz"))
    assert (f"cannot read after line {lines}: the gzip data ends there and is followed by 8 bytes that are not gzip"
            in line)
    assert "truncated" not in line
    record("9. trailing bytes after the gzip data", "named as such, with the last line")


def test_9_a_truncated_gzip_names_the_last_line_read(tmp_path, tiny_model):
    compressed = EXAMPLE_TABLE.read_bytes()
    path = tmp_path / "cut.gz"
    path.write_bytes(compressed[: len(compressed) // 3])
    expected = complete_lines(path.read_bytes())
    line = error_line(run("annotate", path, "-m", tiny_model, "-o", tmp_path / "o.gz", "--window-lines", 500))
    assert f"cannot read after line {expected}: the gzip stream ends early: the file is truncated" in line
    assert expected % 500 != 0  # not a window boundary
    line = error_line(run("score", "-m", tiny_model, path))
    assert f"after line {expected}:" in line
    record("9. truncated gzip", "names the last complete line")


def test_9_moses_ini_on_a_patched_ini_says_so(tmp_path, ini, annotated):
    patched = tmp_path / "patched.ini"
    assert run("moses-ini", ini, "--phrase-table", annotated, "-o", patched).exit_code == 0
    line = error_line(run("moses-ini", patched, "--phrase-table", annotated, "-o", tmp_path / "again.ini"))
    assert "looks patched already" in line and "annotate it first" not in line
    record("9. moses-ini on a patched ini", "says it is patched already")


def test_9_a_full_disk_on_stdout_names_stdout(tmp_path, tiny_model, table):
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with open("/dev/full", "wb") as full:
        done = subprocess.run([sys.executable, "-m", "phrase_scorer", "score", "-m", str(tiny_model), str(table)],
                              stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("phrase-scorer: error: <stdout>: no space left") and "<stdin>" not in last
    result = run("score", "-m", tiny_model, table, "-o", "/dev/full")  # a device, written in place
    assert "/dev/full: no space left" in error_line(result)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    record("9. a full disk on standard output", "names <stdout>")


def test_9_resuming_a_finished_output_says_it_is_finished(tmp_path, tiny_model, table):
    out = tmp_path / "out.gz"
    assert run("annotate", table, "-m", tiny_model, "-o", out).exit_code == 0
    result = run("annotate", table, "-m", tiny_model, "-o", out, "--resume")
    assert result.exit_code == 0
    assert "is already finished (60 lines" in result.stderr and "lines/s" not in result.stderr
    record("9. --resume of a finished output", "says it is finished")


def test_1_a_file_kept_beside_the_model_is_not_the_model(tmp_path, tiny_model):
    """A translation written into the model's folder is the user's file, replaced with
    --overwrite; the model's own files stay refused."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    source = tmp_path / "src.en"
    source.write_text("a man\n")
    out = model / "test.fr"
    assert run("translate", "-m", model, source, "-o", out).exit_code == 0
    result = run("translate", "-m", model, source, "-o", out, "--overwrite")
    assert result.exit_code == 0, result.stderr
    line = error_line(run("translate", "-m", model, source, "-o", model / "model.pt", "--overwrite"))
    assert "is the same file as a file of the model" in line
