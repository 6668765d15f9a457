"""Validation during training: the held-out pairs' NLL, perplexity and true-vs-shuffled margin,
and the BLEU of the model's translations of the validation sources."""

from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np
import torch

from phrase_scorer.config import TrainConfig, TranslateOptions
from phrase_scorer.data.cache import PairSet
from phrase_scorer.runtime.device import precision_context
from phrase_scorer.models.base import TranslationModel
from phrase_scorer.scoring.batch_scorer import log_probs_by_forward
from phrase_scorer.training.optimisation import decay_on_plateau
from phrase_scorer.vocab import Vocabulary


def derangement(n: int, seed: int) -> np.ndarray:
    """A fixed permutation of range(n) that moves every element (for n > 1)."""
    if n < 2:
        return np.arange(n)
    perm = np.random.default_rng(seed).permutation(n)
    return np.roll(perm, 1)[np.argsort(perm)]


@torch.no_grad()
def validate(model: TranslationModel, pairs: PairSet, device: torch.device, precision: str,
             batch_size: int = 256) -> Dict[str, float]:
    """NLL per pair and per target token (</s> included), perplexity, and the mean margin in
    nats between each held-out pair and the same source with another pair's target, computed in
    the resolved ``precision`` of training."""
    n = len(pairs)
    if n == 0:
        return {}
    was_training = model.training
    model.eval()
    lengths = pairs.all_lengths()  # the validation split is small
    order = np.lexsort((lengths[:, 0], lengths[:, 1]))
    shuffled = derangement(n, 12345)
    true_lp = np.zeros(n)
    false_lp = np.zeros(n)
    phrases = [pairs.pair(int(i)) for i in range(n)]  # the validation split is small
    sources = [phrases[i][0] for i in order]
    with precision_context(device, precision):
        true_lp[order] = log_probs_by_forward(model, sources, [phrases[i][1] for i in order], batch_size)
        false_lp[order] = log_probs_by_forward(model, sources, [phrases[i][1] for i in shuffled[order]], batch_size)
    model.train(was_training)
    tokens = float(lengths[:, 1].astype(np.int64).sum() + n)
    nll_token = -true_lp.sum() / tokens
    return {
        "valid_nll_pair": float(-true_lp.mean()),
        "valid_nll_token": float(nll_token),
        "valid_ppl": float(math.exp(min(nll_token, 700.0))),
        "valid_margin_pair": float((true_lp - false_lp).mean()),
        "valid_true_beats_shuffled": float((true_lp > false_lp).mean()),
    }


@torch.no_grad()
def validation_bleu(model: TranslationModel, pairs: PairSet, target_vocab: Vocabulary, references: list, beam: int,
                    device: torch.device, precision: str, batch_sentences: int = 64) -> float:
    """BLEU (tokenised, as ``evaluate`` scores Moses' output) of the model's translations of the
    validation sources, by beam search of width ``beam`` (1: greedy) as ``translate`` searches,
    against ``references`` (one string per validation pair)."""
    from phrase_scorer.moses.evaluate import score
    from phrase_scorer.generation.sampling import beam_search_batch

    was_training = model.training
    sources = [pairs.pair(i)[0].tolist() for i in range(len(pairs))]  # the validation split is small
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    hypotheses = [""] * len(sources)
    ratio = TranslateOptions.max_length_ratio
    with precision_context(device, precision):
        for start in range(0, len(order), batch_sentences):
            batch = order[start : start + batch_sentences]
            found = beam_search_batch(model, [sources[i] for i in batch], beam, allow_unk=False, length_normalize=True,
                                      max_length=[max(1, math.ceil(ratio * len(sources[i]))) for i in batch])
            for i, hyps in zip(batch, found):
                hypotheses[i] = " ".join(target_vocab.decode(hyps[0][0])) if hyps else ""
    model.train(was_training)
    return score(hypotheses, references, kind="tokenized").bleu


def improves(valid_metric: str, state, nll: float, bleu: Optional[float]) -> bool:
    """Is this validation the best so far (``state``: a TrainState), by ``valid_metric``: BLEU
    where it was measured, else the NLL per token?"""
    if valid_metric == "bleu" and bleu is not None:
        return bleu > state.best_valid_bleu + 1e-9
    return nll < state.best_valid_nll - 1e-6


# What chose the best step (TrainState.best_by), as the training's summary names it
BY_BLEU, BY_VALID_NLL, BY_TRAIN_NLL = "validation BLEU", "validation NLL", "training NLL"


def chosen_by(valid_metric: str, bleu: Optional[float], held_out: bool) -> str:
    """The measure :func:`improves` compares: BLEU where it is the metric and was measured, else
    the NLL per token of the validation pairs (``held_out``) or, with none, of the training."""
    if valid_metric == "bleu" and bleu is not None:
        return BY_BLEU
    return BY_VALID_NLL if held_out else BY_TRAIN_NLL


def record_validation(config: TrainConfig, state, nll: float, bleu: Optional[float], held_out: bool = True) -> bool:
    """The policy of a validation's outcome, kept in ``state`` (a TrainState): the best so far by
    ``valid_metric`` (:func:`improves`) becomes the best (its NLL, BLEU and step, and the measure
    that chose it, :func:`chosen_by`; the counts of validations without improvement start again);
    any other counts as one more validation without improvement, for early stopping
    (``patience``) and the rate's decay on plateaus. ``nll`` is the validation pairs' NLL per
    token, or the training's where none are ``held_out``. Returns whether it is the best."""
    assert config.valid_metric is not None  # resolved: by the data's kind where not given
    if improves(config.valid_metric, state, nll, bleu):
        state.best_valid_nll, state.best_valid_bleu, state.best_step = (nll, -math.inf if bleu is None else bleu,
                                                                         state.step)
        state.best_by = chosen_by(config.valid_metric, bleu, held_out)
        state.bad_validations = state.lr_bad_validations = 0
        return True
    state.bad_validations += 1
    state.lr_bad_validations += 1
    decay_on_plateau(config, state)
    return False


def best_summary(state) -> str:
    """The training's best step, named by the measure that chose it (``state``: a TrainState):
    ``best validation BLEU 23.40 at step 10 (NLL 1.2345 per token)``, ``best validation NLL
    1.2345 per token at step 10``, or the training NLL where no pairs were held out. A state
    saved before it recorded the measure says NLL, as it did."""
    if state.best_by == BY_BLEU and math.isfinite(state.best_valid_bleu):
        return (f"best {BY_BLEU} {state.best_valid_bleu:.2f} at step {state.best_step} "
                f"(NLL {state.best_valid_nll:.4f} per token)")
    measure = BY_TRAIN_NLL if state.best_by == BY_TRAIN_NLL else BY_VALID_NLL
    return f"best {measure} {state.best_valid_nll:.4f} per token at step {state.best_step}"
