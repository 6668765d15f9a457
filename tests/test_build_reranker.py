"""build-reranker: from a tuned Moses system to its best reranker in one command.

The default tests check the pieces that need no Moses: the candidate rows, the rule that keeps
one, the vocabulary choice from the shortlist coverage, a training step reused, continued or redone,
and the command line. The `moses` test runs the whole command on the shared English-French
system with tiny models, then again to see every step reused and the same reranker written.
"""

from __future__ import annotations

import gzip
import os
import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import DATA, SHARED_SYSTEM, TRAIN_EN, TRAIN_FR
from phrase_scorer.config import BuildRerankerOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.experiments.build_reranker import (
    ENSEMBLE, FORWARD, REVERSE, Candidate, candidates, choose, kind_and_seed, model_names,
    outside_shortlist, trained_model, vocabulary_choice,
)
from phrase_scorer.experiments.system_steps import RETUNED_ROW, Row
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


def test_more_members_train_each_left_to_right_kind_again_and_join_the_ensemble():
    kinds = ["forward", "right-to-left", "reverse"]
    assert model_names(kinds, 1) == kinds
    names = model_names(kinds, 3)
    assert names == ["forward", "forward-2", "forward-3", "right-to-left", "right-to-left-2", "right-to-left-3",
                     "reverse"]
    assert [kind_and_seed(n) for n in names] == [("forward", 1), ("forward", 2), ("forward", 3),
                                                 ("right-to-left", 1), ("right-to-left", 2), ("right-to-left", 3),
                                                 ("reverse", 1)]
    rows = {c.row.label: c.models for c in candidates(model_names(kinds, 2))}
    assert rows["Forward"] == ("forward",)
    assert rows["Ensemble"] == ("forward", "forward-2", "right-to-left", "right-to-left-2")
    assert rows["Ensemble + Reverse"] == rows["Ensemble"] + ("reverse",)
    # forward alone, two members: the two seeds are the ensemble
    assert {c.row.label: c.models for c in candidates(model_names(["forward"], 2))}["Ensemble"] == (
        "forward", "forward-2")


def test_further_architectures_train_their_own_members_and_join_the_ensemble():
    from phrase_scorer.experiments.build_reranker import model_arch, model_identity

    kinds = ["forward", "right-to-left", "reverse"]
    names = model_names(kinds, 2, ("rnnsearch", "transformer"))
    assert names == ["forward", "forward-2", "forward-transformer", "forward-transformer-2", "right-to-left",
                     "right-to-left-2", "right-to-left-transformer", "right-to-left-transformer-2", "reverse"]
    assert [model_identity(n) for n in names[:4]] == [("forward", "", 1), ("forward", "", 2),
                                                      ("forward", "transformer", 1), ("forward", "transformer", 2)]
    options = replace(BuildRerankerOptions(), archs=("rnnsearch", "transformer"), reverse_arch="transformer")
    assert [model_arch(n, options) for n in ("forward-2", "right-to-left-transformer", "reverse")] == [
        "rnnsearch", "transformer", "transformer"]
    assert model_identity("forward-conformer") == ("forward-conformer", "", 1)  # no such architecture: no member
    rows = {c.row.label: c.models for c in candidates(names)}
    assert rows["Forward"] == ("forward",) and rows["Ensemble"] == tuple(n for n in names if n != "reverse")


def test_a_transformer_member_trains_as_a_transformer(tmp_path):
    options = replace(BuildRerankerOptions(), archs=("rnnsearch", "transformer"), preset="tiny", max_steps=3,
                      valid_every=3, batch_size=8, device="cpu")
    corpus, tuning = (str(TRAIN_EN), str(TRAIN_FR)), (str(VAL_EN), str(VAL_FR))
    folder = trained_model("right-to-left-transformer", corpus, tuning, tmp_path, "words", options)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["model"]["arch"] == "transformer" and config["training"]["right_to_left"]
    assert config["training"]["recipe"] == "transformer"


def test_a_further_member_trains_with_its_own_seed(tmp_path):
    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=3, valid_every=3, batch_size=8,
                      device="cpu", members=2)
    corpus = (str(TRAIN_EN), str(TRAIN_FR))
    tuning = (str(VAL_EN), str(VAL_FR))
    first = trained_model("right-to-left", corpus, tuning, tmp_path, "words", options)
    second = trained_model("right-to-left-2", corpus, tuning, tmp_path, "words", options)
    configs = [json.loads((f / "config.json").read_text(encoding="utf-8"))["training"] for f in (first, second)]
    assert [c["seed"] for c in configs] == [1, 2] and all(c["right_to_left"] for c in configs)
    assert second == tmp_path / "models" / "right-to-left-2"
    assert (first / BEST_WEIGHTS).read_bytes() != (second / BEST_WEIGHTS).read_bytes()


def test_averaged_checkpoints_reach_each_training(tmp_path):
    """--average-checkpoints K: the training keeps its last K validations' weights and weighs
    their mean against its best single weights (config.json records which became model.pt)."""
    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=4, valid_every=2, batch_size=8,
                      device="cpu", average_checkpoints=2)
    folder = trained_model("forward", (str(TRAIN_EN), str(TRAIN_FR)), (str(VAL_EN), str(VAL_FR)), tmp_path, "words",
                           options)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["training"]["average_checkpoints"] == 2
    assert config["averaged"]["steps"] == [2, 4] and isinstance(config["averaged"]["kept_as_model"], bool)


def test_a_near_tie_keeps_the_row_with_fewer_models():
    one, two, three = (Candidate(Row(name, (name,)), models) for name, models in
                       (("one", ("a",)), ("two", ("a", "b")), ("three", ("a", "b", "c"))))
    assert choose([(one, 40.0), (two, 40.05), (three, 40.1)], 0.1) is one  # all within 0.1 of the best
    assert choose([(one, 40.0), (two, 40.15), (three, 40.2)], 0.1) is two
    assert choose([(one, 40.0), (two, 40.15), (three, 40.2)], 0.0) is three
    other_two = Candidate(Row("two again", ("b",)), ("a", "b"))
    assert choose([(two, 40.0), (other_two, 40.05)], 0.1) is other_two  # equal models: the higher figure


def test_the_shortlist_share_counts_held_out_tokens_outside_the_most_frequent_words(tmp_path):
    from collections import Counter

    from phrase_scorer.experiments.build_reranker import words_of

    train = tmp_path / "train.txt"
    train.write_text("a a a b b c\na b\n", encoding="utf-8")  # a: 4, b: 3, c: 1
    held = tmp_path / "held.txt"
    held.write_text("a b c d\n", encoding="utf-8")
    counts, held_counts = Counter(words_of(train)), Counter(words_of(held))
    assert outside_shortlist(counts, held_counts, 1) == 0.75  # b, c, d
    assert outside_shortlist(counts, held_counts, 2) == 0.5  # c, d
    assert outside_shortlist(counts, held_counts, 10) == 0.25  # d


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
    # more updates: the training goes on from its checkpoint (the folder is kept)
    vocabulary = (folder / "vocab.source.json").stat().st_mtime_ns
    trained_model("reverse", corpus, tuning, tmp_path, "words", replace(options, max_steps=6, valid_every=3))
    assert (folder / "vocab.source.json").stat().st_mtime_ns == vocabulary
    log = (folder / "train.log.jsonl").read_text(encoding="utf-8")
    assert '"step": 3' in log and '"step": 6' in log
    # another model setting: trained anew
    trained_model("reverse", corpus, tuning, tmp_path, "words", replace(options, batch_size=4))
    assert json.loads((folder / "config.json").read_text(encoding="utf-8"))["training"]["batch_size"] == 4
    assert '"step": 6' not in (folder / "train.log.jsonl").read_text(encoding="utf-8")


@pytest.mark.parametrize("option, value, said", [
    ("--models", "forward,sideways", "no model kind 'sideways'"),
    ("--models", "reverse", "every row needs the forward model"),
    ("-m", "forward", "is not NAME=DIR"),
    ("-m", "forward-2=.", "no model 'forward-2' to give"),  # a second member needs --members 2
    ("-m", "reverse-2=.", "no model 'reverse-2' to give"),
    ("-m", "forward-transformer=.", "no model 'forward-transformer' to give"),  # needs --archs ...,transformer
    ("--archs", "rnnsearch,conformer", "'conformer' is not an architecture"),
    ("--archs", "transformer,transformer", "names an architecture twice"),
    ("--reverse-arch", "conformer", "'conformer' is not one of"),
    ("--preset", "medium", "--preset medium is not a preset of transformer, which --archs names"),
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


TINY_BUILD = ["--preset", "tiny", "--max-steps", "40", "--valid-every", "20", "--vocabulary", "words",
              "--device", "cpu", "--nbest-size", "10", "--runs", "2", "--decoder-threads", "2", "--threads", "1"]


def build_command(work: Path) -> list:
    return ["build-reranker", str(SHARED_SYSTEM / "moses.tuned.ini"), "--corpus", str(TRAIN_EN), str(TRAIN_FR),
            "--tuning-set", str(VAL_EN), str(VAL_FR), "-o", str(work), *TINY_BUILD]


def run_cli(args: list) -> str:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "phrase_scorer", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.fixture(scope="module")
def built(moses, tmp_path_factory):
    """The shared English-French system, 500 training pairs, the defaults' models (two tiny
    Transformers) for 40 updates, the first 100 val sentences as the tuning set: one
    uninterrupted build."""
    work = tmp_path_factory.mktemp("build") / "work"
    run_cli(build_command(work))
    return work


@pytest.mark.moses
def test_the_command_builds_a_reranker_and_reuses_every_step(built, moses):
    from phrase_scorer.records import Signature
    from phrase_scorer.rescoring.reranker import Reranker

    from phrase_scorer.model_dir import load_model
    from phrase_scorer.models.transformer import Transformer

    defaults = BuildRerankerOptions().model_kinds
    assert defaults == ("forward", "right-to-left")
    assert all(isinstance(load_model(built / "models" / name).model, Transformer) for name in defaults)
    assert not (built / "models" / "reverse").exists()
    results = json.loads((built / "results.json").read_text(encoding="utf-8"))
    rows = candidates(list(defaults))
    assert set(results["tuning BLEU per seed"]) == {c.row.label for c in rows}
    assert all(len(seeds) == 2 for seeds in results["tuning BLEU per seed"].values())
    kept = next(c for c in rows if c.row.label == results["chosen"])
    report = (built / "report.md").read_text(encoding="utf-8")
    assert f"{kept.row.label} **(kept)**" in report
    # the report quotes the reranker's signature line, read from the reranker written
    signed = Signature.from_json(json.loads((built / "reranker.json").read_text(encoding="utf-8")), "reranker.json")
    assert f"- the reranker's signature: `{signed.line()}`" in report.splitlines()
    assert signed.line().startswith("tool:build-reranker|models:")
    reranker = Reranker.read(built / "reranker.json")
    assert set(reranker.ignore_features) == {f for f in (FORWARD, ENSEMBLE) if f not in kept.row.features}
    assert "-n-best-factor 100" in (reranker.decoder_flags or "") and reranker.nbest_size == 10
    with gzip.open(built / "rescored" / "multi30k.nbest.gz", "rt", encoding="utf-8") as f:
        first_line = next(f)
    assert f"{FORWARD}=" in first_line and f"{ENSEMBLE}=" in first_line and f"{REVERSE}=" not in first_line
    first = (built / "reranker.json").read_bytes()
    weights = {name: (built / "models" / name / BEST_WEIGHTS).stat().st_mtime_ns for name in defaults}

    log = run_cli(build_command(built))  # again: every step reused
    assert (built / "reranker.json").read_bytes() == first
    assert log.count("already trained") == 2 and "already decoded" in log and "already rescored" in log
    assert weights == {name: (built / "models" / name / BEST_WEIGHTS).stat().st_mtime_ns for name in defaults}

    # The whole system takes the reranker: one line per input line
    source = Path(str(built) + ".new.en")
    source.write_text("".join(VAL_EN.read_text(encoding="utf-8").splitlines(True)[:5]), encoding="utf-8")
    run_cli(["translate-system", "--moses", str(SHARED_SYSTEM / "moses.tuned.ini"), "--reranker",
             str(built / "reranker.json"), str(source), "-o", str(source) + ".fr"])
    assert len(Path(str(source) + ".fr").read_text(encoding="utf-8").splitlines()) == 5


@pytest.mark.moses
def test_an_interrupted_build_resumes_to_the_same_reranker(built, tmp_path):
    """Killed in its first training after a checkpoint, the same command continues from that
    checkpoint and ends with the uninterrupted build's row and weights."""
    from conftest import kill, start_halted

    work = tmp_path / "work"
    proc = start_halted("step:30", build_command(work), tmp_path / "halted")
    kill(proc)
    assert (work / "models" / "forward" / "checkpoint.pt").exists()
    log = run_cli(build_command(work))
    assert "resuming" in log.lower()
    ours, theirs = (json.loads((w / "results.json").read_text(encoding="utf-8")) for w in (work, built))
    assert ours["chosen"] == theirs["chosen"]
    assert ours["tuning BLEU per seed"] == theirs["tuning BLEU per seed"]
    ours, theirs = (json.loads((w / "reranker.json").read_text(encoding="utf-8")) for w in (work, built))
    assert ours["weights"] == theirs["weights"]


@pytest.mark.moses
def test_rnnsearch_members_beside_transformer_ones_build_a_reranker(built, moses, tmp_path):
    """--archs transformer,rnnsearch --reverse-arch rnnsearch with a reverse model: the
    Transformer models of the first build given, an RNNsearch forward, right-to-left and reverse
    model trained beside them, every row tuned, the reranker applied to new text."""
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.models.rnnsearch import RNNsearch

    work = tmp_path / "work"
    given = [arg for name in ("forward", "right-to-left") for arg in ("-m", f"{name}={built / 'models' / name}")]
    log = run_cli([*build_command(work), "--archs", "transformer,rnnsearch", "--reverse-arch", "rnnsearch",
                   "--models", "forward,right-to-left,reverse", *given, "--threads", "2"])
    assert "training the forward-rnnsearch, right-to-left-rnnsearch, reverse models side by side" in log
    for name in ("forward-rnnsearch", "right-to-left-rnnsearch", "reverse"):
        assert isinstance(load_model(work / "models" / name).model, RNNsearch)
    results = json.loads((work / "results.json").read_text(encoding="utf-8"))
    assert set(results["tuning BLEU per seed"]) == {c.row.label for c in candidates(
        ["forward", "right-to-left", "forward-rnnsearch", "right-to-left-rnnsearch", "reverse"])}
    with gzip.open(work / "rescored" / "multi30k.nbest.gz", "rt", encoding="utf-8") as f:
        first = next(f)
    assert all(f"{name}=" in first for name in (FORWARD, ENSEMBLE, REVERSE))
    assert "transformer, rnnsearch (reverse: rnnsearch)" in (work / "report.md").read_text(encoding="utf-8")
    source = tmp_path / "new.en"
    source.write_text("".join(VAL_EN.read_text(encoding="utf-8").splitlines(True)[:3]), encoding="utf-8")
    run_cli(["translate-system", "--moses", str(SHARED_SYSTEM / "moses.tuned.ini"), "--reranker",
             str(work / "reranker.json"), str(source), "-o", str(tmp_path / "new.fr")])
    assert len((tmp_path / "new.fr").read_text(encoding="utf-8").splitlines()) == 3


@pytest.mark.moses
def test_two_members_of_the_forward_model_become_the_ensemble_row(built, moses, tmp_path):
    """--members 2 with --models forward: two forward models (seeds 1 and 2) side by side, the
    Ensemble feature their mean; the seed-1 model of the first build is given, not trained again."""
    from phrase_scorer.rescoring.reranker import Reranker

    work = tmp_path / "work"
    log = run_cli([*build_command(work), "--models", "forward", "--members", "2",
                   "-m", f"forward={built / 'models' / 'forward'}", "--threads", "2"])
    assert "training the forward-2 model" in log
    assert not (work / "models" / "forward").exists() and (work / "models" / "forward-2" / BEST_WEIGHTS).is_file()
    results = json.loads((work / "results.json").read_text(encoding="utf-8"))
    assert set(results["tuning BLEU per seed"]) == {"Moses, re-tuned on the lists", "Forward", "Ensemble"}
    assert results["models"]["forward-2"] == os.fspath(work / "models" / "forward-2")
    with gzip.open(work / "rescored" / "multi30k.nbest.gz", "rt", encoding="utf-8") as f:
        first = next(f)
    assert f"{FORWARD}=" in first and f"{ENSEMBLE}=" in first and f"{REVERSE}=" not in first
    reranker = Reranker.read(work / "reranker.json")
    assert reranker.nbest_size == 10


def test_a_training_killed_before_its_first_checkpoint_starts_again(tmp_path):
    """The step's folder holds what the killed training left (no checkpoint): the next run trains
    afresh into it instead of refusing the folder."""
    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=3, valid_every=3, batch_size=8,
                      device="cpu")
    corpus = (str(TRAIN_EN), str(TRAIN_FR))
    tuning = (str(VAL_EN), str(VAL_FR))
    folder = trained_model("forward", corpus, tuning, tmp_path, "words", options)
    (folder / BEST_WEIGHTS).unlink()
    (folder / "checkpoint.pt").unlink()
    record = tmp_path / "models" / "forward.inputs.json"
    data = json.loads(record.read_text(encoding="utf-8"))
    record.write_text(json.dumps({**data, "finished": False}), encoding="utf-8")  # as a killed step leaves it
    assert trained_model("forward", corpus, tuning, tmp_path, "words", options) == folder
    assert (folder / BEST_WEIGHTS).is_file()


def test_a_folder_no_record_names_is_refused_not_removed(tmp_path):
    """-o pointed at a folder with a models/forward of the user's own: the build stops with one
    line naming it, and the folder is kept as it was."""
    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=3, valid_every=3, batch_size=8,
                      device="cpu")
    theirs = tmp_path / "models" / "forward"
    theirs.mkdir(parents=True)
    (theirs / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(PhraseScorerError, match="no record of this command's says what made it"):
        trained_model("forward", (str(TRAIN_EN), str(TRAIN_FR)), (str(VAL_EN), str(VAL_FR)), tmp_path, "words",
                      options)
    assert (theirs / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_step_times_read_as_a_person_says_them():
    from phrase_scorer.runtime.progress import duration

    assert [duration(s) for s in (4.2, 59.4, 61, 3500, 3599, 7500)] == ["4 s", "59 s", "1 min", "58 min",
                                                                       "1 h 00 min", "2 h 05 min"]


def test_a_working_folder_with_other_files_is_refused(tmp_path):
    from phrase_scorer.experiments.build_reranker import WORK_MARK, claim_work_folder

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "reranker.json").write_text("my reranker", encoding="utf-8")
    with pytest.raises(PhraseScorerError, match="holds files build-reranker did not make"):
        claim_work_folder(theirs)
    assert (theirs / "reranker.json").read_text(encoding="utf-8") == "my reranker"
    assert not (theirs / WORK_MARK).exists()
    ours = claim_work_folder(tmp_path / "new" / "work")  # new, then reclaimed with files in it
    (ours / "reranker.json").write_text("{}", encoding="utf-8")
    assert claim_work_folder(ours) == ours
    (ours / WORK_MARK).unlink()
    os.symlink(theirs / "reranker.json", ours / WORK_MARK)  # a mark that is a link is no mark
    with pytest.raises(PhraseScorerError, match="did not make"):
        claim_work_folder(ours)


def test_a_preset_is_checked_against_the_architectures_that_train():
    """An RNNsearch preset with the default Transformers is refused, naming the architecture that
    has it; with RNNsearch models it passes, and the reverse model's architecture counts only
    when a reverse model trains."""
    from phrase_scorer.experiments.build_reranker import check_options

    with pytest.raises(PhraseScorerError, match="give rnnsearch as archs for medium") as caught:
        check_options(replace(BuildRerankerOptions(), preset="medium"))
    assert "its presets: paper, small, tiny" in caught.value.message
    rnnsearch = replace(BuildRerankerOptions(), archs=("rnnsearch",), preset="medium")
    check_options(rnnsearch)  # the reverse Transformer does not train
    with pytest.raises(PhraseScorerError, match="not a preset of transformer, which reverse_arch names"):
        check_options(replace(rnnsearch, model_kinds=("forward", "right-to-left", "reverse")))
    check_options(replace(rnnsearch, model_kinds=("forward", "reverse"), reverse_arch="rnnsearch"))
