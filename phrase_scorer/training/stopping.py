"""When training stops: its limits (steps, epochs, time, patience), and stop requests from the
user (Ctrl-C, SIGTERM), honoured after the current step with a checkpoint."""

from __future__ import annotations

import logging
import re
import signal
import threading
from typing import Any, Dict

from phrase_scorer.errors import Text, setting
from phrase_scorer.runtime.distributed import world
from phrase_scorer.runtime.supervisor import RUN_SIGNALS
from phrase_scorer.config import TrainConfig

log = logging.getLogger(__name__)


def stop_reason(config: TrainConfig, state, batches_per_epoch: int) -> str:
    """Why training stops now (``""``: it goes on), from ``state`` (a TrainState)."""
    if config.max_steps is not None and state.step >= config.max_steps:
        return Text("reached ", setting("max_steps", config.max_steps))
    if (config.max_epochs is not None
            and state.epoch + state.batch_in_epoch / max(batches_per_epoch, 1) >= config.max_epochs):
        return Text("reached ", setting("max_epochs", format(config.max_epochs, "g")))
    if config.max_time is not None and state.train_seconds >= config.max_time:
        return Text("reached ", setting("max_time", format(config.max_time, "g") + "s"))
    if state.bad_validations >= config.patience:
        return f"early stopping: no improvement in {config.patience} validations"
    return ""


_REACHED = re.compile(r"reached (max_steps|max_epochs|max_time)=(\S+)")


def saved_stop_reason(saved: str) -> str:
    """A stop reason as a checkpoint saves it (:func:`stop_reason`'s text), naming its limit again
    as a setting; any other text (early stopping) as it is."""
    match = _REACHED.fullmatch(saved) if isinstance(saved, str) else None
    return Text("reached ", setting(match[1], match[2])) if match else saved


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on request after step ``step``, with a checkpoint saved there;
    ``number`` is the signal that asked (SIGINT for Ctrl-C)."""

    def __init__(self, step: int, number: int = signal.SIGINT) -> None:
        super().__init__(step)
        self.step = step
        self.number = int(number)


class StopRequests:
    """Turns the first Ctrl-C (or SIGTERM, SIGHUP) into a request to stop after the current step
    (``number``: the signal that asked); a second one interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self.number = int(signal.SIGINT)
        self._previous: Dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.number = int(signum)
        if world().is_main:  # a terminal's Ctrl-C reaches every rank: one of them says it
            log.warning("stopping after this step; press Ctrl-C again to stop at once (without a checkpoint)")

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            for sig in RUN_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored when we were started (a background job, nohup): it stays so
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
