"""Checkpoint averaging: the mean of the weights of the last validations, kept when it validates better.

With ``average_checkpoints`` K > 1 the loop keeps the weights of the last K validations
(:func:`~phrase_scorer.training.checkpoints.keep_recent_weights`); when training stops, their mean
is validated and becomes ``model.pt`` if it beats the best single weights by ``valid_metric``.
config.json records the outcome under ``averaged``.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Dict

import torch

from phrase_scorer.config import TrainConfig
from phrase_scorer.model_dir import BEST_WEIGHTS, RECENT_WEIGHTS, ModelDirectory, average_weights, recent_weight_files
from phrase_scorer.training.checkpoints import TrainState
from phrase_scorer.training.validation import improves

log = logging.getLogger(__name__)


def average_recent_weights(model: torch.nn.Module, directory: ModelDirectory, config: TrainConfig, state: TrainState,
                           measure: Callable[[], Dict[str, float]]) -> None:
    """Validate the mean of the kept weights (``measure``: the validation figures of ``model``'s
    current weights); it becomes model.pt when it beats the best single weights by
    ``valid_metric``. ``model`` keeps its trained weights."""
    files = recent_weight_files(directory.path / RECENT_WEIGHTS)[-config.average_checkpoints :]
    if len(files) < 2:
        return
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    averaged = average_weights(files, directory.trained_as())  # each file's record checked
    model.load_state_dict(averaged)
    metrics = measure()
    assert config.valid_metric is not None  # resolved: by the data's kind where not given
    kept = improves(config.valid_metric, state, metrics["valid_nll_token"], metrics.get("valid_bleu"))
    if kept:
        directory.save_weights(averaged, BEST_WEIGHTS)
    model.load_state_dict(trained)
    directory.update_config(averaged={
        "steps": [int(f.stem.split("-")[1]) for f in files], "kept_as_model": kept,
        "valid_nll_token": metrics["valid_nll_token"], "valid_bleu": metrics.get("valid_bleu"),
        "best_single": {"step": state.best_step, "valid_nll_token": state.best_valid_nll,
                        "valid_bleu": None if state.best_valid_bleu == -math.inf else state.best_valid_bleu},
    })
    log.info("mean of the weights of steps %s: valid NLL %.4f/token%s; %s", ", ".join(f.stem[5:] for f in files),
             metrics["valid_nll_token"], f", BLEU {metrics['valid_bleu']:.2f}" if "valid_bleu" in metrics else "",
             "kept as model.pt" if kept else f"the weights of step {state.best_step} stay model.pt")
