"""Training: the model directory, reproducibility, resuming, and refusing to overwrite."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import A_MAN_TABLE, EXAMPLE_TABLE, start_halted
from phrase_scorer.config import TrainConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import ModelDirectory, load_model
from phrase_scorer.training.run import train

QUICK = dict(preset="tiny", valid_pairs=200, valid_every=20, batch_size=16, seed=11)


def checkpoint_state(directory: Path):
    return torch.load(directory / "checkpoint.pt", weights_only=True)


def assert_same_state(a: Path, b: Path) -> None:
    ca, cb = checkpoint_state(a), checkpoint_state(b)
    assert ca["state"]["step"] == cb["state"]["step"]
    assert ca["state"]["best_valid_nll"] == cb["state"]["best_valid_nll"]
    assert_same_tensors(ca["model"], cb["model"])
    oa, ob = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert oa.keys() == ob.keys() and len(oa) == len(ca["model"])  # a state for every parameter
    for param in oa:
        assert_same_tensors(oa[param], ob[param], f"optimizer state of parameter {param}")
    assert ca["optimizer"]["param_groups"] == cb["optimizer"]["param_groups"]
    assert_same_tensors(torch.load(a / "model.pt", weights_only=True), torch.load(b / "model.pt", weights_only=True),
                        "best weights")


def assert_same_tensors(a: dict, b: dict, what: str = "weights") -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), (what, key)
        else:
            assert a[key] == b[key], (what, key)


def test_model_directory_is_self_describing(tiny_model):
    for name in ("config.json", "vocab.source.json", "vocab.target.json", "model.pt", "checkpoint.pt",
                 "train.log.jsonl"):
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
    state = train(EXAMPLE_TABLE, tmp_path / "parts", TrainConfig(max_steps=60, **QUICK), resume=True,
                  explicit={"max_steps"})
    assert state.step == 60
    assert_same_state(tmp_path / "whole", tmp_path / "parts")


def run_cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "phrase_scorer", *map(str, args)], capture_output=True, text=True,
                          **kwargs)


def test_ctrl_c_saves_a_checkpoint_and_resume_continues_exactly(tmp_path):
    """Ctrl-C while step 38 runs: the step completes, its checkpoint is saved, and --resume goes on."""
    args = ["train", EXAMPLE_TABLE, "--preset", "tiny", "--valid-pairs", 200, "--valid-every", 1000,
            "--batch-size", 16, "--seed", 5, "--max-steps", 400, "--threads", 1]
    ready = tmp_path / "ready"
    proc = start_halted("step:37", [*args, "-o", tmp_path / "cut"], ready)  # 37 steps done
    proc.send_signal(signal.SIGINT)
    ready.unlink()  # let step 38 run: the signal is handled at its end
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert (last.startswith("phrase-scorer: error: stopped at step 38,") and "checkpoint saved" in last
            and "--resume" in last)
    assert checkpoint_state(tmp_path / "cut")["state"]["step"] == 38
    resumed = run_cli(*args, "-o", tmp_path / "cut", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    whole = run_cli(*args, "-o", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    assert_same_state(tmp_path / "whole", tmp_path / "cut")


def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it_and_stops_on_sigterm(tmp_path):
    """As a script's background job (SIGINT ignored from the start): Ctrl-C changes nothing, and
    SIGTERM still stops after the step with a checkpoint (were SIGINT taken as a first request,
    SIGTERM would be the second and stop at once, without one); the exit status says SIGTERM (143)."""
    args = ["train", EXAMPLE_TABLE, "--preset", "tiny", "--valid-pairs", 200, "--valid-every", 1000,
            "--batch-size", 16, "--seed", 5, "--max-steps", 400, "--threads", 1, "-o", tmp_path / "cut"]
    ready = tmp_path / "ready"
    proc = start_halted("step:37", args, ready, sigint_ignored=True)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    ready.unlink()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("phrase-scorer: error: stopped at step 38,"), err
    assert checkpoint_state(tmp_path / "cut")["state"]["step"] == 38


# --- stopping rules --------------------------------------------------------------------------------


def batches_per_epoch(model_dir: Path, batch_size: int) -> int:
    from phrase_scorer.data.batches import BatchSampler
    from phrase_scorer.data.cache import PairSet

    return BatchSampler(PairSet(model_dir / "cache", "train"), batch_size, 0).batches_per_epoch


def test_max_epochs_stops_at_the_epoch_fraction(tmp_path):
    config = dict(QUICK, valid_every=1000)
    state = train(A_MAN_TABLE, tmp_path / "one", TrainConfig(max_epochs=1, **config))
    per_epoch = batches_per_epoch(tmp_path / "one", QUICK["batch_size"])
    assert per_epoch > 10
    assert state.step == per_epoch and state.stop_reason == "reached max_epochs=1"
    state = train(A_MAN_TABLE, tmp_path / "half", TrainConfig(max_epochs=0.5, **config))
    assert state.step == -(-per_epoch // 2) and state.stop_reason == "reached max_epochs=0.5"
    state = train(A_MAN_TABLE, tmp_path / "two", TrainConfig(max_epochs=2, **config))
    assert state.step == 2 * per_epoch


def test_max_time_stops_after_the_step_that_reaches_it(tmp_path):
    """Any step takes more than a nanosecond, so the limit is reached after exactly one step."""
    state = train(A_MAN_TABLE, tmp_path / "m", TrainConfig(max_time=1e-9, **QUICK))
    assert state.step == 1 and state.stop_reason == "reached max_time=1e-09s"
    assert checkpoint_state(tmp_path / "m")["state"]["step"] == 1


def test_max_time_accepts_durations():
    from phrase_scorer.cli.group import Duration

    assert [Duration().convert(v, None, None) for v in ("90", "90s", "30m", "2h", "1h30m")] == [
        90, 90, 1800, 7200, 5400]


def test_early_stopping_after_patience_validations_without_improvement(tmp_path, monkeypatch):
    """Validation NLLs 5, 4, 4.5, 4.2, 4.0 (no better than the best, 4): with patience 3 training stops at the
    fifth validation, and model.pt keeps the weights of the second."""
    from phrase_scorer.training import loop as train_module

    nlls = iter([5.0, 4.0, 4.5, 4.2, 4.0, 3.0, 2.0])
    real_validate = train_module.validate

    def scripted(model, pairs, device, precision, *args, **kwargs):
        metrics = real_validate(model, pairs, device, precision, *args, **kwargs)
        return {**metrics, "valid_nll_token": next(nlls)}

    monkeypatch.setattr(train_module, "validate", scripted)
    out = tmp_path / "m"
    state = train(A_MAN_TABLE, out, TrainConfig(patience=3, max_steps=1000, **{**QUICK, "valid_every": 5}))
    assert state.step == 25 and state.stop_reason == "early stopping: no improvement in 3 validations"
    assert state.best_step == 10 and state.best_valid_nll == 4.0
    records = [json.loads(l) for l in (out / "train.log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25]
    assert [r.get("best", False) for r in records] == [True, True, False, False, False]


def parameter_change(a: dict, b: dict) -> float:
    return float(torch.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a)))


@pytest.mark.parametrize("clip_norm", [1e-3, 3e-3])
def test_gradients_are_clipped_to_the_global_norm(tmp_path, clip_norm):
    """The paper recipe: Adadelta's second step moves the weights by about the gradient itself when the gradient is far
    below sqrt(eps) (its accumulators are still ~eps): a clipped step moves them by ~clip_norm in
    total, an unclipped one by orders of magnitude more."""
    steps = {}
    for n in (1, 2):
        out = tmp_path / f"{clip_norm}-{n}"
        train(A_MAN_TABLE, out, TrainConfig(recipe="paper", max_steps=n, clip_norm=clip_norm, **QUICK))
        steps[n] = checkpoint_state(out)["model"]
    assert parameter_change(steps[1], steps[2]) == pytest.approx(clip_norm, rel=0.05)
    unclipped = {}
    for n in (1, 2):
        out = tmp_path / f"none-{clip_norm}-{n}"
        train(A_MAN_TABLE, out, TrainConfig(recipe="paper", max_steps=n, clip_norm=1e9, **QUICK))
        unclipped[n] = checkpoint_state(out)["model"]
    assert parameter_change(unclipped[1], unclipped[2]) > 10 * clip_norm  # about 0.08 here


def test_duplicate_pairs_count_once_even_when_not_adjacent(tmp_path):
    """A source's targets need not be sorted: a pair repeated after another target of the same source
    is still one pair (for the vocabulary counts, the cache and training)."""
    from phrase_scorer.data.phrase_pairs import count_words, unique_pairs

    table = tmp_path / "t.txt"
    table.write_text("a man ||| un homme ||| 1 1 1 1\n"
                     "a man ||| l' homme ||| 1 1 1 1\n"
                     "a man ||| un homme ||| 1 1 1 1\n"   # the first pair again, not adjacent
                     "a man ||| l' homme ||| 0.5 1 1 1\n"  # the second, with other scores
                     "dog ||| chien ||| 1 1 1 1\n"
                     "dog ||| un chien ||| 1 1 1 1\n"
                     "dog ||| chien ||| 1 1 1 1\n")
    pairs = [(" ".join(s), " ".join(t)) for s, t in unique_pairs(table)]
    assert pairs == [("a man", "un homme"), ("a man", "l' homme"), ("dog", "chien"), ("dog", "un chien")]
    source_counts, target_counts, n = count_words(table)
    assert n == 4 and source_counts["man"] == 2 and target_counts["homme"] == 2 and target_counts["chien"] == 2
    from phrase_scorer.data.cache import PairSet
    from phrase_scorer.data.phrase_pairs import build_cache
    from phrase_scorer.vocab import Vocabulary

    meta = build_cache(table, tmp_path / "cache", Vocabulary.from_counts(source_counts, 10),
                       Vocabulary.from_counts(target_counts, 10), valid_fraction=0.0, seed=1)
    assert meta.num_pairs == {"train": 4, "valid": 0}
    assert len(PairSet(tmp_path / "cache", "train")) == 4


def test_a_trained_model_is_not_overwritten(tmp_path):
    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK))
    with pytest.raises(PhraseScorerError, match="already holds a model.*resume=True.*overwrite=True"):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK))
    before = (out / "model.pt").stat().st_mtime_ns
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=5, **QUICK), overwrite=True)
    assert (out / "model.pt").stat().st_mtime_ns != before
    with pytest.raises(PhraseScorerError,
                       match="cannot resume: batch_size changed since the interrupted run \\(batch_size: 16 -> 32\\)"):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=10, **{**QUICK, "batch_size": 32}), resume=True,
              explicit={"batch_size", "max_steps"})
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("x")
    with pytest.raises(PhraseScorerError, match="not empty and holds no phrase-scorer model"):
        train(EXAMPLE_TABLE, other, TrainConfig(max_steps=5, **QUICK))
    with pytest.raises(PhraseScorerError,
                       match="cannot resume: table changed since the interrupted run \\(table.size: "):
        train(A_MAN_TABLE, out, TrainConfig(max_steps=10, **QUICK), resume=True, explicit={"max_steps"})
    with pytest.raises(PhraseScorerError, match="not empty and holds no phrase-scorer model"):
        # --resume never takes a foreign folder
        train(EXAMPLE_TABLE, other, TrainConfig(max_steps=5, **QUICK), resume=True)


def test_resume_with_nothing_to_resume_starts_afresh(tmp_path, caplog):
    """A job re-run blindly with --resume: no folder, or one a kill left before config.json."""
    import logging

    with caplog.at_level(logging.INFO, logger="phrase_scorer"):
        state = train(EXAMPLE_TABLE, tmp_path / "fresh", TrainConfig(max_steps=40, **QUICK), resume=True)
    assert state.step == 40
    assert "nothing to resume" in caplog.text and "starting afresh" in caplog.text
    train(EXAMPLE_TABLE, tmp_path / "plain", TrainConfig(max_steps=40, **QUICK))
    assert_same_state(tmp_path / "plain", tmp_path / "fresh")
    killed = tmp_path / "killed"  # a first attempt killed while it wrote the pair cache and a vocabulary
    (killed / "cache.part").mkdir(parents=True)
    (killed / "vocab.target.json.0badc0de.part").write_text("{")  # files are written whole, then renamed
    state = train(EXAMPLE_TABLE, killed, TrainConfig(max_steps=40, **QUICK), resume=True)
    assert state.step == 40
    assert_same_state(tmp_path / "plain", killed)


def test_weights_that_disagree_with_the_config_are_refused(tmp_path, tiny_model):
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(tiny_model, copy, ignore=shutil.ignore_patterns("cache"))
    config = json.loads((copy / "config.json").read_text())
    config["model"]["hidden_dim"] = 33
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PhraseScorerError, match="shape .* config.json and the vocabularies call for"):
        ModelDirectory(copy).load()
