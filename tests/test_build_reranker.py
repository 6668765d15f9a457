"""build-reranker: from a tuned Moses system to its best reranker in one command.

The default tests check the pieces that need no Moses: the candidate rows, the rule that keeps
one, the vocabulary choice from the shortlist coverage, a training step reused, continued or redone,
and the command line. The `moses` test runs the whole command on the shared English-French
system with tiny models, then again to see every step reused and the same reranker written.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import DATA, SHARED_SYSTEM, TRAIN_EN, TRAIN_FR
from phrase_scorer.config import BuildRerankerOptions, RescoreExperimentOptions
from phrase_scorer.experiments.build_reranker import (
    ENSEMBLE, FORWARD, REVERSE, Candidate, candidates, choose, outside_shortlist, trained_model, vocabulary_choice,
)
from phrase_scorer.experiments.rescoring import RETUNED_ROW, Row
from phrase_scorer.io.model_layout import BEST_WEIGHTS

VAL_EN = DATA / "multi30k.val100.en"
VAL_FR = DATA / "multi30k.val100.fr"


def test_the_candidate_rows_are_those_the_models_allow():
    rows = {c.row.label: (c.row.features, c.models) for c in candidates(["forward", "right-to-left", "reverse"])}
    assert rows == {
        RETUNED_ROW: ((), ()),
        "Forward": ((FORWARD,), ("forward",)),
        "Forward + Reverse": ((FORWARD, REVERSE), ("forward", "reverse")),
        "Ensemble": ((ENSEMBLE,), ("forward", "right-to-left")),
        "Ensemble + Reverse": ((ENSEMBLE, REVERSE), ("forward", "right-to-left", "reverse")),
    }
    assert [c.row.label for c in candidates(["forward"])] == [RETUNED_ROW, "Forward"]
    assert [c.row.label for c in candidates(["forward", "reverse"])] == [RETUNED_ROW, "Forward", "Forward + Reverse"]


def test_a_near_tie_keeps_the_row_with_fewer_models():
    one, two, three = (Candidate(Row(name, (name,)), models) for name, models in
                       (("one", ("a",)), ("two", ("a", "b")), ("three", ("a", "b", "c"))))
    assert choose([(one, 40.0), (two, 40.05), (three, 40.1)], 0.1) is one  # all within 0.1 of the best
    assert choose([(one, 40.0), (two, 40.15), (three, 40.2)], 0.1) is two
    assert choose([(one, 40.0), (two, 40.15), (three, 40.2)], 0.0) is three
    other_two = Candidate(Row("two again", ("b",)), ("a", "b"))
    assert choose([(two, 40.0), (other_two, 40.05)], 0.1) is other_two  # equal models: the higher figure


def test_the_shortlist_share_counts_held_out_tokens_outside_the_most_frequent_words(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("a a a b b c\na b\n", encoding="utf-8")  # a: 4, b: 3, c: 1
    held = tmp_path / "held.txt"
    held.write_text("a b c d\n", encoding="utf-8")
    assert outside_shortlist(train, held, 1) == 0.75  # b, c, d
    assert outside_shortlist(train, held, 2) == 0.5  # c, d
    assert outside_shortlist(train, held, 10) == 0.25  # d


def test_the_vocabulary_is_chosen_from_the_coverage_and_recorded(tmp_path):
    options = replace(BuildRerankerOptions(), preset="tiny")
    corpus = (str(TRAIN_EN), str(TRAIN_FR))
    tuning = (str(VAL_EN), str(VAL_FR))
    # 500 training sentences leave much of val out of even a tiny shortlist: pieces
    assert vocabulary_choice(corpus, tuning, tmp_path / "a", replace(options, bpe_above=0.05)) == "bpe"
    assert vocabulary_choice(corpus, tuning, tmp_path / "b", replace(options, bpe_above=0.99)) == "words"
    recorded = json.loads((tmp_path / "b" / "vocabulary" / "choice.json").read_text(encoding="utf-8"))
    assert recorded["vocabulary"] == "words" and all(0 < share < 1 for share in recorded["outside shortlist"])
    assert vocabulary_choice(corpus, tuning, tmp_path / "c", replace(options, vocabulary="unigram")) == "unigram"


def test_a_training_step_is_reused_and_redone_when_its_settings_change(tmp_path, caplog):
    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=3, valid_every=3, batch_size=8,
                      device="cpu")
    corpus = (str(TRAIN_EN), str(TRAIN_FR))
    tuning = (str(VAL_EN), str(VAL_FR))
    folder = trained_model("reverse", corpus, tuning, tmp_path, "words", options)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    weights = (folder / BEST_WEIGHTS).stat().st_mtime_ns
    assert config["corpus"]["source"]["path"].endswith("fr.gz")  # the reverse model reads the target side
    with caplog.at_level("INFO"):
        assert trained_model("reverse", corpus, tuning, tmp_path, "words", options) == folder
    assert "already trained" in caplog.text
    assert (folder / BEST_WEIGHTS).stat().st_mtime_ns == weights
    trained_model("reverse", corpus, tuning, tmp_path, "words", replace(options, max_steps=4, valid_every=4))
    assert json.loads((folder / "config.json").read_text(encoding="utf-8"))["training"]["max_steps"] == 4


@pytest.mark.parametrize("option, value, said", [
    ("--models", "forward,sideways", "no model kind 'sideways'"),
    ("--models", "reverse", "every row needs the forward model"),
    ("-m", "forward", "is not NAME=DIR"),
])
def test_a_bad_model_choice_is_refused_before_anything_runs(tmp_path, option, value, said):
    from click.testing import CliRunner

    from phrase_scorer.cli import cli

    ini = tmp_path / "moses.ini"
    ini.write_text("[weight]\n", encoding="utf-8")
    result = CliRunner().invoke(cli, ["build-reranker", str(ini), "--corpus", str(TRAIN_EN), str(TRAIN_FR),
                                      "--tuning-set", str(VAL_EN), str(VAL_FR), "-o", str(tmp_path / "work"),
                                      option, value])
    assert result.exit_code != 0
    assert said in result.output
    assert not (tmp_path / "work").exists()


@pytest.mark.moses
def test_the_command_builds_a_reranker_and_reuses_every_step(moses, tmp_path, caplog):
    """The shared English-French system, 500 training pairs, tiny models for a few updates, the
    first 100 val sentences as the tuning set: a reranker that translate --moses takes, a report
    naming the kept row, and a second run that trains, decodes and tunes nothing."""
    from phrase_scorer.experiments.build_reranker import build_reranker
    from phrase_scorer.rescoring.reranker import Reranker

    tuning = (str(VAL_EN), str(VAL_FR))
    options = BuildRerankerOptions(preset="tiny", max_steps=20, valid_every=20, batch_size=16, device="cpu",
                                   vocabulary="words", experiment=RescoreExperimentOptions(nbest_size=10, runs=2,
                                                                                           restarts=2, threads=2))
    work = tmp_path / "work"
    result = build_reranker(SHARED_SYSTEM / "moses.tuned.ini", (str(TRAIN_EN), str(TRAIN_FR)), tuning, work,
                            options=options, moses=moses)
    assert set(result.figures) == {c.row.label for c in candidates(list(options.models))}
    assert all(len(seeds) == 2 for seeds in result.figures.values())
    reranker = Reranker.read(result.reranker)
    assert result.chosen in (work / "report.md").read_text(encoding="utf-8")
    kept = next(c for c in candidates(list(options.models)) if c.row.label == result.chosen)
    assert set(reranker.ignore_features) == {f for f in (FORWARD, ENSEMBLE, REVERSE) if f not in kept.row.features}
    assert "-n-best-factor 100" in (reranker.decoder_flags or "")
    first = Path(result.reranker).read_bytes()
    caplog.clear()
    with caplog.at_level("INFO"):
        again = build_reranker(SHARED_SYSTEM / "moses.tuned.ini", (str(TRAIN_EN), str(TRAIN_FR)), tuning, work,
                               options=options, moses=moses)
    assert again.figures == result.figures and again.chosen == result.chosen
    assert Path(again.reranker).read_bytes() == first
    assert caplog.text.count("already trained") == 3
    assert "n-best list already decoded" in caplog.text and "already rescored" in caplog.text
    with gzip.open(work / "rescored" / "multi30k.nbest.gz", "rt", encoding="utf-8") as f:
        assert all(f"{name}=" in next(f) for name in (FORWARD, ENSEMBLE, REVERSE))
