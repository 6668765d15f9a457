"""What a training run saves to resume: where it stands (:class:`TrainState`) with the weights,
the optimiser and the loss scaler (``checkpoint.pt``), and the weights of its last validations
(``recent/``) for averaging."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from phrase_scorer import __version__
from phrase_scorer.runtime import distributed
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.training.stopping import saved_stop_reason
from phrase_scorer.model_dir import (
    CHECKPOINT, RECENT_WEIGHTS, TRAINED_AS, ModelDirectory, check_state_matches, check_trained_as,
    recent_weight_files, safe_torch_load,
)


@dataclass
class TrainState:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    pairs_seen: int = 0
    best_valid_nll: float = math.inf  # at the best step (by valid_metric)
    best_valid_bleu: float = -math.inf  # at the best step, when BLEU is measured
    best_step: int = 0
    best_by: str = ""  # what chose it (training/validation.py, chosen_by): BLEU, validation or training NLL
    bad_validations: int = 0
    lr: float = 0.0  # the learning rate now (the recipe's, times its decays); 0: not yet set
    lr_bad_validations: int = 0  # validations without improvement since the rate last changed
    train_seconds: float = 0.0
    finished: bool = False
    stop_reason: str = ""  # why it stopped: a Text naming the limit reached (phrase_scorer.training.stopping)
    device: str = ""  # where the last steps ran (cpu, cuda:<GPU name>); a resumed run may move
    precision: str = ""  # and in which precision (fp32, bf16, fp16)


def load_checkpoint(directory: ModelDirectory, model, optimizer, scaler) -> TrainState:
    """Load ``checkpoint.pt`` into the model, the optimiser and the scaler; its record of the model
    it was trained as must be the directory's (a checkpoint written before it was recorded has none)."""
    path = directory.file(CHECKPOINT)
    checkpoint = safe_torch_load(path)
    try:
        check_state_matches(model, checkpoint["model"], path)
        check_trained_as(checkpoint.get(TRAINED_AS), directory.trained_as(), path)  # same shapes, another model?
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
        known = {f.name for f in fields(TrainState)}
        state = TrainState(**{k: v for k, v in checkpoint["state"].items() if k in known})
        state.stop_reason = saved_stop_reason(state.stop_reason)
        return state
    except (KeyError, TypeError, ValueError) as exc:
        raise PhraseScorerError(f"checkpoint is damaged ({exc})", path=path,
                                hint=Text("start again with ", setting("overwrite", True))) from None


def save_checkpoint(directory: ModelDirectory, model, optimizer, scaler, state: TrainState) -> None:
    """``checkpoint.pt`` (rank 0 alone writes it), with the record of the model it is trained as
    (:meth:`~phrase_scorer.model_dir.ModelDirectory.save_weights` adds it)."""
    if not distributed.world().is_main:
        return
    directory.save_weights(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else {},
            "state": {**asdict(state), "stop_reason": str(state.stop_reason)},  # a Text saved as its plain text
            "package_version": __version__,
        },
        CHECKPOINT,
    )


def keep_recent_weights(directory: ModelDirectory, model, step: int, keep: int) -> None:
    """The weights of this validation into ``recent/``, which keeps the last ``keep`` of them."""
    recent = directory.path / RECENT_WEIGHTS
    recent.mkdir(exist_ok=True)
    directory.save_weights(model.state_dict(), f"{RECENT_WEIGHTS}/step-{step}.pt")
    for old in recent_weight_files(recent)[:-keep]:
        old.unlink()
