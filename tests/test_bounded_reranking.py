"""The reranked system's choice with models scoring only the hypotheses that can still win: the
choice `rescore` then `apply-reranker` make on the whole list, for less of the models' work.

The list is the first three sentences (221 lines) of the tuned Multi30k system's 100-best list of
val; the weights are the decoder's tuned ones (as a reranker holds them) plus one for each model
feature."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from conftest import DATA
from phrase_scorer.config import RescoreOptions, RunOptions, ScoringOptions, TranslateSystemOptions, default_bound
from phrase_scorer.rescoring.bounded import BoundedStats, Reranking, best_hypotheses
from phrase_scorer.io.nbest import dense_layout, read_nbest
from phrase_scorer.model_dir import load_model
from phrase_scorer.rescoring.weights import Weights, apply_weights
from phrase_scorer.rescoring.rescore import FeatureModel, feature_names, rescore

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
# LexicalReordering0 (6), Distortion0, LM0, WordPenalty0, PhrasePenalty0, TranslationModel0 (4): tuned values
DECODER_WEIGHTS = [0.0279, 0.0233, -0.1362, 0.0052, 0.0553, 0.0124, 0.0230, 0.0721, -0.1341, 0.0954,
                   0.0636, 0.0258, 0.1262, 0.0044]


@pytest.fixture(scope="module")
def chunk(tmp_path_factory):
    """The list and its source as a chunk's files."""
    work = tmp_path_factory.mktemp("chunk")
    with gzip.open(NBEST, "rb") as f:
        (work / "chunk.nbest").write_bytes(f.read())
    shutil.copy(SOURCE, work / "chunk.src")
    return work


@pytest.fixture(scope="module")
def models(tiny_model, tiny_reverse_model, sentence_models):
    """Models of two architectures and vocabularies: a reverse model, and an ensemble of two."""
    phrase, sentence = load_model(tiny_model), load_model(sentence_models("rnnsearch"))
    return {"ensemble": [FeatureModel("E", phrase, ensemble=True), FeatureModel("E", sentence, ensemble=True)],
            "forward": [FeatureModel("F", sentence)],
            "reverse": [FeatureModel("R", load_model(tiny_reverse_model), reverse=True)]}


def weights_for(models, model_weights) -> Weights:
    layout = dense_layout(next(iter(read_nbest(NBEST))))
    names = feature_names(models)
    return Weights(tuple(layout) + tuple((name, 1) for name in names), DECODER_WEIGHTS + list(model_weights))


def by_hand(models, weights, tmp_path: Path) -> list:
    """rescore, then apply-reranker: the whole list scored by every model (none: the decoder's choice)."""
    rescored, chosen = tmp_path / "rescored.gz", tmp_path / "chosen"
    if models:
        rescore(NBEST, SOURCE, rescored, models, RescoreOptions(window_lines=80), run=RunOptions(overwrite=True))
    else:
        rescored = NBEST
    written = apply_weights(rescored, weights, chosen)
    return chosen.read_text(encoding="utf-8").split("\n")[:written]


@pytest.mark.parametrize("rows, model_weights", [
    (["forward", "reverse"], [0.2, 0.05]),
    (["ensemble", "reverse"], [0.3, 0.05]),
    (["reverse", "ensemble"], [0.05, 0.3]),
])
def test_the_bounded_choice_is_the_whole_lists_for_less_work(chunk, models, tmp_path, rows, model_weights):
    chosen_models = [m for row in rows for m in models[row]]
    weights = weights_for(chosen_models, model_weights)
    expected = by_hand(chosen_models, weights, tmp_path)
    decoder_alone = by_hand([], Weights(weights.layout[:-len(rows)], DECODER_WEIGHTS), tmp_path)
    assert expected != decoder_alone  # the models change choices: the bound has work to do
    stats = BoundedStats()
    bounded = best_hypotheses(chunk / "chunk.nbest", chunk / "chunk.src",
                              Reranking(weights, (), chosen_models, False, ScoringOptions()), stats)
    assert bounded == expected
    assert stats.full == 221 * len(chosen_models) and stats.scored < stats.full  # some hypotheses were out
    everything = BoundedStats()
    assert best_hypotheses(chunk / "chunk.nbest", chunk / "chunk.src",
                           Reranking(weights, (), chosen_models, False, ScoringOptions()), everything,
                           bound=False) == expected
    assert everything.scored == everything.full


def test_a_negative_weight_has_no_bound_and_every_hypothesis_stays_in(chunk, models, tmp_path):
    chosen_models = models["forward"] + models["reverse"]
    weights = weights_for(chosen_models, [0.2, -0.05])  # the reverse feature, scored last, weighted < 0
    stats = BoundedStats()
    bounded = best_hypotheses(chunk / "chunk.nbest", chunk / "chunk.src",
                              Reranking(weights, (), chosen_models, False, ScoringOptions()), stats)
    assert bounded == by_hand(chosen_models, weights, tmp_path)
    assert stats.scored == stats.full


def test_the_bound_is_the_devices_own_by_default():
    """Bounded on a CPU, where a model's time is its arithmetic; not on a GPU, where the staged
    scoring's extra batches cost more launches than the skipped hypotheses save."""
    assert TranslateSystemOptions.bound is None
    assert default_bound("cpu") is True and default_bound("cuda") is False
