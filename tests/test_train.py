"""Training: the model directory, reproducibility, resuming, and refusing to overwrite."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import A_MAN_TABLE, EXAMPLE_TABLE
from phrase_scorer.config import TrainConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import ModelDirectory, load_model
from phrase_scorer.train import train

QUICK = dict(preset="tiny", valid_pairs=200, valid_every=20, batch_size=16, seed=11)


def checkpoint_state(directory: Path):
    return torch.load(directory / "checkpoint.pt", weights_only=True)


def assert_same_state(a: Path, b: Path) -> None:
    ca, cb = checkpoint_state(a), checkpoint_state(b)
    assert ca["state"]["step"] == cb["state"]["step"]
    assert ca["state"]["best_valid_nll"] == cb["state"]["best_valid_nll"]
    for name, tensor in ca["model"].items():
        assert torch.equal(tensor, cb["model"][name]), name
    for (ka, sa), (kb, sb) in zip(ca["optimizer"]["state"].items(), cb["optimizer"]["state"].items()):
        for key in sa:
            assert torch.equal(sa[key], sb[key]), (ka, key)
    assert (a / "model.pt").read_bytes() == (b / "model.pt").read_bytes() or torch.equal(
        torch.load(a / "model.pt", weights_only=True)["readout.output.weight"],
        torch.load(b / "model.pt", weights_only=True)["readout.output.weight"],
    )


def test_model_directory_is_self_describing(tiny_model):
    for name in ("config.json", "vocab.source.json", "vocab.target.json", "model.pt", "checkpoint.pt", "train.log.jsonl"):
        assert (tiny_model / name).is_file(), name
    assert (tiny_model / "cache" / "meta.json").is_file()
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["preset"] == "tiny" and config["model"]["hidden_dim"] == 32
    assert config["training"]["batch_size"] == 64
    assert config["table"]["unique_pairs"] == 30460
    records = [json.loads(l) for l in (tiny_model / "train.log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [200, 400]
    for key in ("valid_nll_pair", "valid_nll_token", "valid_ppl", "valid_margin_pair", "pairs_per_second"):
        assert key in records[-1]
    assert records[-1]["valid_nll_token"] < records[0]["valid_nll_token"]


def test_training_learns_something(tiny_model):
    """Held-out pairs: the validation NLL falls well below the uniform distribution's."""
    import math

    records = [json.loads(l) for l in (tiny_model / "train.log.jsonl").read_text().splitlines()]
    loaded = load_model(tiny_model)
    uniform = math.log(len(loaded.target_vocab) - 1)
    assert records[-1]["valid_nll_token"] < 0.8 * uniform
    assert records[-1]["valid_margin_pair"] > 0


def test_same_seed_same_model(tmp_path):
    for name in ("a", "b"):
        train(EXAMPLE_TABLE, tmp_path / name, TrainConfig(max_steps=40, **QUICK))
    assert_same_state(tmp_path / "a", tmp_path / "b")
    other = TrainConfig(max_steps=40, **{**QUICK, "seed": 12})
    train(EXAMPLE_TABLE, tmp_path / "c", other)
    assert not torch.equal(checkpoint_state(tmp_path / "a")["model"]["readout.output.weight"],
                           checkpoint_state(tmp_path / "c")["model"]["readout.output.weight"])


def test_resume_ends_in_the_same_state(tmp_path):
    train(EXAMPLE_TABLE, tmp_path / "whole", TrainConfig(max_steps=60, **QUICK))
    train(EXAMPLE_TABLE, tmp_path / "parts", TrainConfig(max_steps=30, **QUICK))
    assert checkpoint_state(tmp_path / "parts")["state"]["step"] == 30
    state = train(EXAMPLE_TABLE, tmp_path / "parts", TrainConfig(max_steps=60, **QUICK), resume=True, explicit={"max_steps"})
    assert state.step == 60
    assert_same_state(tmp_path / "whole", tmp_path / "parts")


def run_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "phrase_scorer", *map(str, args)], capture_output=True, text=True, **kwargs)


def test_ctrl_c_saves_a_checkpoint_and_resume_continues_exactly(tmp_path):
    args = ["train", EXAMPLE_TABLE, "--preset", "tiny", "--valid-pairs", 200, "--valid-every", 1000,
            "--batch-size", 16, "--seed", 5, "--max-steps", 400, "--threads", 1]
    proc = subprocess.Popen([sys.executable, "-m", "phrase_scorer", *map(str, args), "-o", tmp_path / "cut"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = ""
    for line in proc.stderr:  # wait until the training loop has run 20 steps (it logs its speed)
        seen += line
        if "speed:" in line:
            break
    time.sleep(0.5)  # some more steps
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = seen + err
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("phrase-scorer: error: stopped at step ") and "checkpoint saved" in last and "--resume" in last
    step = checkpoint_state(tmp_path / "cut")["state"]["step"]
    assert 0 < step < 400
    resumed = run_cli(*args, "-o", tmp_path / "cut", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    whole = run_cli(*args, "-o", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    assert_same_state(tmp_path / "whole", tmp_path / "cut")


def test_a_trained_model_is_not_overwritten(tmp_path):
    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK))
    with pytest.raises(PhraseScorerError, match="already holds a model.*--resume.*--overwrite"):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK))
    before = (out / "model.pt").stat().st_mtime_ns
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK), overwrite=True)
    assert (out / "model.pt").stat().st_mtime_ns != before
    with pytest.raises(PhraseScorerError, match="cannot resume: --batch-size changed since the interrupted run \\(--batch-size: 16 -> 32\\)"):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=10, **{**QUICK, "batch_size": 32}), resume=True,
              explicit={"batch_size", "max_steps"})
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    with pytest.raises(PhraseScorerError, match="not empty and holds no phrase-scorer model"):
        train(EXAMPLE_TABLE, other, TrainConfig(max_steps=5, **QUICK))
    with pytest.raises(PhraseScorerError, match="cannot resume: table, table_size, table_mtime_ns changed since the interrupted run"):
        train(A_MAN_TABLE, out, TrainConfig(max_steps=10, **QUICK), resume=True, explicit={"max_steps"})
    with pytest.raises(PhraseScorerError, match="nothing to resume: no model here"):
        train(EXAMPLE_TABLE, tmp_path / "fresh", TrainConfig(max_steps=5, **QUICK), resume=True)


def test_weights_that_disagree_with_the_config_are_refused(tmp_path, tiny_model):
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy, ignore=shutil.ignore_patterns("cache"))
    config = json.loads((copy / "config.json").read_text())
    config["model"]["hidden_dim"] = 33
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PhraseScorerError, match="shape .* config.json and the vocabularies call for"):
        ModelDirectory(copy).load()
