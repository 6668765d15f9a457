"""The parts of tune / evaluate / experiment that run without Moses: finding it, parsing its
progress, scoring, and deriving the experiment's tables."""

from __future__ import annotations

import gzip
import shutil

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE, DATA
from phrase_scorer.cli import cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.moses.evaluate import references_kind, score
from phrase_scorer.experiments.report import mean_sd
from phrase_scorer.experiments.experiment import drop_last_columns
from phrase_scorer.moses.installation import MosesInstallation, parse_mert_progress
from phrase_scorer.moses.tune import with_absolute_paths
from phrase_scorer.runtime.programs import fresh_directory


def test_finding_moses(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    with pytest.raises(PhraseScorerError, match="no Moses installation given.*MOSES_HOME"):
        MosesInstallation.find()
    (tmp_path / "bin").mkdir()
    moses = MosesInstallation.find(tmp_path)
    with pytest.raises(PhraseScorerError, match="mert program extractor is missing"):
        moses.check_mert()
    mertdir = tmp_path / "mert"
    mertdir.mkdir()
    for name in ("extractor", "mert", "kbmira", "pro"):
        (mertdir / name).write_text("#!/bin/sh\n")
        (mertdir / name).chmod(0o755)
    with pytest.raises(PhraseScorerError, match="mert program evaluator is missing.*mertdir"):
        moses.check_mert(mertdir)
    (mertdir / "evaluator").write_text("#!/bin/sh\n")
    (mertdir / "evaluator").chmod(0o755)
    assert moses.check_mert(mertdir) == mertdir.resolve()
    with pytest.raises(PhraseScorerError, match="training/mert-moses.pl is missing"):
        moses.script("training/mert-moses.pl")


def test_tune_without_moses_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    dev = tmp_path / "dev.txt"
    dev.write_text("a\n")
    result = CliRunner().invoke(cli, ["tune", str(DATA / "moses.ini"), "--dev", str(dev), str(dev),
                                      "-o", str(tmp_path / "t.ini")])
    assert result.exit_code == 1 and "no Moses installation given" in result.stderr


def test_mert_progress_lines():
    assert parse_mert_progress("run 3 start at Sun Nov 22 03:40:00 UTC 2026") == {"iteration": 3}
    assert parse_mert_progress("(2) BEST at 2: 0.1 0.2 -0.3 => 0.56694 at Sun Nov 22") == {
        "iteration": 2, "bleu": 0.56694}
    assert parse_mert_progress("Scoring the nbestlist.") is None


def test_references_kind_and_scoring():
    tokenized = ["un homme en chemise bleue .", "l&apos; homme court ."]
    raw = ["Un homme en chemise bleue.", "L'homme court."]
    assert references_kind(tokenized) == "tokenized" and references_kind(raw) == "raw"
    hypotheses = ["un homme en chemise bleue .", "l&apos; homme marche ."]
    as_tokenized = score(hypotheses, tokenized)
    assert "tok:none" in as_tokenized.bleu_signature and 0 < as_tokenized.bleu < 100
    perfect = score(tokenized, tokenized)
    assert perfect.bleu == pytest.approx(100.0) and perfect.chrf == pytest.approx(100.0)
    # raw references: the hypotheses are de-escaped and detokenised first
    detok = score(["un homme en chemise bleue .", "l&apos; homme court ."], [r.lower() for r in raw], kind="raw")
    assert detok.bleu == pytest.approx(100.0) and "tok:13a" in detok.bleu_signature


def test_absolute_paths_copy(tmp_path):
    system = tmp_path / "system"
    system.mkdir()
    shutil.copy(DATA / "moses.ini", system / "moses.ini")
    shutil.copy(A_MAN_TABLE, system / "phrase-table.gz")  # the table is checked against num-features
    out = tmp_path / "abs.ini"
    with_absolute_paths(system / "moses.ini", out)
    text = out.read_text()
    assert f"path={system}/phrase-table.gz" in text and f"path={system}/lm.arpa.gz" in text
    changed = [a for a, b in zip((system / "moses.ini").read_text().splitlines(), text.splitlines()) if a != b]
    assert len(changed) == 3  # the table, the reordering table and the language model


def test_fresh_directory_never_removes_foreign_folders(tmp_path):
    mine = fresh_directory(tmp_path / "work")
    (mine / "old").write_text("x")
    again = fresh_directory(tmp_path / "work")
    assert not (again / "old").exists()
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "data").write_text("keep")
    with pytest.raises(PhraseScorerError, match="not made by phrase-scorer tune"):
        fresh_directory(tmp_path / "theirs")
    assert (tmp_path / "theirs" / "data").read_text() == "keep"


def test_dropping_the_unknown_word_column_restores_five_columns(tmp_path, loaded_tiny):
    from phrase_scorer.scoring.annotate import annotate

    six = tmp_path / "six.gz"
    annotate(A_MAN_TABLE, six, loaded_tiny)
    five = tmp_path / "five.gz"
    assert drop_last_columns(six, five, 1) == 2020
    original = gzip.decompress(A_MAN_TABLE.read_bytes()).splitlines()
    for orig, prob_only, both in zip(original, read_phrase_table(five), read_phrase_table(six)):
        prob = both.fields[2].split()[4].encode()
        fields = orig.split(b"|||")
        kept = fields[2].rstrip()
        fields[2] = kept + b" " + prob + fields[2][len(kept):]
        assert prob_only.raw == b"|||".join(fields)
    # and dropping both gives back the original table byte for byte
    four = tmp_path / "four.gz"
    drop_last_columns(six, four, 2)
    assert gzip.decompress(four.read_bytes()) == gzip.decompress(A_MAN_TABLE.read_bytes())


def test_mean_and_spread():
    assert mean_sd([]) == "–"
    assert mean_sd([57.7]) == "57.70"
    assert mean_sd([57.0, 58.0, 59.0]) == "58.00 ± 1.00"
