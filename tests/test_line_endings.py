"""Line endings: a text input written with CRLF line ends (on Windows) gives exactly what its LF
twin gives, for every verb that reads one; the carriage return is never part of a word."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import DATA, TRAIN_EN, TRAIN_FR
from phrase_scorer.cli import cli

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def crlf_twin(path: Path, out: Path) -> Path:
    """``out``: the lines of ``path`` (plain or gzip) with CRLF line ends, written as ``path`` is."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    assert b"\r" not in data
    data = data.replace(b"\n", b"\r\n")
    out.write_bytes(gzip.compress(data) if str(out).endswith(".gz") else data)
    return out


def lf_copy(path: Path, out: Path) -> Path:
    out.write_bytes(path.read_bytes())
    return out


def read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def rescore_scores(tmp_path, tiny_model, tiny_reverse_model, source, name):
    out = tmp_path / f"{name}.gz"
    result = run("rescore", NBEST, "--source", source, "-m", tiny_model, "-r", tiny_reverse_model, "-o", out)
    assert result.exit_code == 0, result.output
    return read(out)


def test_rescore_source_with_crlf_line_ends_gives_the_same_scores(tmp_path, tiny_model, tiny_reverse_model):
    lf = rescore_scores(tmp_path, tiny_model, tiny_reverse_model, SOURCE, "lf")
    crlf = rescore_scores(tmp_path, tiny_model, tiny_reverse_model, crlf_twin(SOURCE, tmp_path / "src.crlf"), "crlf")
    assert crlf == lf


def test_rescore_nbest_and_source_with_crlf_line_ends_give_the_same_scores(tmp_path, tiny_model):
    nbest = crlf_twin(NBEST, tmp_path / "nbest.crlf.gz")
    source = crlf_twin(SOURCE, tmp_path / "src.crlf")
    out = tmp_path / "both.txt"
    assert run("rescore", nbest, "--source", source, "-m", tiny_model, "-o", out).exit_code == 0
    lf = tmp_path / "lf.txt"
    assert run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", lf).exit_code == 0
    # the list's own CRLF line ends are kept as they were; every score is the LF list's
    assert read(out).replace(b"\r\n", b"\n") == read(lf)


def output_of(verb, tmp_path, tiny_model, path, name):
    """What ``verb`` writes (its output file, or its standard output) for the text input ``path``."""
    out = tmp_path / f"{name}.out"
    if verb == "translate":
        result = run("translate", "-m", tiny_model, path, "-o", out, "--beam", "2")
    elif verb == "sample":
        result = run("sample", "-m", tiny_model, "-i", path, "--no-tokenize", "--beam", "3", "--json")
        assert result.exit_code == 0, result.output
        return result.stdout
    elif verb == "score":
        result = run("score", "-m", tiny_model, path, "-o", out)
    elif verb == "annotate":
        result = run("annotate", path, "-m", tiny_model, "-o", out)
    else:
        raise AssertionError(verb)
    assert result.exit_code == 0, result.output
    return read(out)


TEXT_INPUTS = {
    "translate": b"a man in a blue shirt\nthe dog runs\n",
    "sample": b"a man\nthe dog\n",
    "score": b"a man ||| un homme\nthe dog ||| le chien\n",
    "annotate": b"a man ||| un homme ||| 0.5 1\nthe dog ||| le chien ||| 0.25 1\n",
}


@pytest.mark.parametrize("verb", sorted(TEXT_INPUTS))
def test_every_verb_reads_a_crlf_input_as_its_lf_twin(tmp_path, tiny_model, verb):
    lf = tmp_path / "lf.txt"
    lf.write_bytes(TEXT_INPUTS[verb])
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(TEXT_INPUTS[verb].replace(b"\n", b"\r\n"))
    expected = output_of(verb, tmp_path, tiny_model, lf, "lf")
    got = output_of(verb, tmp_path, tiny_model, crlf, "crlf")
    if verb == "annotate":  # a table keeps its line ends: the CR stays where it was, after the new scores
        got = got.replace(b"\r\n", b"\n")
    elif verb == "sample":
        got, expected = json.loads(got), json.loads(expected)
    assert got == expected


def test_training_on_a_crlf_corpus_makes_the_model_of_its_lf_twin(tmp_path):
    source, target = tmp_path / "en.crlf.gz", tmp_path / "fr.crlf.gz"
    crlf_twin(TRAIN_EN, source)
    crlf_twin(TRAIN_FR, target)
    options = ["--preset", "tiny", "--max-length", "12", "--max-steps", "4", "--valid-every", "4",
               "--valid-pairs", "20", "--seed", "2"]
    assert run("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", tmp_path / "lf", *options).exit_code == 0
    assert run("train", "--corpus", source, target, "-o", tmp_path / "crlf", *options).exit_code == 0
    for name in ("vocab.source.json", "vocab.target.json", "model.pt"):
        assert (tmp_path / "crlf" / name).read_bytes() == (tmp_path / "lf" / name).read_bytes(), name


@pytest.mark.parametrize("line_end", ["\r\n", "\n"])
def test_references_are_split_at_line_ends_only(tmp_path, line_end):
    """References, sources and hypotheses read for BLEU, tuning and reranking (read_lines): a
    line ends at \\n (after an optional \\r) as Moses reads it, and no other character a Python
    splitlines() would cut at (form feed, U+0085, U+2028) splits a sentence in two."""
    from phrase_scorer.moses.installation import read_lines

    sentences = ["a man\x0cin", "une\u2028phrase", "next\x85line", "plain"]
    path = tmp_path / "ref.txt"
    path.write_bytes("".join(s + line_end for s in sentences).encode("utf-8"))
    assert read_lines(path) == sentences
    packed = tmp_path / "ref.txt.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert read_lines(packed) == sentences
