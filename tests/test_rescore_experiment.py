"""rescore-experiment: n-best lists rescored, reranked per row and seed, and reported.

The default tests check the oracle and the rows' parsing; the `moses` tests run the whole
experiment with Moses' extractor and mert on the tuned Multi30k system's 100-best list of val
(../shared), cut into a dev and a test list, and decode a few sentences to check the decoding step.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import SHARED, SHARED_SYSTEM
from phrase_scorer.config import RescoreExperimentOptions
from phrase_scorer.io.nbest import group_by_sentence, read_nbest, write_nbest
from phrase_scorer.moses.evaluate import score
from phrase_scorer.rescoring.reranker import Reranker, apply_reranker
from phrase_scorer.experiments.report import ExperimentOutputs
from phrase_scorer.experiments.rescore_experiment import (
    MOSES_ROW, Comparison, DecodedSystem, default_rows, oracle_figures, run_rescore_experiment,
)
from phrase_scorer.experiments.system_steps import RETUNED_ROW, EvalSet, Row, decoded_nbest, first_hypotheses
from phrase_scorer.experiments.statistics import ngram_stats, smoothed_sentence_bleu
from phrase_scorer.records import Step

VAL_EN = SHARED / "multi30k-en-fr" / "val.tok.en.gz"
VAL_FR = SHARED / "multi30k-en-fr" / "val.tok.fr.gz"
TUNED_INI = SHARED_SYSTEM / "moses.tuned.ini"


def test_rows_are_parsed_and_bad_ones_refused():
    import click

    from phrase_scorer.cli.options import RowType

    assert RowType().convert("RNNsearch, both directions=RNNsearch, RNNsearchReverse", None, None) == Row(
        "RNNsearch, both directions", ("RNNsearch", "RNNsearchReverse"))
    assert Row("+ RNN (both)", ("RNN",)).folder == "rnn-both"
    for bad in ("RNN", "=RNN", "label="):
        with pytest.raises(click.BadParameter, match="LABEL=FEATURE"):
            RowType().convert(bad, None, None)


def test_decoder_systems_are_parsed_and_bad_ones_refused(tmp_path):
    import click

    from phrase_scorer.cli.options import SystemType

    runs = [tmp_path / f"run-{k}.ini" for k in (1, 2)]
    for ini in runs:
        ini.write_text("[weight]\n", encoding="utf-8")
    assert SystemType().convert(f"Moses + phrase columns={runs[0]}, {runs[1]}", None, None) == DecodedSystem(
        "Moses + phrase columns", (str(runs[0]), str(runs[1])))
    assert DecodedSystem("Moses + phrase columns", ()).folder == "moses-phrase-columns"
    for bad in (str(runs[0]), f"={runs[0]}", "label="):
        with pytest.raises(click.BadParameter, match="LABEL=MOSES_INI"):
            SystemType().convert(bad, None, None)
    with pytest.raises(click.BadParameter, match="does not exist"):
        SystemType().convert(f"label={tmp_path / 'missing.ini'}", None, None)


@pytest.mark.parametrize("option, value, said", [
    ("--row", "RNN", "'RNN' is not LABEL=FEATURE[,FEATURE...]"),
    ("--system", "label={missing}", "does not exist"),
    ("--system", "label", "'label' is not LABEL=MOSES_INI[,MOSES_INI...]"),
    ("-m", "models/rnn", "'models/rnn' is not NAME=DIR"),
    ("--reverse-model", "=models/rnn", "'=models/rnn' is not NAME=DIR"),
])
def test_a_bad_row_system_or_named_model_is_a_usage_error_of_its_option(tmp_path, option, value, said):
    """rescore-experiment's LABEL=... and NAME=DIR options are checked as the command line is read:
    a usage error naming the option (exit status 2), before any model is loaded or list decoded."""
    from click.testing import CliRunner

    from phrase_scorer.cli import cli

    files = [tmp_path / name for name in ("moses.ini", "dev.src", "dev.ref")]
    for path in files:
        path.write_text("x\n", encoding="utf-8")
    ini, src, ref = map(str, files)
    value = value.format(missing=tmp_path / "missing.ini")
    done = CliRunner().invoke(cli, ["rescore-experiment", ini, "--dev", src, ref, "--test", src, ref,
                                    "-o", str(tmp_path / "work"), option, value])
    assert done.exit_code == 2, done.output
    assert f"Invalid value for '{option}'" in done.output or "Invalid value for '-" in done.output
    assert said in done.output
    assert not (tmp_path / "work").exists()


def test_a_step_is_reused_for_the_same_bytes_and_redone_for_new_ones(tmp_path):
    """A step's record names its input files by their bytes: a copy with a new modification time
    (data unpacked again) reuses the step's output; other bytes of the same size redo it."""
    import os

    from phrase_scorer.io.file_identity import file_identity

    source, output, record = tmp_path / "val.en", tmp_path / "val.out", tmp_path / "val.inputs.json"
    source.write_text("a man .\n", encoding="utf-8")
    step = Step(record, {"source": file_identity(source)}, [output])
    assert not step.done
    with step:
        output.write_text("done\n", encoding="utf-8")
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))
    assert Step(record, {"source": file_identity(source)}, [output]).done
    assert output.exists()
    source.write_text("a dog .\n", encoding="utf-8")  # the same size, other bytes
    assert not Step(record, {"source": file_identity(source)}, [output]).done
    assert not output.exists()


def test_an_interrupted_step_keeps_its_partial_output_for_the_resume(tmp_path):
    """The same inputs and no finished output: the step was interrupted, and what it wrote so far
    stays for it to go on from; other inputs remove it. A step that fails is not recorded as finished."""
    from phrase_scorer.io.file_identity import file_identity
    from phrase_scorer.io.paths import part_path

    source, output, record = tmp_path / "val.en", tmp_path / "val.nbest.gz", tmp_path / "val.inputs.json"
    source.write_text("a man .\n", encoding="utf-8")
    partial, partial_record = part_path(output), Path(str(part_path(output)) + ".json")
    with pytest.raises(KeyboardInterrupt):
        with Step(record, {"source": file_identity(source)}, [output]):
            partial.write_bytes(b"half")
            partial_record.write_text("{}", encoding="utf-8")
            raise KeyboardInterrupt
    assert json.loads(record.read_text())["finished"] is False
    assert not Step(record, {"source": file_identity(source)}, [output]).done
    assert partial.read_bytes() == b"half" and partial_record.exists()
    source.write_text("a dog .\n", encoding="utf-8")
    assert not Step(record, {"source": file_identity(source)}, [output]).done
    assert not partial.exists() and not partial_record.exists()


def test_a_step_interrupted_after_its_output_appeared_is_not_done(tmp_path):
    """A training's weights file exists from its first validation on: an output that exists does
    not make an interrupted step done; its record must say finished."""
    from phrase_scorer.io.file_identity import file_identity

    source, output, record = tmp_path / "train.en", tmp_path / "model.pt", tmp_path / "model.inputs.json"
    source.write_text("a man .\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt):
        with Step(record, {"source": file_identity(source)}, [output]):
            output.write_bytes(b"weights of the first validation")
            raise KeyboardInterrupt
    step = Step(record, {"source": file_identity(source)}, [output])
    assert not step.done and output.exists()  # kept: the step goes on from it
    with step:
        pass
    assert Step(record, {"source": file_identity(source)}, [output]).done


def test_sentence_bleu_ranks_the_reference_first():
    reference = "un chien court sur l&apos; herbe".split()
    from collections import Counter

    counts = [Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)) for n in range(1, 5)]
    exact = smoothed_sentence_bleu(ngram_stats(reference, counts, len(reference)))
    assert exact == pytest.approx(1.0)
    close = smoothed_sentence_bleu(ngram_stats("un chien court sur herbe".split(), counts, len(reference)))
    far = smoothed_sentence_bleu(ngram_stats("deux chats dorment".split(), counts, len(reference)))
    assert exact > close > far >= 0.0


def test_the_oracle_finds_the_reference_in_the_list(tmp_path):
    """A list whose third hypothesis is the reference: the oracle of 1 is the 1-best, of 3 and more the reference."""
    from phrase_scorer.io.nbest import NBestEntry

    references = ["un chien court", "une femme lit un livre"]
    hypotheses = [["le chien", "un chat court", "un chien court"], ["une femme lit", "une femme lit un livre"]]
    entries = [NBestEntry(i, f" {h} ", [("LM0", [-1.0])], -1.0) for i, hs in enumerate(hypotheses) for h in hs]
    nbest = tmp_path / "list.nbest"
    write_nbest(entries, nbest)
    figures = oracle_figures(nbest, references, RescoreExperimentOptions(nbest_size=3))
    assert figures["hypotheses per sentence"] == 2.5
    assert figures["1"] == pytest.approx(score(first_hypotheses(nbest), references).bleu)
    assert figures["3"] == pytest.approx(100.0)
    assert figures["1"] < figures["3"]


# --- with Moses ---------------------------------------------------------------------------------------


def split_list(tmp_path: Path, cut: int):
    """The shared 100-best list of val's first 100 sentences as a dev list (sentences 0..cut-1) and a
    test list (cut..99, renumbered from 0), with their sources and references."""
    entries = list(read_nbest(SHARED_SYSTEM / "val.nbest.gz"))
    with gzip.open(VAL_EN, "rt", encoding="utf-8") as f:
        sources = [next(f) for _ in range(100)]
    with gzip.open(VAL_FR, "rt", encoding="utf-8") as f:
        references = [next(f) for _ in range(100)]
    sets = []
    for name, first, last in (("dev", 0, cut), ("test", cut, 100)):
        write_nbest([replace(e, sentence_id=e.sentence_id - first, _origin=None)
                     for e in entries if first <= e.sentence_id < last], tmp_path / f"{name}.nbest.gz")
        (tmp_path / f"{name}.en").write_text("".join(sources[first:last]), encoding="utf-8")
        (tmp_path / f"{name}.fr").write_text("".join(references[first:last]), encoding="utf-8")
        sets.append(EvalSet(name, str(tmp_path / f"{name}.en"), str(tmp_path / f"{name}.fr"),
                            str(tmp_path / f"{name}.nbest.gz")))
    return sets


@pytest.mark.moses
def test_the_experiment_reports_every_row_and_resumes(moses, tmp_path, loaded_tiny, caplog):
    from conftest import TRAIN_EN, TRAIN_FR
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.data.sentence_pairs import SentenceCorpus
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.rescoring.rescore import FeatureModel
    from phrase_scorer.training.run import train

    sets = split_list(tmp_path, 50)
    # the reverse feature's model reads French and predicts English (the experiment checks each
    # model's direction against the dev set before it starts)
    train(SentenceCorpus(str(TRAIN_FR), str(TRAIN_EN)), tmp_path / "reverse",
          TrainConfig(preset="tiny", max_length=12, max_steps=30, valid_every=30, valid_pairs=50, seed=2))
    models = [FeatureModel("RNN", loaded_tiny), FeatureModel("RNNReverse", load_model(tmp_path / "reverse"),
                                                             reverse=True)]
    options = RescoreExperimentOptions(nbest_size=100, runs=2, restarts=2, bootstrap_samples=100)
    work = tmp_path / "work"
    report = run_rescore_experiment(TUNED_INI, sets, ExperimentOutputs(work), comparison=Comparison(models),
                                    moses=moses, options=options)

    rows = [r.row for r in report.runs]
    assert rows == [MOSES_ROW] + [RETUNED_ROW] * 2 + ["+ RNN"] * 2 + ["+ RNNReverse"] * 2 + ["+ all"] * 2
    moses_run = report.runs[0]
    test_hyps = first_hypotheses(sets[1].nbest)
    assert Path(moses_run.hypotheses["test"]).read_text(encoding="utf-8").splitlines() == test_hyps
    assert moses_run.scores["test"]["bleu"] == pytest.approx(
        score(test_hyps, Path(sets[1].reference).read_text().splitlines()).bleu)
    for run in report.runs[1:]:
        assert len(Path(run.hypotheses["test"]).read_text(encoding="utf-8").splitlines()) == 50
        assert run.tuned_dev_bleu is not None
    # each row weights only its own features
    assert {"RNN"} <= set(report.runs[3].weights) and "RNNReverse" not in report.runs[3].weights
    assert "RNN" not in report.runs[1].weights and "RNNReverse" not in report.runs[1].weights
    assert {"RNN", "RNNReverse"} <= set(report.runs[7].weights)
    # one p per seed and row, against Moses' 1-best
    assert set(report.significance["test"]) == {RETUNED_ROW, "+ RNN", "+ RNNReverse", "+ all"}
    assert all(len(p) == 2 and all(0.0 <= v <= 1.0 for v in p) for p in report.significance["test"].values())
    # the oracle of the 1-best is the 1-best; longer lists hold better hypotheses
    oracle = report.oracle["test"]
    assert oracle["1"] == pytest.approx(moses_run.scores["test"]["bleu"])
    assert oracle["1"] < oracle["10"] <= oracle["100"]
    assert "| + all | RNN, RNNReverse |" in report.markdown and (work / "report.md").exists()
    # each tuned row's reranker, as rerank writes one: the weights of its run with the best dev
    # BLEU, the other rows' features left out, the models and size of the dev list; applied to the
    # rescored test list it writes that run's test hypotheses
    assert set(report.rerankers) == {"+ RNN", "+ RNNReverse", "+ all"}
    rows_by_label = {row.label: row for row in default_rows(["RNN", "RNNReverse"])}
    largest = max(len(g) for _, g in group_by_sentence(read_nbest(sets[0].nbest)))
    for label, path in report.rerankers.items():
        tuned = Reranker.read(path)
        best = max((r for r in report.runs if r.row == label), key=lambda r: r.tuned_dev_bleu)
        assert tuned.weights.by_name() == best.weights and set(tuned.models) == {"RNN", "RNNReverse"}
        assert set(tuned.ignore_features) == {"RNN", "RNNReverse"} - set(rows_by_label[label].features)
        assert tuned.decoder == {"nbest_size": largest, "decoder_flags": None}  # lists given: flags unknown
        out = tmp_path / f"{Path(path).stem}.hyp"
        assert apply_reranker(path, work / "rescored" / "test.nbest.gz", out) == 50
        assert out.read_text(encoding="utf-8") == Path(best.hypotheses["test"]).read_text(encoding="utf-8")

    # run again: every step is reused
    stamps = {p: p.stat().st_mtime_ns for p in work.rglob("result.json")}
    stamps[work / "rescored" / "dev.nbest.gz"] = (work / "rescored" / "dev.nbest.gz").stat().st_mtime_ns
    caplog.set_level("INFO")
    again = run_rescore_experiment(TUNED_INI, sets, ExperimentOutputs(work), comparison=Comparison(models), moses=moses,
                                   options=options)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert [r.scores for r in again.runs] == [r.scores for r in report.runs]
    assert "already rescored" in caplog.text

    # another number of restarts: the reranking runs are redone, the rescored lists are not
    changed = run_rescore_experiment(TUNED_INI, sets, ExperimentOutputs(work), comparison=Comparison(models),
                                     moses=moses, options=replace(options, restarts=3, runs=1))
    assert len(changed.runs) == 1 + 4
    assert (work / "rescored" / "dev.nbest.gz").stat().st_mtime_ns == stamps[work / "rescored" / "dev.nbest.gz"]


@pytest.mark.moses
def test_the_experiment_decodes_distinct_nbest_lists(moses, tmp_path, loaded_tiny):
    from phrase_scorer.rescoring.rescore import FeatureModel

    sets = []
    with gzip.open(VAL_EN, "rt", encoding="utf-8") as f:
        sources = [next(f) for _ in range(6)]
    with gzip.open(VAL_FR, "rt", encoding="utf-8") as f:
        references = [next(f) for _ in range(6)]
    for name, lines in (("dev", slice(0, 3)), ("test", slice(3, 6))):
        (tmp_path / f"{name}.en").write_text("".join(sources[lines]), encoding="utf-8")
        (tmp_path / f"{name}.fr").write_text("".join(references[lines]), encoding="utf-8")
        sets.append(EvalSet(name, str(tmp_path / f"{name}.en"), str(tmp_path / f"{name}.fr")))
    options = RescoreExperimentOptions(nbest_size=20, runs=1, restarts=1, bootstrap_samples=50, threads=2)
    again = DecodedSystem("Moses, decoded again", (str(TUNED_INI),))  # a decoder system: here Moses itself
    report = run_rescore_experiment(TUNED_INI, sets, ExperimentOutputs(tmp_path / "work"),
                                    comparison=Comparison([FeatureModel("RNN", loaded_tiny)], systems=[again]),
                                    moses=moses, options=options)
    nbest = tmp_path / "work" / "nbest" / "test.nbest"
    groups = [entries for _, entries in group_by_sentence(read_nbest(nbest))]
    assert len(groups) == 3 and all(1 < len(g) <= 20 for g in groups)
    assert all(len({e.text for e in g}) == len(g) for g in groups)  # distinct
    moses_1best = (tmp_path / "work" / "nbest" / "test.1best").read_text(encoding="utf-8").splitlines()
    # the same words as the decoder printed (it ends each line with a space)
    assert Path(report.runs[0].hypotheses["test"]).read_text(encoding="utf-8").splitlines() == [
        line.rstrip(" ") for line in moses_1best]
    # the system decoded with the same tuned moses.ini gives Moses' 1-best: same BLEU, p = 1
    decoded = next(r for r in report.runs if r.row == again.label)
    assert decoded.seed == 1 and decoded.scores == report.runs[0].scores
    assert Path(decoded.hypotheses["test"]).read_text(encoding="utf-8") == Path(
        report.runs[0].hypotheses["test"]).read_text(encoding="utf-8")
    assert report.significance["test"][again.label] == [1.0]
    assert f"| {again.label} | its own tuned moses.ini |" in report.markdown
    # the lists' flags, Moses' -n-best-factor 100 by default, recorded in the row's reranker for translate
    assert "decoder flags `-v 0 -n-best-factor 100`" in report.markdown
    tuned = Reranker.read(report.rerankers["+ RNN"])
    dev_groups = [g for _, g in group_by_sentence(read_nbest(tmp_path / "work" / "nbest" / "dev.nbest"))]
    assert tuned.decoder == {"nbest_size": max(len(g) for g in dev_groups), "decoder_flags": "-v 0 -n-best-factor 100"}
    assert f"- reranker of + RNN (its run with the best dev BLEU), for the whole system (`phrase-scorer translate` " \
           f"with `moses.tuned.ini`): `{report.rerankers['+ RNN']}`" in report.markdown
    # with a factor of 1 Moses gives up on distinct hypotheses sooner: fewer of them
    (tmp_path / "factor1").mkdir()
    few = decoded_nbest(TUNED_INI, sets[1], tmp_path / "factor1", moses, replace(options, nbest_factor=1))
    assert sum(1 for _ in read_nbest(few)) < sum(len(g) for g in groups)


def test_identical_outputs_are_not_significantly_different():
    from phrase_scorer.experiments.statistics import paired_bootstrap_p

    references = ["un chien court .", "une femme lit un livre .", "deux enfants jouent ."] * 10
    same = ["un chien court .", "une femme lit .", "deux enfants jouent dehors ."] * 10
    assert paired_bootstrap_p(same, list(same), references, samples=50) == 1.0
    better = paired_bootstrap_p(same, references, references, samples=200)
    assert better < 0.05


def test_every_experiment_option_of_the_command_line_is_a_field_of_its_options():
    """rescore-experiment passes its list, rescoring and reranking options to
    RescoreExperimentOptions by name: each must be one of its fields."""
    from dataclasses import fields

    from phrase_scorer.cli import cli
    from phrase_scorer.config import RescoreExperimentOptions

    command = cli.commands["rescore-experiment"]
    own = {"moses_ini", "dev", "tests", "dev_nbest", "test_nbests", "models", "reverse_models", "rows", "systems",
           "work_dir", "report", "overwrite", "batch_tokens", "device", "precision", "threads", "moses_home",
           "decoder_threads"}
    passed = {p.name for p in command.params} - own
    assert passed and passed <= {f.name for f in fields(RescoreExperimentOptions)}
    assert {"nbest_size", "nbest_factor", "runs", "method", "restarts", "normalize", "lang"} <= passed
