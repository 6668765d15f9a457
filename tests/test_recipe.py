"""Training recipes: the settings they resolve to, how config.json keeps them, what --resume
accepts, dropout only in training, label smoothing, the validation metric and the held-out share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR
from phrase_scorer.config import RECIPES, RNNSEARCH_PRESETS, TrainConfig, valid_share
from phrase_scorer.data.sentence_pairs import SentenceCorpus
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import load_model
from phrase_scorer.models.architectures import build_model
from phrase_scorer.training.run import train

QUICK = dict(preset="tiny", valid_pairs=200, valid_every=20, batch_size=16, seed=11)


def saved_training(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())["training"]


def test_defaults_resolve_to_the_modern_recipe_and_single_settings_override_it():
    config = TrainConfig(lr=5e-4).resolved()
    modern = RECIPES["modern"]
    assert config.recipe == "modern" and config.optimizer == "adam" == modern.optimizer
    assert config.lr == 5e-4  # given: kept
    assert (config.dropout, config.label_smoothing, config.loss, config.init) == (
        modern.dropout, modern.label_smoothing, modern.loss, modern.init)
    paper = TrainConfig(recipe="paper").resolved()
    assert (paper.optimizer, paper.lr, paper.dropout, paper.label_smoothing, paper.loss, paper.init,
            paper.lr_decay) == ("adadelta", 1.0, 0.0, 0.0, "pair", "paper", 1.0)
    assert TrainConfig().resolved(corpus=True).valid_metric == "bleu"
    assert TrainConfig().resolved(corpus=False).valid_metric == "nll"
    with pytest.raises(PhraseScorerError, match="recipe"):
        TrainConfig(recipe="nonsense")
    with pytest.raises(PhraseScorerError, match="optimizer takes"):
        TrainConfig(optimizer="sgd")


def test_config_json_records_every_resolved_setting_and_reads_back(tmp_path):
    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=2, dropout=0.3, **QUICK))
    saved = saved_training(out)
    assert saved["recipe"] == "modern" and saved["dropout"] == 0.3
    for name in TrainConfig.RECIPE_SETTINGS + ("valid_metric",):
        assert saved[name] is not None, name  # nothing left for a later version's defaults to decide
    assert TrainConfig.from_dict(saved) == TrainConfig(max_steps=2, dropout=0.3, **QUICK).resolved()


def test_a_config_saved_before_recipes_reads_as_the_paper_recipe():
    old = {"preset": "tiny", "batch_size": 64, "adadelta_rho": 0.95, "adadelta_eps": 1e-6, "clip_norm": 1.0}
    config = TrainConfig.from_dict(old).resolved(corpus=True)
    assert (config.recipe, config.optimizer, config.dropout, config.valid_metric) == ("paper", "adadelta", 0.0, "nll")


def test_resume_refuses_another_recipe_or_optimiser_setting_and_names_it(tmp_path):
    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=4, **QUICK))
    with pytest.raises(PhraseScorerError, match="cannot resume: recipe"):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=8, **{**QUICK, "recipe": "paper"}), resume=True,
              explicit={"max_steps", "recipe"})
    with pytest.raises(PhraseScorerError, match="cannot resume: lr "):
        train(EXAMPLE_TABLE, out, TrainConfig(max_steps=8, lr=0.01, **QUICK), resume=True, explicit={"max_steps", "lr"})
    state = train(EXAMPLE_TABLE, out, TrainConfig(max_steps=8, **QUICK), resume=True, explicit={"max_steps"})
    assert state.step == 8


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch", "transformer"])
def test_dropout_acts_in_training_only(arch):
    """A model with a training dropout rate gives random log p in training mode, and in eval
    mode exactly the scores of the same weights without dropout."""
    from phrase_scorer.config import ARCH_PRESETS

    config = ARCH_PRESETS[arch]["tiny"]
    torch.manual_seed(0)
    model = build_model(config, 40, 50)
    model.reset_parameters("glorot")
    src = torch.randint(3, 40, (4, 6))
    tgt = torch.randint(3, 50, (4, 5))
    lengths = torch.tensor([6, 5, 3, 1]), torch.tensor([5, 4, 2, 1])
    model.eval()
    plain = model(src, lengths[0], tgt, lengths[1])
    model.dropout_p = 0.5
    model.train()
    assert not torch.equal(model(src, lengths[0], tgt, lengths[1]), plain)
    model.eval()
    assert torch.equal(model(src, lengths[0], tgt, lengths[1]), plain)


def test_scores_translations_and_samples_are_deterministic_after_dropout_training(tmp_path):
    """A model trained with dropout: every scoring, translating and sampling path gives the
    same result twice, and loads with no dropout."""
    from phrase_scorer.scoring.batch_scorer import BatchScorer
    from phrase_scorer.generation.translate import translate_sentences

    out = tmp_path / "m"
    train(SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR)), out,
          TrainConfig(arch="rnnsearch", max_steps=20, max_length=12, dropout=0.5, **{**QUICK, "valid_pairs": 30}))
    loaded = load_model(out)
    assert loaded.model.dropout_p == 0.0 and not loaded.model.training
    sources = [loaded.source_vocab.encode(["a", "man"]), loaded.source_vocab.encode(["a", "dog", "runs"])]
    targets = [loaded.target_vocab.encode(["un", "homme"]), loaded.target_vocab.encode(["un", "chien", "court"])]
    scorer = BatchScorer(loaded.model)
    first = scorer.score(sources, targets)
    loaded.model.dropout_p = 0.5  # even if a caller sets a rate, the scoring paths run in eval mode
    loaded.model.train()
    assert (scorer.score(sources, targets) == first).all()
    sentences = [["a", "man", "in", "a", "blue", "shirt", "."]]
    loaded.model.train()
    once = translate_sentences(loaded, sentences)[0]
    loaded.model.train()
    again = translate_sentences(loaded, sentences)[0]
    assert (once.words, once.log_prob) == (again.words, again.log_prob)


@torch.no_grad()
def test_label_smoothing_objective_is_the_mix_of_nll_and_the_uniform_cross_entropy():
    torch.manual_seed(0)
    model = build_model(RNNSEARCH_PRESETS["tiny"], 30, 20).double()
    model.eval()
    src, src_len = torch.randint(3, 30, (2, 4)), torch.tensor([4, 2])
    tgt, tgt_len = torch.randint(3, 20, (2, 3)), torch.tensor([3, 1])
    log_p, smoothed = model(src, src_len, tgt, tgt_len, 0.1)
    assert torch.equal(log_p, model(src, src_len, tgt, tgt_len))
    # by hand: the distribution of every step, teacher-forced
    from phrase_scorer.models.base import next_word_labels

    features = model.teacher_forced_features(model.encode(src, src_len), tgt)  # (B, T+1, R)
    all_lp = model.log_probs(features)  # (B, T+1, V')
    labels, valid = next_word_labels(tgt, tgt_len)
    for b in range(2):
        steps = int(valid[b].sum())
        nll = sum(all_lp[b, i, labels[b, i] - 1] for i in range(steps))
        uniform = sum(all_lp[b, i].mean() for i in range(steps))
        assert float(smoothed[b]) == pytest.approx(float(0.9 * nll + 0.1 * uniform), rel=1e-12)
        assert float(log_p[b]) == pytest.approx(float(nll), rel=1e-12)


@torch.no_grad()
def test_glorot_initialisation_leaves_the_attention_saddle():
    """The papers' start has v_a = 0 (every alignment uniform, no gradient to W_a and U_a);
    Glorot's does not."""
    torch.manual_seed(0)
    model = build_model(RNNSEARCH_PRESETS["tiny"], 30, 20)
    assert float(model.alignment.score.weight.abs().max()) == 0.0
    model.reset_parameters("glorot")
    assert float(model.alignment.score.weight.abs().mean()) > 0.01
    recurrent = model.unit.recurrent.weight
    assert torch.allclose(recurrent @ recurrent.T, torch.eye(recurrent.size(0)), atol=1e-5)  # orthogonal, gain 1


def test_modern_recipe_learns_more_than_paper_in_the_same_updates(tmp_path):
    """Same data, batches and steps: the default recipe ends at a lower validation NLL."""
    nll = {}
    for recipe in ("paper", "modern"):
        out = tmp_path / recipe
        train(EXAMPLE_TABLE, out, TrainConfig(recipe=recipe, max_steps=150, **{**QUICK, "valid_every": 150}))
        records = [json.loads(line) for line in (out / "train.log.jsonl").read_text().splitlines()]
        nll[recipe] = records[-1]["valid_nll_token"]
    assert nll["modern"] < nll["paper"] - 0.2, nll


def test_sentence_training_validates_by_bleu_and_keeps_the_best_bleu(tmp_path):
    out = tmp_path / "m"
    state = train(SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR)), out,
                  TrainConfig(arch="rnnsearch", max_steps=60, max_length=12, **{**QUICK, "valid_pairs": 30}))
    records = [json.loads(line) for line in (out / "train.log.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["valid_bleu"] <= 100.0 for r in records)
    best = max(records, key=lambda r: (r["valid_bleu"], -r["step"]))  # the first of equal BLEU is kept
    assert state.best_step == best["step"] and state.best_valid_bleu == best["valid_bleu"]
    assert [r["step"] for r in records if r.get("best")][-1] == best["step"]


def test_bleu_validation_needs_sentence_pairs(tmp_path):
    with pytest.raises(PhraseScorerError, match="valid_metric=bleu"):
        train(EXAMPLE_TABLE, tmp_path / "m", TrainConfig(max_steps=2, valid_metric="bleu", **QUICK))


def test_the_rate_is_decayed_on_a_validation_plateau(tmp_path):
    """lr_patience 1 and a rate so small nothing improves after the first validation: each
    later validation halves it, down to min_lr."""
    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=100, lr=1e-9, lr_patience=1, lr_decay=0.5, min_lr=2e-10,
                                          **QUICK))
    rates = [json.loads(line)["lr"] for line in (out / "train.log.jsonl").read_text().splitlines()]
    assert rates[0] == 1e-9
    assert rates[1:4] == [1e-9, 5e-10, 2.5e-10] and rates[4] == 2e-10


def test_a_small_corpus_trains_with_the_default_validation_share(tmp_path):
    """500 pairs without --dev: at most a tenth is held out (the default asks for 5,000)."""
    assert valid_share(5000, 2000) == pytest.approx(0.1)
    assert valid_share(300, 30460) == pytest.approx(300 / 30460)
    out = tmp_path / "m"
    train(SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR)), out,
          TrainConfig(arch="rnnsearch", preset="tiny", max_steps=2, valid_every=2, batch_size=16))
    cache = json.loads((out / "cache" / "meta.json").read_text())
    held_out = cache["num_pairs"]["valid"]
    assert 25 <= held_out <= 75 and cache["num_pairs"]["train"] == 500 - held_out


def test_average_checkpoints_is_the_mean_of_the_last_weights_and_is_recorded(tmp_path):
    from phrase_scorer.model_dir import average_weights, recent_weight_files

    out = tmp_path / "m"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=100, average_checkpoints=3, **QUICK))
    files = recent_weight_files(out / "recent")
    assert [f.name for f in files] == ["step-60.pt", "step-80.pt", "step-100.pt"]  # the last 3 validations
    states = [torch.load(f, weights_only=True) for f in files]
    mean = average_weights(files)
    for name, tensor in mean.items():
        assert torch.allclose(tensor, sum(s[name] for s in states) / 3, atol=1e-7, rtol=0), name
    assert not torch.equal(states[0]["readout.output.weight"], states[2]["readout.output.weight"])
    averaged = json.loads((out / "config.json").read_text())["averaged"]
    assert averaged["steps"] == [60, 80, 100]
    best = torch.load(out / "model.pt", weights_only=True)
    if averaged["kept_as_model"]:
        assert averaged["valid_nll_token"] < averaged["best_single"]["valid_nll_token"]
        assert all(torch.equal(best[name], mean[name]) for name in mean)
    else:
        assert averaged["valid_nll_token"] >= averaged["best_single"]["valid_nll_token"] - 1e-6
        assert not all(torch.equal(best[name], mean[name]) for name in mean)
