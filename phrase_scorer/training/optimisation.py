"""The optimiser and its learning rate: the recipe's optimiser, loss scaling for fp16 training,
the warm-up and its inverse-square-root decay, and the schedule that lowers the rate on
validation plateaus."""

from __future__ import annotations

import logging

import torch

from phrase_scorer.config import TrainConfig

log = logging.getLogger(__name__)


def make_optimizer(config: TrainConfig, parameters) -> torch.optim.Optimizer:
    """The recipe's optimiser over ``parameters`` (``config`` resolved)."""
    assert config.lr is not None  # resolved: the recipe fills it
    if config.optimizer == "adadelta":
        return torch.optim.Adadelta(parameters, lr=config.lr, rho=config.adadelta_rho, eps=config.adadelta_eps)
    return torch.optim.Adam(parameters, lr=config.lr)


def make_grad_scaler(precision: str):
    """Loss scaling for fp16 training (``precision`` as resolved; fp16 happens only on a GPU)."""
    return torch.amp.GradScaler("cuda", enabled=precision == "fp16")


def decay_on_plateau(config: TrainConfig, state) -> None:
    """After ``lr_patience`` validations without improvement (``state.lr_bad_validations``), the
    rate ``state.lr`` times ``lr_decay``, never below ``min_lr``."""
    # resolved: the recipe fills them
    assert config.lr_decay is not None and config.lr_patience is not None and config.min_lr is not None
    if config.lr_decay >= 1.0 or state.lr_bad_validations < config.lr_patience:
        return
    lr = max(config.min_lr, state.lr * config.lr_decay)
    if lr < state.lr:
        log.info("no improvement in %d validations: learning rate %.3g -> %.3g", state.lr_bad_validations, state.lr, lr)
        state.lr = lr
    state.lr_bad_validations = 0


def warmup_factor(warmup: int, update: int) -> float:
    """The share of the rate at ``update`` (1, 2, ...) of a schedule with ``warmup`` updates of
    linear warm-up, then 1 / sqrt(update / warmup) (Vaswani et al. 2017); 1 without warm-up."""
    if warmup <= 0:
        return 1.0
    update = max(update, 1)
    return min(update / warmup, (warmup / update) ** 0.5)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
