"""The files of a model directory: the vocabularies tied to the weights, config.json's sizes
checked at load, and what `train` leaves behind when it fails or cannot produce a model."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR, error_line, start_halted
from conftest import run_cli as run

PAIRS = "a man ||| un homme\nthe dog ||| le chien\na man in a red shirt ||| un homme en chemise rouge\n"
TINY = ["--preset", "tiny", "--threads", "1", "--batch-size", "16"]


def copy_model(tiny_model: Path, folder: Path) -> Path:
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("cache"))
    return folder


def scores(model: Path, tmp_path: Path) -> str:
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(PAIRS)
    result = run("score", "-m", model, pairs)
    assert result.exit_code == 0, result.output
    return result.stdout


def edit_config(model: Path, edit) -> None:
    config = json.loads((model / "config.json").read_text())
    edit(config)
    (model / "config.json").write_text(json.dumps(config, indent=2))


# --- the vocabularies belong to the weights ------------------------------------------------------


@pytest.mark.parametrize("swap", ["source and target exchanged", "another model's order of the same words"])
def test_vocabularies_swapped_for_others_of_the_same_size_are_refused(tmp_path, tiny_model, swap):
    model = copy_model(tiny_model, tmp_path / "m")
    source, target = model / "vocab.source.json", model / "vocab.target.json"
    assert len(json.loads(source.read_text())["tokens"]) == len(json.loads(target.read_text())["tokens"])
    if swap == "source and target exchanged":
        source_bytes = source.read_bytes()
        source.write_bytes(target.read_bytes())
        target.write_bytes(source_bytes)
    else:  # the same words ranked otherwise, as another model's shortlist of them
        data = json.loads(source.read_text())
        data["tokens"] = data["tokens"][:3] + data["tokens"][3:][::-1]
        source.write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(PAIRS)
    line = error_line(run("score", "-m", model, pairs))
    assert f"{source}: is not the vocabulary these weights were trained with" in line
    assert "SHA-256" in line and "put back the vocabulary saved with this model" in line


def test_vocabulary_hashes_are_recorded_and_a_directory_without_them_loads_as_before(tmp_path, tiny_model):
    """config.json records both vocabularies' SHA-256; a model directory written before it did
    (no `vocab_sha256`) loads unchanged and scores exactly as before; a re-indented vocabulary
    (the same words) keeps its hash."""
    from phrase_scorer.vocab import Vocabulary

    recorded = json.loads((tiny_model / "config.json").read_text())["vocab_sha256"]
    assert recorded == {side: Vocabulary.load(tiny_model / f"vocab.{side}.json").sha256()
                        for side in ("source", "target")}
    expected = scores(tiny_model, tmp_path)
    old = copy_model(tiny_model, tmp_path / "old")
    edit_config(old, lambda c: c.pop("vocab_sha256"))
    assert scores(old, tmp_path) == expected
    reindented = copy_model(tiny_model, tmp_path / "reindented")
    vocab = reindented / "vocab.target.json"
    vocab.write_text(json.dumps(json.loads(vocab.read_text()), indent=4, ensure_ascii=False))
    assert scores(reindented, tmp_path) == expected


# --- config.json's sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("hidden_dim", -5), ("hidden_dim", "32"), ("embedding_dim", 2.5), ("output_rank", True),
    ("hidden_dim", 10**12), ("source_shortlist", 10**9), ("maxout_pieces", 0), ("init_std", None),
])
def test_a_config_size_of_the_wrong_type_or_range_is_refused_naming_config_json_and_the_key(tmp_path, tiny_model,
                                                                                              key, value):
    model = copy_model(tiny_model, tmp_path / "m")
    edit_config(model, lambda c: c["model"].__setitem__(key, value))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(PAIRS)
    line = error_line(run("score", "-m", model, pairs))
    assert f"{model / 'config.json'}: model.{key} is {value!r}; it must be a" in line, line


@pytest.mark.parametrize("key, value", [("source_vocab_size", "503"), ("target_vocab_size", -1)])
def test_a_vocabulary_size_of_the_wrong_type_is_refused_naming_config_json_and_the_key(tmp_path, tiny_model, key,
                                                                                       value):
    model = copy_model(tiny_model, tmp_path / "m")
    edit_config(model, lambda c: c.__setitem__(key, value))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text(PAIRS)
    line = error_line(run("score", "-m", model, pairs))
    assert f"{model / 'config.json'}: {key} is {value!r}; it must be a whole number" in line, line


def test_resuming_with_a_training_setting_of_the_wrong_type_is_refused_naming_the_key(tmp_path, tiny_model):
    model = tmp_path / "m"
    shutil.copytree(tiny_model, model)
    edit_config(model, lambda c: c["training"].__setitem__("batch_size", "64"))
    line = error_line(run("train", EXAMPLE_TABLE, "-o", model, "--resume", "--max-steps", 500))
    assert f"{model / 'config.json'}: training.batch_size is '64'; it must be a whole number" in line, line


# --- what a failed train leaves ------------------------------------------------------------------------


def corpus_args(*extra):
    return ["train", "--corpus", TRAIN_EN, TRAIN_FR, *TINY, "--max-steps", 4, "--valid-every", 4, *extra]


def test_train_without_validation_pairs_keeps_the_weights_of_the_lowest_training_nll(tmp_path):
    """`--valid-pairs 0` on sentence pairs (whose default metric, BLEU, needs translations of
    validation pairs) trains on every pair and picks the best weights by the training NLL."""
    out = tmp_path / "m"
    result = run(*corpus_args("--valid-pairs", 0, "-o", out))
    assert result.exit_code == 0, result.output
    assert "no validation pairs" in result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["training"]["valid_metric"] == "nll"
    assert (out / "model.pt").is_file()
    assert len(scores(out, tmp_path).splitlines()) == 3


def test_bleu_validation_without_validation_pairs_is_refused_and_a_rerun_needs_no_overwrite(tmp_path):
    out = tmp_path / "m"
    line = error_line(run(*corpus_args("--valid-pairs", 0, "--valid-metric", "bleu", "-o", out)))
    assert "--valid-metric bleu needs validation pairs, but --valid-pairs 0 held out none of the pairs" in line
    assert not (out / "config.json").exists()
    result = run(*corpus_args("--valid-pairs", 50, "-o", out))  # the fixed command, without --overwrite
    assert result.exit_code == 0, result.output
    assert (out / "model.pt").is_file()


def test_a_train_that_failed_on_a_length_mismatch_leaves_no_model_and_the_fixed_rerun_works(tmp_path):
    """A --dev target with a line more than its source: one line naming it; the folder is not a
    model, so the same command with the right file trains without --overwrite (and --resume
    starts afresh)."""
    out = tmp_path / "m"
    longer = tmp_path / "val.fr"
    longer.write_text(VAL_FR.read_text() + "une ligne de trop\n")
    line = error_line(run(*corpus_args("--dev", VAL_EN, longer, "-o", out)))
    assert f"{longer} line 101: has more lines than {VAL_EN}" in line
    assert not (out / "config.json").exists()
    result = run(*corpus_args("--dev", VAL_EN, VAL_FR, "-o", out))
    assert result.exit_code == 0, result.output
    assert (out / "model.pt").is_file() and json.loads((out / "config.json").read_text())["corpus"]


def test_a_first_run_killed_before_its_first_checkpoint_is_not_a_model(tmp_path):
    """SIGKILL during the first steps (the vocabularies and the pair cache written, no
    checkpoint): running the same command again trains, without --overwrite."""
    out = tmp_path / "m"
    args = ["train", EXAMPLE_TABLE, *TINY, "--valid-pairs", 100, "--valid-every", 10, "--max-steps", 10, "-o", out]
    proc = start_halted("step:3", args, tmp_path / "ready")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    assert (out / "vocab.source.json").exists() and not (out / "checkpoint.pt").exists()
    assert not (out / "config.json").exists()
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert (out / "model.pt").is_file()


# --- train never ends with exit 0 and no model.pt ------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "0s", "0m"])
def test_max_time_zero_is_refused_before_anything_is_written(tmp_path, value):
    out = tmp_path / "m"
    result = run("train", EXAMPLE_TABLE, *TINY, "--max-time", value, "-o", out)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--max-time'" in result.stderr and "positive duration" in result.stderr
    assert not out.exists()


def test_resuming_a_stopped_run_past_its_limit_still_writes_model_pt(tmp_path):
    """A run stopped by Ctrl-C before its first validation has a checkpoint but no model.pt;
    resumed with a limit it has already reached, it validates that checkpoint and keeps its
    weights as model.pt instead of finishing without a model."""
    out = tmp_path / "m"
    args = ["train", EXAMPLE_TABLE, *TINY, "--valid-pairs", 100, "--valid-every", 1000, "-o", out]
    ready = tmp_path / "ready"
    proc = start_halted("step:3", [*args, "--max-steps", 100], ready)
    proc.send_signal(signal.SIGINT)
    ready.unlink()  # go on: the stop request is honoured after this step
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert (out / "checkpoint.pt").exists() and not (out / "model.pt").exists()
    result = subprocess.run([sys.executable, "-m", "phrase_scorer", *map(str, args), "--max-steps", "2", "--resume"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (out / "model.pt").is_file()
    assert len(scores(out, tmp_path).splitlines()) == 3


def test_loading_a_model_draws_no_weights(tiny_model):
    """A model is built uninitialised and its weights loaded: no random draws, no SVDs, and the
    meta-device check of the shapes does not import torch._dynamo (about 2 s at every start)."""
    import subprocess
    import sys

    code = ("import sys, torch; from phrase_scorer.model_dir import load_model; "
            f"torch.manual_seed(0); load_model({str(tiny_model)!r}); after = torch.rand(1).item(); "
            "torch.manual_seed(0); print('torch._dynamo' in sys.modules, after == torch.rand(1).item())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]  # no dynamo; the random generator untouched
