"""experiment reuses finished work only when it was made from the same inputs (no Moses needed)."""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from conftest import A_MAN_TABLE
from phrase_scorer.config import ExperimentOptions, TuneOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.file_identity import hash_identities
from phrase_scorer.experiments.experiment import (
    RUN_INPUTS, RunResult, prepare_tables, result_of, run_inputs, run_step, system_inputs,
)


def system(tmp_path: Path) -> Path:
    folder = tmp_path / "system"
    folder.mkdir()
    shutil.copy(A_MAN_TABLE, folder / "phrase-table.gz")
    ini = folder / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.gz "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    return ini


def changed_model(tiny_model: Path, out: Path) -> Path:
    shutil.copytree(tiny_model, out, ignore=shutil.ignore_patterns("cache"))
    weights = torch.load(out / "model.pt", weights_only=True)
    weights["readout.output.bias"] += 1.0
    torch.save(weights, out / "model.pt")
    return out


def stamp(path) -> tuple:
    stat = os.stat(path)
    return stat.st_mtime_ns, stat.st_ino


def test_tables_are_remade_when_the_model_or_the_table_changes(tmp_path, tiny_model, caplog):
    caplog.set_level(logging.INFO, logger="phrase_scorer")
    ini = system(tmp_path)
    work = tmp_path / "work"
    tables = prepare_tables(ini, work, model_dir=tiny_model, annotated=None)
    both, prob_only = Path(tables["rnn+wp"]), Path(tables["rnn"])
    first = {p: stamp(p) for p in (both, prob_only)}
    first_bytes = both.read_bytes()

    # the same inputs: nothing is made again
    caplog.clear()
    prepare_tables(ini, work, model_dir=tiny_model, annotated=None)
    assert {p: stamp(p) for p in (both, prob_only)} == first
    assert "annotating" not in caplog.text

    # another model: both tables are made again, from the new weights
    other = changed_model(tiny_model, tmp_path / "other-model")
    caplog.clear()
    prepare_tables(ini, work, model_dir=other, annotated=None)
    assert "out of date (model weights changed): annotating again" in caplog.text
    assert both.read_bytes() != first_bytes
    signature = json.loads(Path(str(both) + ".json").read_text())
    assert signature["model"]["directory"] == str(other)
    assert "phrase-table.rnn.gz is out of date (two-column table changed)" in caplog.text
    assert (json.loads(Path(str(prob_only) + ".json").read_text())["two-column table"]["mtime_ns"]
            == os.stat(both).st_mtime_ns)

    # the system's table touched (as a new copy would be): the same bytes, nothing is made again
    table = ini.parent / "phrase-table.gz"
    os.utime(table, ns=(os.stat(table).st_atime_ns, os.stat(table).st_mtime_ns + 10**9))
    second = {p: stamp(p) for p in (both, prob_only)}
    caplog.clear()
    prepare_tables(ini, work, model_dir=other, annotated=None)
    assert "annotating" not in caplog.text and {p: stamp(p) for p in (both, prob_only)} == second

    # the system's table rewritten with other bytes: annotated again
    table.write_bytes(gzip.compress(gzip.decompress(table.read_bytes()), compresslevel=1))
    caplog.clear()
    prepare_tables(ini, work, model_dir=other, annotated=None)
    assert "out of date (input table changed)" in caplog.text


def finished_run(run_dir: Path, inputs: dict) -> RunResult:
    run_dir.mkdir(parents=True)
    result = RunResult(system="RNN", seed=1, dev_bleu=50.0, test_bleu=51.0, test_chrf=70.0, iterations=3,
                       tuned_ini=str(run_dir / "tuned.ini"), hypotheses=str(run_dir / "test.hyp"),
                       bleu_signature="b", chrf_signature="c")
    (run_dir / RUN_INPUTS).write_text(json.dumps(hash_identities(inputs)))  # as a step records them
    (run_dir / "result.json").write_text(json.dumps(asdict(result)))
    return result


def test_a_tuning_run_is_reused_only_with_the_same_inputs(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="phrase_scorer")
    ini, table = tmp_path / "system.ini", tmp_path / "pt.gz"
    ini.write_text("[weight]\nTranslationModel0= 0.2\n")
    table.write_bytes(b"x")
    dev = [tmp_path / "dev.en", tmp_path / "dev.fr"]
    test = [tmp_path / "test.en", tmp_path / "test.fr"]
    for p in dev + test:
        p.write_text("a\n")
    tune, options = TuneOptions(seed=1), ExperimentOptions()
    inputs = run_inputs(system_inputs(ini, table, dev, test, options), tune)

    run_dir = tmp_path / "rnn" / "run-1"
    result = finished_run(run_dir, inputs)
    assert result_of(run_step(run_dir, inputs)) == result
    # recomputed: same
    assert result_of(run_step(run_dir, run_inputs(system_inputs(ini, table, dev, test, options), tune))) == result
    # the same bytes with a new modification time (a table annotated again, data copied anew): same
    for path in (table, *dev, *test):
        os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    assert result_of(run_step(run_dir, run_inputs(system_inputs(ini, table, dev, test, options), tune))) == result

    for change, name in [
        (lambda: ini.write_text("[weight]\nTranslationModel0= 0.3\n"), "system ini sha256"),
        (lambda: table.write_bytes(b"xy"), "phrase table"),
        (lambda: dev[1].write_text("b\nc\n"), "dev"),
        (lambda: None, "tuning options"),
    ]:
        shutil.rmtree(run_dir, ignore_errors=True)
        finished_run(run_dir, inputs)
        change()
        now = run_inputs(system_inputs(ini, table, dev, test, options),
                         replace(tune, max_iterations=3) if name == "tuning options" else tune)
        caplog.clear()
        assert result_of(run_step(run_dir, now)) is None
        assert f"({name} changed)" in caplog.text
        assert not run_dir.exists()  # the stale run is gone, so it is redone from scratch
        inputs = now

    # a run folder no record names (made by something else, or an older version) is refused, not removed
    finished_run(run_dir, inputs)
    (run_dir / RUN_INPUTS).unlink()
    with pytest.raises(PhraseScorerError, match="no record of this command's says what made it"):
        run_step(run_dir, inputs)
    assert (run_dir / "result.json").exists()
    shutil.rmtree(run_dir)
    # an interrupted run with the same inputs is kept for tuning again (nothing finished to reuse)
    run_dir.mkdir(parents=True)
    (run_dir / RUN_INPUTS).write_text(json.dumps(inputs))
    assert result_of(run_step(run_dir, inputs)) is None and run_dir.exists()
