"""Weights tied to the model they were trained as, and config.json's version.

Every weights file training writes records the architecture and sizes, the target's reading
order and the SHA-256s of the vocabularies it was trained with (``trained_as``); every load
(``model.pt``, the checkpoint of ``train --resume``, the weights averaged at the end) checks it
against the directory's config and vocabularies. A reverse or a right-to-left model's weights,
of the very same shapes, copied into a forward left-to-right model's directory are refused with
one line; weights written before the record existed (the frozen models) load and score as they
did. A config.json of a newer version than this package reads is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import TRAIN_EN, TRAIN_FR, error_line
from conftest import run_cli as run
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import TRAINED_AS, ModelDirectory, average_weights, load_model

FROZEN = Path(__file__).resolve().parent / "data" / "frozen"
TRAIN = ["--preset", "tiny", "--threads", "1", "--batch-size", "16", "--max-length", "12", "--max-steps", "10",
         "--valid-every", "10", "--valid-pairs", "50", "--seed", "5"]
COPY_WHOLE = "copy the whole model directory, not one file"
SAVED_CONFIG = "use the config.json saved with this model"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three tiny encoder-decoders whose weights have the same shapes: English to French read left
    to right (``forward``), French to English (``reverse``) and English to French read right to
    left (``right_to_left``). The shortlists (500 words) are smaller than either side's words."""
    folder = tmp_path_factory.mktemp("identity")
    made = {}
    for name, corpus, extra in (("forward", (TRAIN_EN, TRAIN_FR), []), ("reverse", (TRAIN_FR, TRAIN_EN), []),
                                ("right_to_left", (TRAIN_EN, TRAIN_FR), ["--right-to-left"])):
        made[name] = folder / name
        result = run("-q", "train", "--corpus", *corpus, *TRAIN, *extra, "-o", made[name])
        assert result.exit_code == 0, result.output
    return made


def shapes(path: Path) -> dict:
    state = torch.load(path, weights_only=True)
    state = state["model"] if "model" in state else state
    return {name: tuple(t.shape) for name, t in state.items() if isinstance(t, torch.Tensor)}


def forward_with(models, tmp_path: Path, other: str, name: str) -> Path:
    """A copy of the forward model whose file ``name`` is the ``other`` model's."""
    copy = tmp_path / "forward"
    shutil.copytree(models["forward"], copy, ignore=shutil.ignore_patterns("cache"))
    shutil.copyfile(models[other] / name, copy / name)
    return copy


def without_record(path: Path) -> None:
    """``path`` as a weights file written before weights recorded what they were trained as."""
    state = torch.load(path, weights_only=True)
    del state[TRAINED_AS]
    torch.save(state, path)


def test_every_weights_file_of_a_run_records_what_it_was_trained_as(models):
    expected = ModelDirectory(models["forward"]).trained_as()
    assert torch.load(models["forward"] / "model.pt", weights_only=True)[TRAINED_AS] == expected
    assert torch.load(models["forward"] / "checkpoint.pt", weights_only=True)[TRAINED_AS] == expected
    assert expected["right_to_left"] is False and expected["arch"] == "encdec"
    assert ModelDirectory(models["right_to_left"]).trained_as()["right_to_left"] is True
    # the premise of the checks below: without the record, the other models' weights would load
    assert shapes(models["forward"] / "model.pt") == shapes(models["reverse"] / "model.pt") \
        == shapes(models["right_to_left"] / "model.pt")


@pytest.mark.parametrize("other, message", [
    ("reverse", "the weights were trained as a reverse model (target to source), but config.json describes a "
                "forward model (source to target)"),
    ("right_to_left", "the weights were trained as a right-to-left model (the target read last word first), but "
                      "config.json describes a left-to-right model"),
])
def test_another_models_weights_copied_into_the_directory_are_refused(models, tmp_path, other, message):
    copy = forward_with(models, tmp_path, other, "model.pt")
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a man ||| un homme\n")
    line = error_line(run("score", "-m", copy, pairs))
    assert line == f"phrase-scorer: error: {copy / 'model.pt'}: {message} ({COPY_WHOLE})"
    without_record(copy / "model.pt")  # the same weights, as a file written before the record: loads as before
    assert load_model(copy).weights_path == copy / "model.pt"


@pytest.mark.parametrize("other, message", [
    ("reverse", "trained as a reverse model (target to source)"),
    ("right_to_left", "trained as a right-to-left model"),
])
def test_another_models_checkpoint_is_refused_on_resume(models, tmp_path, other, message):
    copy = forward_with(models, tmp_path, other, "checkpoint.pt")
    before = (copy / "checkpoint.pt").read_bytes()
    line = error_line(run("-q", "train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", copy, "--resume", "--max-steps", "20"))
    assert f"{copy / 'checkpoint.pt'}: the weights were {message}" in line and COPY_WHOLE in line
    assert (copy / "checkpoint.pt").read_bytes() == before  # nothing trained, nothing written over


def test_another_models_checkpoint_is_refused_when_scoring_from_it(models, tmp_path):
    copy = forward_with(models, tmp_path, "reverse", "checkpoint.pt")
    with pytest.raises(PhraseScorerError, match="trained as a reverse model"):
        ModelDirectory(copy).load(weights="checkpoint.pt")


def test_weights_of_another_model_among_those_averaged_are_refused(models, tmp_path):
    directory = ModelDirectory(models["forward"])
    mine, other = tmp_path / "step-10.pt", tmp_path / "step-20.pt"
    shutil.copyfile(models["forward"] / "model.pt", mine)
    shutil.copyfile(models["right_to_left"] / "model.pt", other)
    assert set(average_weights([mine, mine], directory.trained_as())) == set(shapes(mine))  # the record is no weight
    with pytest.raises(PhraseScorerError, match=f"{other}: the weights were trained as a right-to-left model"):
        average_weights([mine, other], directory.trained_as())


def test_weights_recording_other_vocabularies_are_refused(models, tmp_path):
    """Weights of a model trained with other words (its record says so; the shapes are the same)."""
    copy = forward_with(models, tmp_path, "forward", "model.pt")
    state = torch.load(copy / "model.pt", weights_only=True)
    state[TRAINED_AS]["vocab_sha256"] = {"source": "0" * 64, "target": "1" * 64}
    torch.save(state, copy / "model.pt")
    with pytest.raises(PhraseScorerError, match=r"trained with other vocabularies \(they do not match "
                                                r"vocab\.source\.json and vocab\.target\.json\)"):
        load_model(copy)


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(arch="rnnsearch"), "trained as a rnnsearch model, but config.json describes an encdec model"),
    (lambda r: r["sizes"].update(hidden_dim=64), r"trained with other sizes \(hidden_dim 64, config.json 32\)"),
    (lambda r: r.update(subwords_sha256={"source": "0" * 64}), "trained with another subword segmentation"),
    (lambda r: r.update(right_to_left="no"), r"damaged: its record of the model the weights were trained as"),
    (lambda r: r.clear(), None),  # a record without a setting compares none
])
def test_each_part_of_the_record_is_checked(models, edit, message):
    from phrase_scorer.model_dir import check_trained_as

    expected = ModelDirectory(models["forward"]).trained_as()
    record = json.loads(json.dumps(expected))
    edit(record)
    if message is None:
        check_trained_as(record, expected, "model.pt")
        return
    with pytest.raises(PhraseScorerError, match=message):
        check_trained_as(record, expected, "model.pt")


def test_the_record_keeps_what_load_state_dict_reads_of_the_modules(models):
    state = torch.load(models["forward"] / "model.pt", weights_only=True)
    assert getattr(state, "_metadata", None)  # the modules' versions, as torch.save(model.state_dict()) keeps them


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_a_frozen_model_written_before_the_record_loads_and_scores_as_before(arch):
    model = FROZEN / arch
    raw = (model / "model.pt").read_bytes()
    state = torch.load(model / "model.pt", weights_only=True)
    assert TRAINED_AS not in state
    loaded = load_model(model)
    assert loaded.weights_sha256 == hashlib.sha256(raw).hexdigest()  # what signatures record: unchanged
    assert (model / "model.pt").read_bytes() == raw
    got = loaded.model.state_dict()
    assert got.keys() == state.keys()
    assert all(torch.equal(got[name], state[name]) for name in state)  # every weight, bit for bit
    # the same scores as a model built from the file by hand
    from phrase_scorer.models.architectures import uninitialised_model
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    by_hand = uninitialised_model(loaded.config, len(loaded.source_vocab), len(loaded.target_vocab))
    by_hand.load_state_dict(state)
    by_hand.eval()
    lines = [line.split(" ||| ") for line in (FROZEN / "pairs.txt").read_text().splitlines()]
    sources = [loaded.source_vocab.encode(s.split()) for s, _ in lines]
    targets = [loaded.target_vocab.encode(t.split()) for _, t in lines]
    np.testing.assert_array_equal(BatchScorer(loaded.model).score(sources, targets),
                                  BatchScorer(by_hand).score(sources, targets))


@pytest.mark.parametrize("version, message, hint", [
    (99, "written by a newer phrase-scorer (config version 99, this one reads up to 1)", "upgrade phrase-scorer"),
    (2, "written by a newer phrase-scorer (config version 2, this one reads up to 1)", "upgrade phrase-scorer"),
    (1.5, "damaged: its config version 1.5 is not a whole number from 1", SAVED_CONFIG),
    ("1", "damaged: its config version '1' is not a whole number from 1", SAVED_CONFIG),
    (True, "damaged: its config version True is not a whole number from 1", SAVED_CONFIG),
    (0, "damaged: its config version 0 is not a whole number from 1", SAVED_CONFIG),
    (None, "damaged: it records no config version", SAVED_CONFIG),
])
def test_a_config_of_a_newer_or_unreadable_version_is_refused(tmp_path, version, message, hint):
    copy = tmp_path / "m"
    shutil.copytree(FROZEN / "encdec", copy)
    config = json.loads((copy / "config.json").read_text())
    if version is None:
        del config["version"]
    else:
        config["version"] = version
    (copy / "config.json").write_text(json.dumps(config, indent=2))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a man ||| un homme\n")
    line = error_line(run("score", "-m", copy, pairs))
    assert line == f"phrase-scorer: error: {copy / 'config.json'}: {message} ({hint})"
