"""Right-to-left models (`train --right-to-left`): trained on reversed target sentences, and every
path that reads a target phrase (score, rescore, annotate, translate, alignments) reverses it for
them by itself.

The checks compare the model with a copy of itself whose target vocabulary says left to right:
scoring (x, y) with the right-to-left model must equal scoring (x, reversed y) with the copy, so
each path reverses exactly once.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import DATA, EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR
from phrase_scorer.cli import cli
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.vocab import Vocabulary

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def right_to_left(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rtl") / "model"
    run("-q", "train", "--corpus", TRAIN_EN, TRAIN_FR, "--arch", "rnnsearch", "--preset", "tiny", "--max-length", 12,
        "--max-steps", 20, "--valid-every", 20, "--valid-pairs", 50, "--right-to-left", "-o", out)
    return out


@pytest.fixture(scope="module")
def read_left_to_right(right_to_left, tmp_path_factory) -> Path:
    """The same weights, with a target vocabulary that reads left to right."""
    copy = tmp_path_factory.mktemp("ltr") / "model"
    shutil.copytree(right_to_left, copy)
    vocab = json.loads((copy / "vocab.target.json").read_text(encoding="utf-8"))
    assert vocab.pop("order") == "right-to-left"
    (copy / "vocab.target.json").write_text(json.dumps(vocab), encoding="utf-8")
    config = json.loads((copy / "config.json").read_text(encoding="utf-8"))  # the hash of the vocabulary it now has
    config["vocab_sha256"]["target"] = Vocabulary.load(copy / "vocab.target.json").sha256()
    (copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    weights = torch.load(copy / "model.pt", weights_only=True)  # weights recorded as read right to left
    del weights["trained_as"]  # are refused in this folder; as weights written before the record, they load
    torch.save(weights, copy / "model.pt")
    return copy


def reversed_words(line: str) -> str:
    return " ".join(line.split()[::-1])


def test_the_model_records_it(right_to_left):
    config = json.loads((right_to_left / "config.json").read_text())
    assert config["training"]["right_to_left"] is True
    from phrase_scorer.data.cache import PairSet
    from phrase_scorer.model_dir import load_model

    loaded = load_model(right_to_left)
    assert loaded.target_vocab.right_to_left and not loaded.source_vocab.right_to_left
    # the training pairs were cached last word first: decoding a cached target gives reading order
    pairs = PairSet(right_to_left / "cache", "train")
    with gzip.open(TRAIN_FR, "rt", encoding="utf-8") as f:
        sentences = {line.strip() for line in f}
    ids = pairs.pair(0)[1].tolist()
    assert " ".join(loaded.target_vocab.decode(ids)) in {" ".join(loaded.target_vocab.decode(
        loaded.target_vocab.encode(s.split()))) for s in sentences}
    from phrase_scorer.vocab import Vocabulary

    left_to_right = Vocabulary(loaded.target_vocab.tokens[3:])
    assert ids == left_to_right.encode(loaded.target_vocab.decode(ids))[::-1] and ids != ids[::-1]


def test_score_and_annotate_reverse_the_target(tmp_path, right_to_left, read_left_to_right):
    with gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(80)]
    table, flipped = tmp_path / "pt.txt", tmp_path / "flipped.txt"
    table.write_text("".join(lines), encoding="utf-8")
    flipped.write_text("".join(" ||| ".join([p[0], f" {reversed_words(p[1])} ", *p[2:]])
                               for p in (line.split(" ||| ") for line in lines)), encoding="utf-8")
    for verb in ("score", "annotate"):
        ours, theirs = tmp_path / f"{verb}.rtl", tmp_path / f"{verb}.ltr"
        args = ["-m", right_to_left, table, "-o", ours] if verb == "score" else [table, "-m", right_to_left, "-o", ours]
        run(verb, *args)
        args = (["-m", read_left_to_right, flipped, "-o", theirs] if verb == "score"
                else [flipped, "-m", read_left_to_right, "-o", theirs])
        run(verb, *args)
        if verb == "score":
            a, b = np.loadtxt(ours), np.loadtxt(theirs)
            assert len(a) == 80 and np.array_equal(a, b)
        else:
            model_columns = [line.split(" ||| ")[2].split()[-2:] for line in ours.read_text().splitlines()]
            assert model_columns == [line.split(" ||| ")[2].split()[-2:] for line in theirs.read_text().splitlines()]


def test_rescore_reverses_the_hypothesis(tmp_path, right_to_left, read_left_to_right):
    flipped = tmp_path / "flipped.nbest"
    flipped.write_text("".join(" ||| ".join([p[0], f" {reversed_words(p[1])} ", *p[2:]])
                               for p in (line.split(" ||| ") for line in gzip.open(NBEST, "rt", encoding="utf-8"))),
                       encoding="utf-8")
    run("rescore", NBEST, "--source", SOURCE, "-m", right_to_left, "-o", tmp_path / "rtl.txt")
    run("rescore", flipped, "--source", SOURCE, "-m", read_left_to_right, "-o", tmp_path / "ltr.txt")
    ours = [dict(e.features)["RNN0"] for e in read_nbest(tmp_path / "rtl.txt")]
    theirs = [dict(e.features)["RNN0"] for e in read_nbest(tmp_path / "ltr.txt")]
    assert len(ours) == 221 and ours == theirs


def test_translate_writes_reading_order(tmp_path, right_to_left, read_left_to_right):
    source = tmp_path / "src.en"
    source.write_text("".join(VAL_EN.read_text(encoding="utf-8").splitlines(keepends=True)[:12]), encoding="utf-8")
    run("translate", "-m", right_to_left, source, "-o", tmp_path / "rtl.fr", "--beam", 3)
    run("translate", "-m", read_left_to_right, source, "-o", tmp_path / "ltr.fr", "--beam", 3)
    ours = (tmp_path / "rtl.fr").read_text(encoding="utf-8").splitlines()
    theirs = (tmp_path / "ltr.fr").read_text(encoding="utf-8").splitlines()
    assert len(ours) == 12 and ours == [reversed_words(line) for line in theirs]


def test_alignment_rows_are_in_reading_order(right_to_left, read_left_to_right):
    from phrase_scorer.analysis.alignments import alignment_weights
    from phrase_scorer.model_dir import load_model

    source = VAL_EN.read_text(encoding="utf-8").splitlines()[0].split()
    target = VAL_FR.read_text(encoding="utf-8").splitlines()[0].split()
    ours = alignment_weights(load_model(right_to_left), [(source, target)])[0]
    theirs = alignment_weights(load_model(read_left_to_right), [(source, target[::-1])])[0]
    assert ours.shape == (len(target) + 1, len(source))
    np.testing.assert_array_equal(ours[:-1], theirs[:-1][::-1])
    np.testing.assert_array_equal(ours[-1], theirs[-1])


def test_resume_refuses_another_direction(tmp_path):
    out = tmp_path / "m"
    run("-q", "train", "--corpus", TRAIN_EN, TRAIN_FR, "--arch", "encdec", "--preset", "tiny", "--max-length", 12,
        "--max-steps", 4, "--valid-every", 2, "--valid-pairs", 20, "-o", out)
    result = CliRunner().invoke(cli, ["-q", "train", "--corpus", str(TRAIN_EN), str(TRAIN_FR), "--max-steps", "6",
                                      "--right-to-left", "-o", str(out), "--resume"])
    assert result.exit_code == 1 and "--right-to-left" in result.stderr, result.stderr
