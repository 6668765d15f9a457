"""Rules every verb applies to what it is given: an empty file name, a '.gz' output, a
byte-order mark, a whole number in a file, a damaged pair cache."""

from __future__ import annotations

import gzip
import json
import logging
import shutil

import click
import pytest

from conftest import A_MAN_TABLE, DATA, EXAMPLE_TABLE, VAL_EN, error_line, run_cli
from phrase_scorer.cli import cli
from phrase_scorer.config import TrainConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.inputs import text_lines
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.io.nbest import parse_nbest_line, read_nbest
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.io.table_windows import RawWindows, parse_window

NBEST = DATA / "val.nbest.head.gz"
BOM = b"\xef\xbb\xbf"


# --- an empty file name (an unset shell variable) ------------------------------------------------


def path_parameters():
    """(verb, parameter) for every file or folder parameter of every verb, from the click commands."""
    return [(name, param) for name, command in sorted(cli.commands.items()) for param in command.params
            if isinstance(param.type, click.Path)]


def with_empty(command: click.Command, param: click.Parameter) -> list:
    """The verb's arguments with '' given to ``param`` (and a real file to each argument before it)."""
    if isinstance(param, click.Option):
        return [max(param.opts, key=len), *[""] * param.nargs]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    return [str(A_MAN_TABLE)] * arguments.index(param) + [""] * param.nargs


def test_every_verb_has_its_path_parameters_checked():
    found = {(verb, param.name) for verb, param in path_parameters()}
    assert {("score", "output"), ("translate", "output"), ("rescore", "source"), ("train", "output"),
            ("annotate", "table"), ("ems-config", "ini_out")} <= found


@pytest.mark.parametrize("verb, param", path_parameters(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_an_empty_path_is_refused_naming_the_option(verb, param, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # 'train -o ""' trained into the current folder
    result = run_cli(verb, *with_empty(cli.commands[verb], param))
    name = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
    folder = not param.type.file_okay and param.type.dir_okay
    assert error_line(result) == (f"phrase-scorer: error: {name} is empty "
                                  f"(an unset shell variable? give a {'folder' if folder else 'file'} name)")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_model_folder_of_a_named_model_is_refused(tmp_path):
    result = run_cli("rescore-experiment", "-m", "RNN=", DATA / "moses.ini")
    assert error_line(result) == ("phrase-scorer: error: --model is empty "
                                  "(an unset shell variable? give a folder name)")


# --- a name ending in .gz is gzipped -------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.txt"
    lines = [line.split(b" ||| ")[:2] for line in gzip.open(A_MAN_TABLE).read().splitlines()[:40]]
    path.write_bytes(b"".join(b" ||| ".join(pair) + b"\n" for pair in lines))
    return path


def written(path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@pytest.mark.parametrize("verb", ["score", "translate", "annotate", "rescore"])
def test_every_text_output_named_gz_is_gzipped(verb, tiny_model, pairs_file, tmp_path):
    args = {
        "score": ["score", "-m", tiny_model, pairs_file],
        "translate": ["translate", "-m", tiny_model, VAL_EN],
        "annotate": ["annotate", A_MAN_TABLE, "-m", tiny_model, "--workers", "0"],
        "rescore": ["rescore", NBEST, "--source", DATA / "val.tok.en.head", "-m", tiny_model],
    }[verb]
    plain, packed = tmp_path / "out.txt", tmp_path / "out.gz"
    for output in (plain, packed):
        result = run_cli(*args, "-o", output)
        assert result.exit_code == 0, result.stderr
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes() != b""


def test_score_of_nothing_into_a_gz_name_is_an_empty_gzip_file(tiny_model, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    result = run_cli("score", "-m", tiny_model, tmp_path / "empty.txt", "-o", tmp_path / "s.gz")
    assert result.exit_code == 0, result.stderr
    data = (tmp_path / "s.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b" and gzip.decompress(data) == b""


# --- a byte-order mark ----------------------------------------------------------------------------


def read_nbest_list(path):
    return list(read_nbest(path))


def read_table(path):
    return list(PhraseTableReader(path))


def read_table_windows(path):
    return [parse_window(window, path, None) for window in RawWindows(path, 10)]


def read_text(path):
    return list(text_lines(path))


@pytest.mark.parametrize("read, text", [
    (read_text, b"a man\nin a shirt\n"),
    (read_table, b"a ||| un ||| 0.5\n"),
    (read_table_windows, b"a ||| un ||| 0.5\n"),
    (read_nbest_list, b"0 ||| un homme  ||| F= -1 ||| -1\n"),
    (MosesIni.read, b"[feature]\nUnknownWordPenalty\n"),
], ids=["text", "phrase table", "phrase table windows", "n-best list", "moses.ini"])
@pytest.mark.parametrize("name", ["input.txt", "input.gz"])
def test_a_byte_order_mark_is_refused_by_every_reader(read, text, name, tmp_path):
    path = tmp_path / name
    data = BOM + text
    if name.endswith(".gz"):
        if read == MosesIni.read:
            pytest.skip("Moses reads a moses.ini as plain text")
        data = gzip.compress(data)
    path.write_bytes(data)
    with pytest.raises(PhraseScorerError) as caught:
        read(path)
    assert caught.value.path == str(path) and caught.value.line == 1
    assert "byte-order mark" in caught.value.message
    remove = "sed '1s/^\\xEF\\xBB\\xBF//'" if name.endswith(".gz") else "sed --in-place '1s/^\\xEF\\xBB\\xBF//'"
    assert remove in caught.value.hint


def test_translate_refuses_a_byte_order_mark_instead_of_reading_unk(tiny_model, tmp_path):
    source = tmp_path / "source.txt"
    source.write_bytes(BOM + b"a man in a blue shirt\n")
    result = run_cli("translate", "-m", tiny_model, source, "-o", tmp_path / "out.txt")
    line = error_line(result)
    assert line.startswith(f"phrase-scorer: error: {source} line 1: starts with a UTF-8 byte-order mark")
    assert f"sed --in-place '1s/^\\xEF\\xBB\\xBF//' {source}" in line
    assert not (tmp_path / "out.txt").exists()


# --- whole numbers: ASCII digits, never negative -------------------------------------------------


@pytest.mark.parametrize("line, message", [
    ("-1 ||| un homme ||| F= -1 ||| -1", "sentence id -1 is negative"),
    ("\u0661 ||| un homme ||| F= -1 ||| -1", "sentence id '\u0661' is not a whole number"),
    ("1_0 ||| un homme ||| F= -1 ||| -1", "sentence id '1_0' is not a whole number"),
    ("+1 ||| un homme ||| F= -1 ||| -1", "sentence id '+1' is not a whole number"),
    ("0 ||| un homme ||| F= -\u0661 ||| -1", "feature value '-\u0661' of F is not a number"),
    ("0 ||| un homme ||| F= -1 ||| \u0661", "total score '\u0661' is not a number"),
])
def test_an_nbest_number_is_written_in_ascii_digits(line, message):
    with pytest.raises(PhraseScorerError) as caught:
        parse_nbest_line(line, "list.nbest", 7)
    assert caught.value.message == message and caught.value.line == 7


def test_an_nbest_sentence_id_is_read_as_moses_writes_it():
    assert parse_nbest_line("12 ||| un homme ||| F= -1 ||| -1").sentence_id == 12


@pytest.mark.parametrize("read", [read_table, read_table_windows], ids=["phrase table", "phrase table windows"])
def test_a_phrase_table_score_is_written_in_ascii_digits(read, tmp_path):
    path = tmp_path / "table"
    path.write_bytes("a ||| un ||| 0.5\nb ||| deux ||| \u0660.\u0665\n".encode())
    with pytest.raises(PhraseScorerError, match="score '\u0660.\u0665' is not a number") as caught:
        read(path)
    assert caught.value.line == 2


def test_a_moses_ini_weight_is_written_in_ascii_digits(tmp_path):
    path = tmp_path / "moses.ini"
    path.write_text("[feature]\nWordPenalty\n[weight]\nWordPenalty0= \u0661\n", encoding="utf-8")
    with pytest.raises(PhraseScorerError, match="weight '\u0661' of WordPenalty0 is not a number") as caught:
        MosesIni.read(path).weight_line("WordPenalty0")
    assert caught.value.line == 4


# --- a damaged pair cache -------------------------------------------------------------------------

QUICK = dict(preset="tiny", valid_pairs=100, valid_every=5, batch_size=16, seed=5)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run stopped after 5 steps, to be copied and resumed."""
    from phrase_scorer.training.run import train

    out = tmp_path_factory.mktemp("interrupted") / "model"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK))
    return out


def garble_ids(cache):
    path = cache / "train.src.ids"
    path.write_bytes(b"\xff" * path.stat().st_size)
    return path


def garble_description(cache):
    path = cache / "meta.json"
    meta = json.loads(path.read_text())
    del meta["seed"]
    meta["num_pairs"] = "many"
    path.write_text(json.dumps(meta))
    return path


def truncate_description(cache):
    path = cache / "meta.json"
    path.write_text(path.read_text()[:40])
    return path


def wrong_offsets(cache):
    path = cache / "valid.tgt.offsets"
    data = bytearray(path.read_bytes())
    data[8:16] = (10**6).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("damage", [garble_ids, garble_description, truncate_description, wrong_offsets])
def test_train_resume_rebuilds_a_damaged_pair_cache_naming_it(damage, interrupted, tmp_path, caplog):
    out = tmp_path / "model"
    shutil.copytree(interrupted, out)
    damaged = damage(out / "cache")
    result = run_cli("train", EXAMPLE_TABLE, "-o", out, "--max-steps", 10, "--resume")
    assert result.exit_code == 0, result.stderr
    assert f"{damaged}: the pair cache is damaged" in result.stderr
    for name in sorted(p.name for p in (interrupted / "cache").iterdir()):
        assert (out / "cache" / name).read_bytes() == (interrupted / "cache" / name).read_bytes(), name


def test_a_changed_table_is_still_a_change_not_damage(interrupted, tmp_path):
    out = tmp_path / "model"
    shutil.copytree(interrupted, out)
    result = run_cli("train", A_MAN_TABLE, "-o", out, "--max-steps", 10, "--resume")
    assert "cannot resume: table changed since the interrupted run" in error_line(result)


def test_a_cache_without_checksums_is_checked_by_its_offsets(interrupted, tmp_path, caplog):
    from phrase_scorer.data.cache import reuse_cache

    cache = tmp_path / "cache"
    shutil.copytree(interrupted / "cache", cache)
    (cache / "checksums.json").unlink()
    expected = json.loads((cache / "meta.json").read_text())
    assert reuse_cache(cache, expected, True, EXAMPLE_TABLE, "hint") is not None  # sound: reused
    wrong_offsets(cache)
    with caplog.at_level(logging.WARNING):
        assert reuse_cache(cache, expected, True, EXAMPLE_TABLE, "hint") is None  # rebuilt by the caller
    assert "valid.tgt.offsets: the pair cache is damaged (the offsets do not add up to the ids)" in caplog.text
