"""The training loop: batches, updates, validations and checkpoints until a stopping rule holds.

:class:`TrainingLoop` runs what :func:`~phrase_scorer.training.run.train` set up (:class:`LoopParts`:
the network, its optimiser, where it runs, the batches and the validation data). Each policy has
its own module: when to stop (:mod:`~phrase_scorer.training.stopping`), what a validation measures
and what counts as the best (:mod:`~phrase_scorer.training.validation`), what a checkpoint holds
(:mod:`~phrase_scorer.training.checkpoints`), the rate's schedule
(:mod:`~phrase_scorer.training.optimisation`) and checkpoint averaging
(:mod:`~phrase_scorer.training.averaging`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np
import torch

from phrase_scorer.errors import setting
from phrase_scorer.config import TrainConfig
from phrase_scorer.data.batches import BatchSampler, hash_key
from phrase_scorer.data.cache import PairSet
from phrase_scorer.model_dir import BEST_WEIGHTS, ModelDirectory
from phrase_scorer.models.base import TranslationModel
from phrase_scorer.runtime import distributed
from phrase_scorer.runtime.device import precision_context
from phrase_scorer.runtime.progress import duration, step_bar
from phrase_scorer.training.averaging import average_recent_weights
from phrase_scorer.training.checkpoints import TrainState, keep_recent_weights, save_checkpoint
from phrase_scorer.training.optimisation import set_learning_rate, warmup_factor
from phrase_scorer.training.prefetch import Prefetcher
from phrase_scorer.training.stopping import StopRequests, TrainingInterrupted, stop_reason
from phrase_scorer.training.validation import (
    best_summary, improves, record_validation, validate, validation_bleu,
)
from phrase_scorer.vocab import Vocabulary

log = logging.getLogger(__name__)


@dataclass
class LoopParts:
    """What the loop trains, where, and on what."""

    model: TranslationModel
    optimizer: torch.optim.Optimizer
    scaler: Any  # torch.amp.GradScaler (disabled outside fp16)
    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    sampler: BatchSampler
    train_pairs: PairSet
    valid_pairs: PairSet
    train_module: Optional[torch.nn.Module] = None  # the DistributedDataParallel wrapper under torchrun
    target_vocab: Optional[Vocabulary] = None  # for the BLEU of validation translations
    references: Optional[list] = None  # the validation references, when BLEU is measured


@dataclass
class LoadedBatch:
    """This rank's part of one global batch, as tensors ready to go to the device."""

    epoch: int
    batch_in_epoch: int  # the position after this batch
    global_pairs: int  # pairs in the global batch (all ranks)
    global_tokens: int  # target tokens in the global batch (</s> included)
    tensors: list  # src (B, S), src_len (B,), tgt (B, T), tgt_len (B,) of this rank's pairs
    weight: float  # 0.0 when this rank has no pair of a short last batch (it runs one pair for nothing)
    tokens: int  # this rank's target tokens (</s> included)


class TrainingLoop:
    ESTIMATE_AFTER_STEPS = 20
    # Batches prepared ahead in a thread while a GPU works. On a CPU the thread would only
    # compete with the training thread for the interpreter and the cores: batches are made inline.
    PREFETCH_BATCHES = {"cuda": 2}

    def __init__(self, parts: LoopParts, directory: ModelDirectory, config: TrainConfig, state: TrainState,
                 new_config: Optional[Dict[str, Any]] = None) -> None:
        self.parts = parts
        self.model, self.optimizer, self.scaler = parts.model, parts.optimizer, parts.scaler
        self.train_module = parts.train_module or parts.model  # the DistributedDataParallel wrapper under torchrun
        self.device, self.precision = parts.device, parts.precision
        self.sampler, self.train_pairs, self.valid_pairs = parts.sampler, parts.train_pairs, parts.valid_pairs
        self.directory, self.config, self.state = directory, config, state
        self.new_config = new_config  # config.json of a new run, not written yet (rank 0)
        current = distributed.world()
        self.world, self.rank = current.size, current.rank
        self.reset_interval()

    def reset_interval(self) -> None:
        # summed on the device and read only at validation time: no host sync per step
        self.interval_loss = torch.zeros((), dtype=torch.float64, device=self.device)  # NLL of this rank's pairs
        self.interval_tokens = 0  # this rank's target tokens
        self.interval_pairs = 0  # pairs of the global batches
        self.interval_start = time.monotonic()

    # stopping ------------------------------------------------------------------------------------

    def stop_reason(self) -> str:
        return stop_reason(self.config, self.state, self.sampler.batches_per_epoch)

    def agree(self, stop_requested: bool) -> bool:
        """Make every rank see the same clock (rank 0's) and the same stop request (any rank's),
        so that all of them take the same decisions after the same step."""
        if self.world == 1:
            return stop_requested
        requested, seconds = distributed.max_over_ranks(
            [float(stop_requested), self.state.train_seconds if self.rank == 0 else 0.0])
        self.state.train_seconds = seconds
        return requested > 0

    # the data ------------------------------------------------------------------------------------

    def positions(self) -> Iterator[Tuple[int, int, np.ndarray]]:
        """(epoch, position after the batch, global batch) from where the state stands, forever."""
        epoch, start = self.state.epoch, self.state.batch_in_epoch
        while True:
            for position, batch in enumerate(self.sampler.epoch(epoch, start), start + 1):
                yield epoch, position, batch
            epoch, start = epoch + 1, 0

    def load(self, item: Tuple[int, int, np.ndarray]) -> LoadedBatch:
        """This rank's part of a global batch as tensors (in the loader thread)."""
        epoch, position, batch = item
        local, weight = distributed.shard(batch), 1.0
        if len(local) == 0:
            local, weight = batch[:1], 0.0
        arrays = self.train_pairs.batch_arrays(local)
        tensors = [torch.from_numpy(a) for a in arrays]
        if self.device.type == "cuda":
            tensors = [t.pin_memory() for t in tensors]
        tokens = int(arrays[3].sum() + len(local)) if weight else 0
        global_tokens = tokens if self.world == 1 else int(self.train_pairs.lengths_of(batch)[:, 1].sum() + len(batch))
        return LoadedBatch(epoch, position, global_pairs=len(batch), global_tokens=global_tokens,
                           tensors=tensors, weight=weight, tokens=tokens)

    # the loop ------------------------------------------------------------------------------------

    def run(self) -> None:
        st, cfg = self.state, self.config
        reason = self.stop_reason()
        if reason:
            if st.step and not st.best_step:  # a stop request's checkpoint, never validated: keep its weights
                self.validate_and_checkpoint()
            st.finished, st.stop_reason = True, reason
            return
        self.model.train()
        bar = step_bar("training", cfg.max_steps, initial=st.step)
        last_tick = time.monotonic()
        with StopRequests() as stop_requests, Prefetcher(self.positions(), self.load,
                                                        self.PREFETCH_BATCHES.get(self.device.type, 0)) as batches:
            try:
                for batch in batches:
                    self.count(batch, self.train_step(batch))
                    bar.update(1)
                    if st.step % 10 == 0 and not bar.disable:  # reading the loss syncs: only for a visible bar
                        bar.set_postfix(
                            loss=f"{float(self.interval_loss) / max(self.interval_pairs, 1) * self.world:.2f}",
                            epoch=st.epoch)
                    now = time.monotonic()
                    st.train_seconds += now - last_tick
                    last_tick = now
                    stop_requested = self.agree(stop_requests.requested)
                    if st.step == self.ESTIMATE_AFTER_STEPS:
                        self.report_speed()
                    if st.step % cfg.valid_every == 0:
                        self.validate_and_checkpoint()
                    if stop_requested:
                        # the step is complete, so the checkpoint resumes exactly here
                        self.save_checkpoint()
                        distributed.barrier()  # no rank leaves before the checkpoint is written
                        raise TrainingInterrupted(st.step, stop_requests.number)
                    reason = self.stop_reason()
                    if reason:
                        self.finish(reason)
                        break
            finally:
                bar.close()

    def count(self, batch: LoadedBatch, loss_sum: torch.Tensor) -> None:
        """Move the state past ``batch``, whose update is done, and add its loss to the interval's."""
        st = self.state
        st.step += 1
        st.epoch, st.batch_in_epoch = batch.epoch, batch.batch_in_epoch
        st.pairs_seen += batch.global_pairs
        self.interval_loss += loss_sum
        self.interval_pairs += batch.global_pairs
        self.interval_tokens += batch.tokens

    def finish(self, reason: str) -> None:
        """Training stops for ``reason``: the last steps validated, the final checkpoint saved,
        the recent weights averaged where asked (:mod:`~phrase_scorer.training.averaging`)."""
        st, cfg = self.state, self.config
        if st.step % cfg.valid_every:
            self.validate_and_checkpoint()
        st.finished, st.stop_reason = True, reason
        self.save_checkpoint()
        if cfg.average_checkpoints > 1 and distributed.world().is_main:
            average_recent_weights(self.model, self.directory, cfg, st, self.measure)
        distributed.barrier()
        log.info("training stopped: %s; %s", reason, best_summary(st))

    def train_step(self, batch: LoadedBatch) -> torch.Tensor:
        """One update on a global batch; returns the summed NLL of this rank's pairs (on the device)."""
        src, src_len, tgt, tgt_len = [t.to(self.device, non_blocking=True) for t in batch.tensors]
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
        if cfg.warmup:  # the rate of this update (resolved: the recipe fills warmup)
            set_learning_rate(self.optimizer, self.state.lr * warmup_factor(cfg.warmup, self.state.step + 1))
        if cfg.dropout:
            # dropout masks depend only on (seed, step, rank), so a resumed run draws the same ones
            torch.manual_seed(hash_key(cfg.seed, self.state.step, self.rank))
        with precision_context(self.device, self.precision):
            if cfg.label_smoothing:
                log_probs, objective = self.train_module(src, src_len, tgt, tgt_len, cfg.label_smoothing)  # (B,) each
            else:
                log_probs = objective = self.train_module(src, src_len, tgt, tgt_len)  # (B,)
        # The mean over the global batch, per pair (as the papers) or per target token: each
        # rank's sum scaled so that the average of the ranks' gradients is the global mean's.
        total = batch.global_pairs if cfg.loss == "pair" else batch.global_tokens
        loss = -objective.sum() * (batch.weight * self.world / total)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        assert cfg.clip_norm is not None  # resolved: the recipe fills it
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return -log_probs.detach().sum().double() * batch.weight

    def report_speed(self) -> None:
        st, cfg = self.state, self.config
        pairs_per_second = st.pairs_seen / max(st.train_seconds, 1e-9) if st.pairs_seen else 0.0
        if not pairs_per_second:
            return
        epoch_hours = len(self.train_pairs) / pairs_per_second / 3600
        log.info("speed: %.0f pairs/s, about %s per epoch of %d pairs", pairs_per_second, duration(epoch_hours * 3600),
                 len(self.train_pairs))
        if self.device.type == "cpu" and cfg.preset == "paper":
            log.warning(
                "the paper preset on CPU trains at %.0f pairs/s: about %.1f hours per epoch. "
                "For a quick model on CPU use %s.", pairs_per_second, epoch_hours, setting("preset", "small"),
            )

    def validate_and_checkpoint(self) -> None:
        """Rank 0 validates (the same computation as one process), logs and saves; every rank
        then takes rank 0's view of the best validation so far."""
        st = self.state
        totals = torch.stack([self.interval_loss, torch.tensor(float(self.interval_tokens), dtype=torch.float64,
                                                                 device=self.device)])
        loss_sum, tokens = distributed.sum_over_ranks(totals).tolist()
        if distributed.world().is_main:
            self.write_config()
            elapsed = time.monotonic() - self.interval_start  # the interval's training, without this validation
            metrics = self.measure()
            record = {
                "step": st.step,
                "epoch": st.epoch,
                "pairs_seen": st.pairs_seen,
                "train_seconds": round(st.train_seconds, 1),
                "train_nll_pair": loss_sum / max(self.interval_pairs, 1),
                "train_nll_token": loss_sum / max(tokens, 1),
                "pairs_per_second": self.interval_pairs / max(elapsed, 1e-9),
                "target_tokens_per_second": tokens / max(elapsed, 1e-9),  # words + </s> of every rank
                "batch_size": self.config.batch_size,
                "processes": self.world,
                "lr": st.lr * warmup_factor(self.config.warmup or 0, st.step),
                **metrics,
            }
            nll = metrics.get("valid_nll_token", record["train_nll_token"])
            if self.config.average_checkpoints > 1:
                keep_recent_weights(self.directory, self.model, st.step, self.config.average_checkpoints)
            if record_validation(self.config, st, nll, metrics.get("valid_bleu"),
                                 held_out="valid_nll_token" in metrics):
                self.directory.save_weights(self.model.state_dict(), BEST_WEIGHTS)
                record["best"] = True
            self.directory.append_log(record)
            bleu = f", BLEU {metrics['valid_bleu']:.2f}" if "valid_bleu" in metrics else ""
            log.info(
                "step %d epoch %d: train NLL %.3f/pair, valid NLL %.3f/pair %.3f/token (ppl %.1f)%s, "
                "true-vs-shuffled margin %.2f nats, %.0f pairs/s%s",
                st.step, st.epoch, record["train_nll_pair"], metrics.get("valid_nll_pair", float("nan")), nll,
                metrics.get("valid_ppl", float("nan")), bleu, metrics.get("valid_margin_pair", float("nan")),
                record["pairs_per_second"], " (best)" if record.get("best") else "",
            )
            self.save_checkpoint()
        # rank 0's view of the best, the rate and the counts, the whole state, copied in place so
        # that every reference to the state (the loop's, the caller's) sees it
        agreed = distributed.broadcast_object(st)
        for name in (f.name for f in fields(st)):
            setattr(st, name, getattr(agreed, name))
        set_learning_rate(self.optimizer, st.lr)
        self.reset_interval()

    def measure(self) -> Dict[str, float]:
        """The validation figures of the model's current weights (BLEU too, for sentence pairs)."""
        metrics = validate(self.model, self.valid_pairs, self.device, self.precision)
        if self.parts.references is not None:
            assert self.parts.target_vocab is not None  # given with the references
            metrics["valid_bleu"] = validation_bleu(self.model, self.valid_pairs, self.parts.target_vocab,
                                                    self.parts.references, self.config.valid_beam, self.device,
                                                    self.precision)
        return metrics

    def improved(self, nll: float, bleu: Optional[float]) -> bool:
        assert self.config.valid_metric is not None  # resolved: by the data's kind where not given
        return improves(self.config.valid_metric, self.state, nll, bleu)

    def write_config(self) -> None:
        """config.json of a new run, before the first file that makes the folder a model (its
        best weights, checkpoint or log): what a failed run leaves before it (vocabularies, the
        pair cache) a re-run replaces without --overwrite."""
        if self.new_config is not None and distributed.world().is_main:
            self.directory.write_config(self.new_config)
            self.new_config = None

    def save_checkpoint(self) -> None:
        self.write_config()
        save_checkpoint(self.directory, self.model, self.optimizer, self.scaler, self.state)
