"""The decoder options handed to Moses: every verb that takes them, and a reranker that records
them, refuses those that make Moses write or read files of its own (or change what it writes, or
reach a shell), before anything is made or Moses starts. No Moses build needed: the refusals come
first, and a stand-in decoder records whether it was ever started."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import DATA, error_line, run_cli
from phrase_scorer.config import (
    BuildRerankerOptions, EvaluateOptions, NBestOrigin, RerankOptions, RescoreExperimentOptions, TuneOptions,
)
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import dense_layout, read_nbest
from phrase_scorer.moses.decoder_flags import check_decoder_flags, refused_decoder_flags
from phrase_scorer.moses.installation import MosesInstallation
from phrase_scorer.rescoring.optimisers import weights_from_ini
from phrase_scorer.rescoring.reranker import Reranker

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
REFERENCE = DATA / "val.tok.fr.head"
TUNED_INI = DATA / "moses.tuned.ini"
NBEST_FLAGS = "-v 0 -n-best-list mydev.nbest 10"


def stand_in_moses(tmp_path: Path) -> Path:
    """A Moses home whose every program only leaves a mark that it was started, then fails."""
    home = tmp_path / "moses"
    for name in ("moses", "extractor", "mert", "kbmira", "pro", "evaluator"):
        program = home / "bin" / name
        program.parent.mkdir(parents=True, exist_ok=True)
        program.write_text(f"#!/bin/sh\ntouch '{home}/started'\nexit 1\n")
        program.chmod(0o755)
    script = home / "scripts" / "training" / "mert-moses.pl"
    script.parent.mkdir(parents=True)
    script.write_text(f"open(my $f, '>', '{home}/started'); exit 1;\n")
    return home


@pytest.fixture
def users_list(tmp_path, monkeypatch):
    """The user's own mydev.nbest in the folder the command runs in, which Moses would truncate."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOSES_HOME", raising=False)
    mine = tmp_path / "mydev.nbest"
    mine.write_bytes(b"0 ||| my own list ||| LM0= -1 ||| -1\n" * 100)
    return mine


@pytest.mark.parametrize("flags", ["", "-v 0", "-v 0 -n-best-factor 100", "-search-algorithm 1 -s 400 -cbp 400",
                                   "-dl -1 -b 0.1", "-distortion-limit 6 -threads 2 -early-discarding-threshold -5",
                                   "-print-alignment-info-in-n-best -include-segmentation-in-n-best"])
def test_options_that_only_set_the_search_are_accepted(flags):
    assert refused_decoder_flags(flags) == []
    check_decoder_flags(flags)


@pytest.mark.parametrize("option", [
    "-n-best-list x 10", "--n-best-list x 10", "-lattice-samples x 10", "-output-search-graph x", "-osg x",
    "-output-search-graph-extended x", "-osgx x", "-output-search-graph-slf d", "-slf d",
    "-output-search-graph-hypergraph true gz d", "-translation-details x", "-T x", "-translation-all-details x",
    "-Tall x", "-tree-translation-details x", "-Ttree x", "-output-word-graph x 0", "-owg x 0",
    "-alignment-output-file x", "-output-unknowns x", "-f other.ini", "-config other.ini", "-i input.txt",
    "-input-file input.txt", "-weight-file w", "-feature-add KENLM path=x", "-feature-overwrite LM0 path=x",
    "-aws id", "-t", "-tt", "-report-segmentation", "-print-id", "-print-alignment-info", "-server",
    "-show-weights",
])
def test_options_that_write_or_read_files_of_their_own_are_refused(option):
    with pytest.raises(PhraseScorerError) as caught:
        check_decoder_flags(f"-v 0 {option} -s 400")
    assert f"Moses' {option.split()[0]}:" in str(caught.value)
    assert str(caught.value).startswith("decoder_flags ")


@pytest.mark.parametrize("flags", ["-v 0 > out.txt", "-v 0; rm -rf x", "-v $(touch x)", "-v `x`", "-s 400 | tee x",
                                   "-v 0 # the rest", "-v 0\ntouch x", "-v 0\r\ntouch x", "-v\x000"])
def test_characters_a_shell_reads_are_refused(flags):
    """tune hands the flags to mert-moses.pl, which runs Moses through a shell."""
    with pytest.raises(PhraseScorerError, match="shell"):
        check_decoder_flags(flags)


def test_rerank_refuses_an_nbest_list_flag_and_keeps_the_named_file(users_list, tmp_path):
    before = users_list.read_bytes()
    out = tmp_path / "test.best"
    result = run_cli("rerank", "--dev", NBEST, REFERENCE, "--test", NBEST, "-o", out, "--decoder-flags", NBEST_FLAGS)
    line = error_line(result)
    assert "--decoder-flags sets Moses' -n-best-list" in line
    assert users_list.read_bytes() == before
    assert not out.exists() and not Path(f"{out}.json").exists() and not Path(f"{out}.work").exists()


def test_rerank_as_a_library_refuses_it_too(users_list, tmp_path):
    from phrase_scorer.rescoring.rerank import rerank

    out = tmp_path / "test.best"
    with pytest.raises(PhraseScorerError, match="-n-best-list"):
        rerank((NBEST, REFERENCE), NBEST, out, moses=MosesInstallation(stand_in_moses(tmp_path)),
               origin=NBestOrigin(decoder_flags=NBEST_FLAGS))
    assert not out.exists() and not (tmp_path / "moses" / "started").exists()


def verb_arguments(verb: str, tmp_path: Path) -> list:
    """The verb given valid inputs and outputs in ``tmp_path`` (its outputs named out*)."""
    model = tmp_path / "model"  # parsed as a folder name: the refusal comes before it is loaded
    model.mkdir(exist_ok=True)
    return {
        "evaluate": ["evaluate", TUNED_INI, "--test", SOURCE, REFERENCE, "-o", tmp_path / "out.hyp"],
        "tune": ["tune", TUNED_INI, "--dev", SOURCE, REFERENCE, "-o", tmp_path / "out.ini"],
        "experiment": ["experiment", TUNED_INI, "--annotated", NBEST, "--dev", SOURCE, REFERENCE, "--test", SOURCE,
                       REFERENCE, "-o", tmp_path / "out"],
        "rescore-experiment": ["rescore-experiment", TUNED_INI, "--dev", SOURCE, REFERENCE, "--test", SOURCE,
                               REFERENCE, "-m", f"RNN={model}", "-o", tmp_path / "out"],
        "build-reranker": ["build-reranker", TUNED_INI, "--corpus", SOURCE, REFERENCE, "--tuning-set", SOURCE,
                           REFERENCE, "-o", tmp_path / "out"],
    }[verb]


@pytest.mark.parametrize("verb", ["evaluate", "tune", "experiment", "rescore-experiment", "build-reranker"])
def test_every_verb_refuses_the_flags_at_the_parser(verb, users_list, tmp_path):
    home = stand_in_moses(tmp_path)
    before = users_list.read_bytes()
    result = run_cli(*verb_arguments(verb, tmp_path), "--decoder-flags", NBEST_FLAGS, "--moses-home", home)
    assert "--decoder-flags sets Moses' -n-best-list" in error_line(result)
    assert users_list.read_bytes() == before
    assert not (home / "started").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def test_the_long_commands_refuse_them_as_libraries_before_their_first_step(users_list, tmp_path):
    from phrase_scorer.experiments.build_reranker import build_reranker
    from phrase_scorer.experiments.report import ExperimentOutputs
    from phrase_scorer.experiments.rescore_experiment import Comparison, EvalSet, run_rescore_experiment
    from phrase_scorer.moses.evaluate import evaluate
    from phrase_scorer.moses.tune import tune

    moses = MosesInstallation(stand_in_moses(tmp_path))
    calls = [
        lambda: evaluate(TUNED_INI, SOURCE, REFERENCE, tmp_path / "out.hyp", moses=moses,
                         options=EvaluateOptions(decoder_flags=NBEST_FLAGS)),
        lambda: tune(TUNED_INI, SOURCE, REFERENCE, tmp_path / "out.ini", moses=moses,
                     options=TuneOptions(decoder_flags=NBEST_FLAGS)),
        lambda: build_reranker(TUNED_INI, (str(SOURCE), str(REFERENCE)), (str(SOURCE), str(REFERENCE)),
                               tmp_path / "out", moses=moses,
                               options=BuildRerankerOptions(experiment=RescoreExperimentOptions(
                                   decoder_flags=NBEST_FLAGS))),
        lambda: run_rescore_experiment(TUNED_INI, [EvalSet("val", str(SOURCE), str(REFERENCE)),
                                                   EvalSet("test", str(SOURCE), str(REFERENCE))],
                                       ExperimentOutputs(tmp_path / "out"), comparison=Comparison([]), moses=moses,
                                       options=RescoreExperimentOptions(decoder_flags=NBEST_FLAGS)),
    ]
    for call in calls:
        with pytest.raises(PhraseScorerError, match="-n-best-list"):
            call()
    assert not (tmp_path / "moses" / "started").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")]


def reranker_with_flags(tmp_path: Path, flags: str) -> Path:
    weights = weights_from_ini(TUNED_INI, dense_layout(next(iter(read_nbest(NBEST)))))
    data = Reranker(weights, (), {}, nbest_size=10, decoder_flags="-v 0").to_json()
    data["decoder"]["decoder_flags"] = flags
    path = tmp_path / "reranker.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_reranker_file_carrying_such_flags_is_refused_naming_the_file_and_key(tmp_path):
    path = reranker_with_flags(tmp_path, NBEST_FLAGS)
    with pytest.raises(PhraseScorerError) as caught:
        Reranker.read(path)
    assert caught.value.path == os.fspath(path)
    assert str(caught.value).startswith(f"{path}: decoder.decoder_flags sets Moses' -n-best-list")


def test_translate_refuses_such_a_reranker_before_moses_starts_and_keeps_the_named_file(users_list, tmp_path):
    reranker = reranker_with_flags(tmp_path, NBEST_FLAGS)
    home = stand_in_moses(tmp_path)
    before = users_list.read_bytes()
    out = tmp_path / "out.fr"
    result = run_cli("translate-system", "--moses", TUNED_INI, "--reranker", reranker, SOURCE, "-o", out,
                     "--moses-home", home)
    line = error_line(result)
    assert f"{reranker}: decoder.decoder_flags sets Moses' -n-best-list" in line
    assert users_list.read_bytes() == before
    assert not (home / "started").exists()
    assert not out.exists() and not Path(f"{out}.work").exists()


def test_rerank_refuses_a_seed_given_twice_before_anything_runs(tmp_path, monkeypatch):
    from phrase_scorer.rescoring.rerank import rerank

    monkeypatch.delenv("MOSES_HOME", raising=False)
    with pytest.raises(PhraseScorerError, match="seeds=1 is given twice"):
        rerank((NBEST, REFERENCE), NBEST, tmp_path / "out", options=RerankOptions(seeds=(1, 2, 1)))
    assert not list(tmp_path.iterdir())


def test_decode_asks_for_its_own_nbest_list_as_one_argument_per_value_and_checks_the_user_flags(tmp_path):
    """The experiments' n-best lists go to a path of the tool's (a working folder may hold spaces),
    handed to Moses as arguments of their own, never through the user's flags."""
    from phrase_scorer.moses.evaluate import Decoding, decode

    home = tmp_path / "moses"
    (home / "bin").mkdir(parents=True)
    program = home / "bin" / "moses"
    program.write_text(f"#!/bin/sh\nfor a in \"$@\"; do echo \"$a\" >> '{home}/argv'; done\ncat\n")
    program.chmod(0o755)
    moses = MosesInstallation(home)
    folder = tmp_path / "a work folder"
    folder.mkdir()
    hypotheses = decode(TUNED_INI, SOURCE, folder / "out.1best", moses=moses,
                        decoding=Decoding(decoder_flags="-v 0", nbest_list=(folder / "dev.nbest", 7)))
    assert hypotheses == SOURCE.read_text(encoding="utf-8").splitlines()  # the stand-in copies its input
    argv = (home / "argv").read_text(encoding="utf-8").splitlines()
    at = argv.index("-n-best-list")
    assert argv[at:at + 4] == ["-n-best-list", str(folder / "dev.nbest"), "7", "distinct"]
    (home / "argv").unlink()
    with pytest.raises(PhraseScorerError, match="-n-best-list"):
        decode(TUNED_INI, SOURCE, folder / "other.1best", moses=moses, decoding=Decoding(decoder_flags=NBEST_FLAGS))
    assert not (home / "argv").exists() and not (folder / "other.1best").exists()
