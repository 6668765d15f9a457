"""Training on phrase or sentence pairs, by a recipe (:class:`~phrase_scorer.config.Recipe`).

:func:`train` reads a data source: the unique pairs of a phrase table
(:class:`~phrase_scorer.data.phrase_pairs.PhraseTableData`) or sentence pairs
(:class:`~phrase_scorer.data.sentence_pairs.SentenceCorpus`). It builds (or reuses) the vocabularies and the
pair cache, then optimises batches of 64 pairs (``batch_size``) by the recipe: ``paper`` runs
Adadelta (rho 0.95, eps 1e-6) on the mean log p(y|x) per pair from the papers' initialisations,
as section 4.1.1 of Cho et al.; ``modern`` runs Adam on the label-smoothed log-likelihood per
target token, with dropout, Glorot initialisation and the rate decayed on validation plateaus.
Every ``valid_every`` steps it measures the validation NLL (per pair and per target token), the
perplexity and the margin between true and shuffled pairs, and for sentence pairs the BLEU of
the validation translations; it keeps the best weights by ``valid_metric`` (``model.pt``),
saves a resumable checkpoint (``checkpoint.pt``) and logs a JSON line. Training stops at
``max_steps`` / ``max_epochs`` / ``max_time`` or after
``patience`` validations without improvement. Ctrl-C saves a checkpoint first. The same seed
gives the same model on the same machine, and ``resume`` continues exactly where the checkpoint
left off (or starts afresh when there is nothing to resume, so a preempted job can be re-run
with the same command line).

Under ``torchrun`` (:mod:`phrase_scorer.runtime.distributed`) the processes train one model with
DistributedDataParallel: ``batch_size`` stays the global batch, each rank takes its contiguous
share of every global batch, rank 0 alone writes the directory and validates, and stop
decisions are agreed between ranks. On a GPU the next batches are read and padded in a
background thread; the training loss is summed on the device and read only at validation time.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

import numpy as np
import torch

from phrase_scorer.runtime import distributed
from phrase_scorer.data.sentence_pairs import SentenceCorpus
from phrase_scorer.data.batches import BatchSampler, hash_key
from phrase_scorer.data.cache import PairSet
from phrase_scorer.data.phrase_pairs import PhraseTableData
from phrase_scorer.runtime.device import device_label, precision_context, resolve_device, resolve_precision
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import OutputLock
from phrase_scorer.config import ARCH_PRESETS, AnyModelConfig, ModelConfig, TrainConfig
from phrase_scorer.models.architectures import build_model
from phrase_scorer.models.base import count_parameters
from phrase_scorer.model_dir import (
    BEST_WEIGHTS,
    CACHE,
    CHECKPOINT,
    CONFIG,
    MODEL_FILES,
    MODEL_STATE_FILES,
    RECENT_WEIGHTS,
    SOURCE_VOCAB,
    TARGET_VOCAB,
    ModelDirectory,
    average_weights,
    recent_weight_files,
    vocab_hashes,
)
from phrase_scorer.training.prefetch import Prefetcher
from phrase_scorer.runtime.progress import step_bar
from phrase_scorer.training.validation import improves, validate, validation_bleu
from phrase_scorer.training.checkpoints import TrainState, keep_recent_weights, load_checkpoint, save_checkpoint
from phrase_scorer.training.optimisation import decay_on_plateau, make_grad_scaler, make_optimizer, set_learning_rate
from phrase_scorer.training.stopping import StopRequests, TrainingInterrupted, stop_reason
from phrase_scorer.records import refuse_changed
from phrase_scorer.vocab import Vocabulary

log = logging.getLogger(__name__)


# --- preparing the model directory ------------------------------------------------------------


def prepare_directory(directory: ModelDirectory, resume: bool, overwrite: bool) -> bool:
    """Check what ``directory`` holds against the flags; returns True when resuming.

    ``resume`` with nothing to resume (a job re-run before its first attempt wrote a model, or a
    first attempt) starts afresh and says so, so a scheduler can re-run one command line blindly.
    A folder holding any of a model's files (its config, weights, checkpoint or training log) is a
    model, complete or not: it is replaced only with ``overwrite``. The vocabularies and the pair
    cache alone are what a setup killed before it wrote config.json leaves; they are replaced.
    """
    path = directory.path
    if resume and directory.exists():
        return True
    present = [name for name in MODEL_STATE_FILES if (path / name).exists()]
    if present and not overwrite:
        if directory.exists():
            raise PhraseScorerError(
                "already holds a model", path=path,
                hint="continue it with --resume, start again with --overwrite, or choose another folder",
            )
        raise PhraseScorerError(
            f"holds a model without its config.json ({', '.join(present)})", path=path,
            hint=("--resume cannot continue it; " if resume else "")
            + "start again with --overwrite (replaces them), or choose another folder",
        )
    if resume:
        log.info("nothing to resume in %s: starting afresh", path)
    if path.exists() and any(path.iterdir()) and not present and not overwrite:
        ours = {*MODEL_FILES, CACHE, CACHE + ".part", RECENT_WEIGHTS}
        leftovers = all(p.name in ours or p.name.endswith(".part") for p in path.iterdir())
        if not leftovers:
            raise PhraseScorerError(
                "output folder is not empty and holds no phrase-scorer model", path=path, hint="choose another folder"
            )
    for name in MODEL_FILES:
        (path / name).unlink(missing_ok=True)
    for old in recent_weight_files(path / RECENT_WEIGHTS):
        old.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return False


def preset_config(config: TrainConfig) -> AnyModelConfig:
    """The network of ``config.arch``'s preset ``config.preset``."""
    if config.arch not in ARCH_PRESETS:
        raise PhraseScorerError(f"unknown architecture {config.arch!r}; choose one of {', '.join(ARCH_PRESETS)}")
    presets = ARCH_PRESETS[config.arch]
    if config.preset not in presets:
        raise PhraseScorerError(f"unknown preset {config.preset!r} for {config.arch}; choose one of {', '.join(presets)}")
    return presets[config.preset]


def check_resume_settings(saved: TrainConfig, asked: TrainConfig, explicit: Set[str]) -> TrainConfig:
    """The saved settings, updated with those given again that --resume may change.

    ``explicit`` names the settings the user gave; a differing one that --resume cannot change
    (the model, the data, the optimiser) is an error rather than a silent surprise.
    """
    fixed = sorted(name for name in explicit if name not in TrainConfig.RESUMABLE)
    refuse_changed(
        {name: getattr(saved, name) for name in fixed}, {name: getattr(asked, name) for name in fixed},
        label=lambda name: "--" + name.replace("_", "-"),
        hint="leave them out (the saved ones are used) or start a new run",
    )
    return replace(saved, **{name: getattr(asked, name) for name in TrainConfig.RESUMABLE if name in explicit})


# --- the loop -------------------------------------------------------------------------------------


TrainingData = PhraseTableData | SentenceCorpus  # the data sources training reads


def train(data: TrainingData | os.PathLike | str, output: os.PathLike | str, config: TrainConfig = TrainConfig(), *,
          resume: bool = False, overwrite: bool = False, model_config: Optional[AnyModelConfig] = None,
          explicit: Optional[Set[str]] = None) -> TrainState:
    """Train a model on ``data`` (a phrase table's path, or a data source such as a
    :class:`~phrase_scorer.data.sentence_pairs.SentenceCorpus`) into the directory ``output``; returns the
    final state.

    With ``resume``, the settings saved with the run are used, except those named in
    ``explicit`` (default: those of ``config`` that differ from the defaults), which must be
    among the ones a resumed run may change (stopping criteria, device). With nothing to resume,
    training starts afresh.

    Under ``torchrun`` every process calls this; they train one model together
    (DistributedDataParallel), each on its part of every global batch of ``batch_size`` pairs.
    Rank 0 alone writes the directory (vocabularies, pair cache, checkpoints, log).
    """
    if not isinstance(data, (PhraseTableData, SentenceCorpus)):
        data = PhraseTableData(os.fspath(data))
    if explicit is None:
        default = TrainConfig()
        explicit = {f.name for f in fields(TrainConfig) if getattr(config, f.name) != getattr(default, f.name)}
    output = Path(output)
    started = distributed.init(distributed.device_for_rank(resolve_device(config.device)))
    try:
        if distributed.world().is_main:
            output.parent.mkdir(parents=True, exist_ok=True)
            lock = OutputLock(output.resolve())  # a second run aimed at the same directory is refused
        else:
            lock = contextlib.nullcontext()
        with lock:
            return _train(data, output, config, resume, overwrite, model_config, explicit)
    finally:
        if started:
            distributed.shutdown()


@dataclass
class RunSetup:
    """What rank 0 settles before training (and tells the other ranks)."""

    resuming: bool
    config: TrainConfig
    model_config: Any
    error: str = ""
    # config.json of a new run: written with its first checkpoint (TrainingLoop.write_config), so
    # that a run failing before it has anything to resume leaves no folder a re-run takes for a model
    new_config: Optional[Dict[str, Any]] = None


def prepare_run(data: TrainingData, directory: ModelDirectory, config: TrainConfig, resume: bool, overwrite: bool,
                model_config: Optional[ModelConfig], explicit: Set[str]) -> RunSetup:
    """Prepare the directory: settings, vocabularies and the pair cache (rank 0 only)."""
    output = directory.path
    resuming = prepare_directory(directory, resume, overwrite)
    new_config = None
    if resuming:
        saved = directory.read_config()
        saved_model = directory.model_config(saved)  # its "arch" is the saved run's architecture
        try:
            saved_config = TrainConfig.from_dict({**saved.get("training", {}), "arch": saved_model.arch})
            saved_config = saved_config.resolved(corpus="corpus" in saved)
        except PhraseScorerError as exc:  # a setting of the wrong type or out of its range
            raise PhraseScorerError(exc.message, path=directory.file(CONFIG),
                                    hint="correct it, or start a new run with --overwrite") from None
        except TypeError as exc:
            raise PhraseScorerError(f"config has no valid 'training' section ({exc})", path=directory.file(CONFIG),
                                    hint="start a new run with --overwrite") from None
        config = check_resume_settings(saved_config, config.resolved(corpus="corpus" in saved), explicit)
        if model_config is not None:
            names = ("source_shortlist", "target_shortlist")
            refuse_changed({n: getattr(saved_model, n) for n in names}, {n: getattr(model_config, n) for n in names},
                           label=lambda name: "--" + name.replace("_", "-"), path=output,
                           hint="leave them out (the saved ones are used) or start a new run")
        model_config = saved_model
        source_vocab, target_vocab = directory.vocabularies(saved)
        if data.kind not in saved:
            trained_on = "a sentence corpus (--corpus)" if "corpus" in saved else "a phrase table"
            raise PhraseScorerError(f"the interrupted run trained on {trained_on}", path=output,
                                    hint="resume with the same training data, or start a new run")
        data_info = saved[data.kind]
    else:
        model_config = model_config or preset_config(config)
        config = replace(config, arch=model_config.arch).resolved(corpus=data.kind == "corpus")
        if config.valid_metric == "bleu" and data.kind != "corpus":
            raise PhraseScorerError("--valid-metric bleu needs sentence pairs (--corpus); a phrase table validates by nll")
        source_counts, target_counts, data_info = data.count_words(config)
        source_vocab = Vocabulary.from_counts(source_counts, model_config.source_shortlist)
        target_vocab = Vocabulary.from_counts(target_counts, model_config.target_shortlist,
                                              right_to_left=config.right_to_left)
        source_vocab.save(directory.file(SOURCE_VOCAB))
        target_vocab.save(directory.file(TARGET_VOCAB))
        data_info.update({
            "source_words": len(source_counts),
            "target_words": len(target_counts),
            "source_coverage": coverage(source_counts, source_vocab),
            "target_coverage": coverage(target_counts, target_vocab),
        })
        log.info(
            "shortlists keep %d of %d source words (%.1f%% of tokens) and %d of %d target words (%.1f%%)",
            len(source_vocab) - 3, len(source_counts), 100 * data_info["source_coverage"],
            len(target_vocab) - 3, len(target_counts), 100 * data_info["target_coverage"],
        )
    data.build_cache(directory.cache_dir, source_vocab, target_vocab, data_info, config, keep_existing=resuming)
    config = check_validation_split(directory, data, config, resuming, explicit)
    if not resuming:
        new_config = {
            "preset": config.preset,
            "model": model_config.to_dict(),
            "source_vocab_size": len(source_vocab),
            "target_vocab_size": len(target_vocab),
            "vocab_sha256": vocab_hashes(source_vocab, target_vocab),
            "training": config.to_dict(),
            data.kind: data_info,
        }
    return RunSetup(resuming, config, model_config, new_config=new_config)


def check_validation_split(directory: ModelDirectory, data: TrainingData, config: TrainConfig, resuming: bool,
                           explicit: Set[str]) -> TrainConfig:
    """The run's settings for its validation split. Without validation pairs (``--valid-pairs 0``,
    or none held out of a small corpus) the training NLL picks the best weights: the BLEU of no
    translations cannot, so a BLEU metric that was only the default for sentence pairs becomes
    nll; one asked for (``--valid-metric bleu``) is refused."""
    if config.valid_metric != "bleu" or len(PairSet(directory.cache_dir, "valid")):
        return config
    held_out = ("--dev holds no pair with two non-empty sides" if getattr(data, "dev_source", None)
                else f"--valid-pairs {config.valid_pairs} held out none of the pairs")
    if resuming or "valid_metric" in explicit:
        raise PhraseScorerError(f"--valid-metric bleu needs validation pairs, but {held_out}", path=data.path,
                                hint="give --dev SRC TGT or a larger --valid-pairs, or validate by --valid-metric nll")
    log.info("no validation pairs (%s): the training NLL picks the best weights (--valid-metric nll)", held_out)
    return replace(config, valid_metric="nll")


def agree_on_setup(run: Callable[[], RunSetup]) -> RunSetup:
    """Rank 0 runs ``run``; the others wait for its outcome (an error there is an error everywhere)."""
    if not distributed.world().is_distributed:
        return run()
    if distributed.world().is_main:
        try:
            setup = run()
        except BaseException as exc:
            distributed.broadcast_object(RunSetup(False, TrainConfig(), None, error=str(exc) or type(exc).__name__))
            raise
        return distributed.broadcast_object(setup)
    setup = distributed.broadcast_object()
    if setup.error:
        raise PhraseScorerError(f"rank 0 could not prepare the run: {setup.error}")
    return setup


def _train(data: TrainingData, output: Path, config: TrainConfig, resume: bool, overwrite: bool,
           model_config: Optional[ModelConfig], explicit: Set[str]) -> TrainState:
    directory = ModelDirectory(output)
    setup = agree_on_setup(lambda: prepare_run(data, directory, config, resume, overwrite, model_config, explicit))
    resuming, config, model_config = setup.resuming, setup.config, setup.model_config
    source_vocab = Vocabulary.load(directory.file(SOURCE_VOCAB))
    target_vocab = Vocabulary.load(directory.file(TARGET_VOCAB))
    train_pairs = PairSet(directory.cache_dir, "train")
    valid_pairs = PairSet(directory.cache_dir, "valid")
    if len(train_pairs) == 0:
        raise PhraseScorerError("no pairs left for training after holding out the validation set", path=data.path,
                                hint="lower --valid-pairs")
    log.info("pair cache: %d training pairs, %d validation pairs", len(train_pairs), len(valid_pairs))
    world = distributed.world().size
    if config.batch_size % world:
        raise PhraseScorerError(f"--batch-size {config.batch_size} (the global batch) does not divide among {world} processes",
                                hint=f"use a multiple of {world}")
    log.info("global batch: %d pairs per update (%d process%s x %d pairs)", config.batch_size, world,
             "es" if world > 1 else "", config.batch_size // world)

    device = distributed.device_for_rank(resolve_device(config.device))
    if world > 1 and torch.distributed.get_backend() != distributed.backend_for(device):
        raise PhraseScorerError(f"the run trains on {device.type}, but the processes joined for another device",
                                hint="give --device explicitly under torchrun")
    precision = resolve_precision(device, config.precision)
    torch.manual_seed(config.seed)
    model = build_model(model_config, len(source_vocab), len(target_vocab))
    if config.init != "paper":  # the constructor initialises as the paper does
        model.reset_parameters(config.init)
    model.dropout_p = config.dropout
    model = model.to(device)
    optimizer = make_optimizer(config, model.parameters())
    scaler = make_grad_scaler(precision)
    state = TrainState(lr=config.lr)
    if resuming and directory.file(CHECKPOINT).exists():
        state = load_checkpoint(directory, model, optimizer, scaler)  # every rank loads it
        if state.finished:
            log.info("training had finished (%s); raise a stopping limit to continue", state.stop_reason)
        log.info("resuming at step %d (epoch %d, batch %d)", state.step, state.epoch, state.batch_in_epoch)
        if (state.device, state.precision) != (device_label(device), precision):
            log.warning("the interrupted run trained on %s in %s; it goes on on %s in %s",
                        state.device or "an unrecorded device", state.precision or "an unrecorded precision",
                        device_label(device), precision)
        if distributed.world().is_main:
            directory.truncate_log(state.step)  # records of steps the checkpoint does not include are redone
    elif resuming:
        log.info("no checkpoint yet: starting from step 0 with the saved settings")
    state.device, state.precision = device_label(device), precision
    state.lr = state.lr or config.lr  # a checkpoint saved before the rate was recorded ran at the recipe's
    log.info("model: %s, preset %s, %s parameters, device %s, precision %s", model_config.arch, config.preset, f"{count_parameters(model):,}",
             state.device, precision)

    train_module = model
    if world > 1:
        train_module = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    sampler = BatchSampler(train_pairs, config.batch_size, config.seed, window_batches=data.window_batches)
    references = None
    if config.valid_metric == "bleu":
        references = data.valid_references(valid_pairs, target_vocab)
    loop = TrainingLoop(model, optimizer, scaler, directory, config, state, sampler, train_pairs, valid_pairs, device,
                        precision, train_module=train_module, target_vocab=target_vocab, references=references,
                        new_config=setup.new_config)
    set_learning_rate(optimizer, state.lr)
    loop.run()
    if distributed.world().is_main and not directory.file(BEST_WEIGHTS).exists():  # never a "model" without weights
        raise PhraseScorerError(f"training stopped ({loop.state.stop_reason}) without weights to keep: no validation "
                                "gave a finite NLL", path=directory.file(BEST_WEIGHTS),
                                hint="lower --lr, or raise the stopping limits and resume with --resume")
    return loop.state


def coverage(counts, vocab: Vocabulary) -> float:
    total = sum(counts.values())
    return sum(c for w, c in counts.items() if w in vocab) / total if total else 0.0


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

    def __init__(self, model, optimizer, scaler, directory: ModelDirectory, config: TrainConfig, state: TrainState,
                 sampler: BatchSampler, train_pairs: PairSet, valid_pairs: PairSet, device: torch.device,
                 precision: str = "fp32", train_module: Optional[torch.nn.Module] = None,
                 target_vocab: Optional[Vocabulary] = None, references: Optional[list] = None,
                 new_config: Optional[Dict[str, Any]] = None) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.new_config = new_config  # config.json of a new run, not written yet (rank 0)
        self.target_vocab, self.references = target_vocab, references
        self.train_module = train_module or model  # the DistributedDataParallel wrapper under torchrun
        self.directory, self.config, self.state = directory, config, state
        self.sampler, self.train_pairs, self.valid_pairs = sampler, train_pairs, valid_pairs
        self.device, self.precision = device, precision
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
                    loss_sum = self.train_step(batch)
                    st.step += 1
                    st.epoch, st.batch_in_epoch = batch.epoch, batch.batch_in_epoch
                    st.pairs_seen += batch.global_pairs
                    self.interval_loss += loss_sum
                    self.interval_pairs += batch.global_pairs
                    self.interval_tokens += batch.tokens
                    bar.update(1)
                    if st.step % 10 == 0 and not bar.disable:  # reading the loss syncs: only for a visible bar
                        bar.set_postfix(loss=f"{float(self.interval_loss) / max(self.interval_pairs, 1) * self.world:.2f}",
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
                        raise TrainingInterrupted(st.step)
                    reason = self.stop_reason()
                    if reason:
                        if st.step % cfg.valid_every:
                            self.validate_and_checkpoint()
                        st.finished, st.stop_reason = True, reason
                        self.save_checkpoint()
                        if cfg.average_checkpoints > 1 and distributed.world().is_main:
                            self.average_recent_weights()
                        distributed.barrier()
                        log.info("training stopped: %s; best validation NLL %.4f per token at step %d",
                                 reason, st.best_valid_nll, st.best_step)
                        break
            finally:
                bar.close()

    def train_step(self, batch: LoadedBatch) -> torch.Tensor:
        """One update on a global batch; returns the summed NLL of this rank's pairs (on the device)."""
        src, src_len, tgt, tgt_len = [t.to(self.device, non_blocking=True) for t in batch.tensors]
        cfg = self.config
        self.optimizer.zero_grad(set_to_none=True)
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
        log.info("speed: %.0f pairs/s, about %.1f h per epoch of %d pairs", pairs_per_second, epoch_hours, len(self.train_pairs))
        if self.device.type == "cpu" and cfg.preset == "paper":
            log.warning(
                "the paper preset on CPU trains at %.0f pairs/s: about %.1f hours per epoch. "
                "For a quick model on CPU use --preset small.", pairs_per_second, epoch_hours,
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
                "lr": st.lr,
                **metrics,
            }
            nll = metrics.get("valid_nll_token", record["train_nll_token"])
            if self.config.average_checkpoints > 1:
                keep_recent_weights(self.directory, self.model, st.step, self.config.average_checkpoints)
            if self.improved(nll, metrics.get("valid_bleu")):
                st.best_valid_nll, st.best_valid_bleu, st.best_step, st.bad_validations = (
                    nll, metrics.get("valid_bleu", -math.inf), st.step, 0)
                st.lr_bad_validations = 0
                self.directory.save_weights(self.model.state_dict(), BEST_WEIGHTS)
                record["best"] = True
            else:
                st.bad_validations += 1
                st.lr_bad_validations += 1
                decay_on_plateau(self.config, st)
            self.directory.append_log(record)
            bleu = f", BLEU {metrics['valid_bleu']:.2f}" if "valid_bleu" in metrics else ""
            log.info(
                "step %d epoch %d: train NLL %.3f/pair, valid NLL %.3f/pair %.3f/token (ppl %.1f)%s, true-vs-shuffled margin %.2f nats, %.0f pairs/s%s",
                st.step, st.epoch, record["train_nll_pair"], metrics.get("valid_nll_pair", float("nan")), nll,
                metrics.get("valid_ppl", float("nan")), bleu, metrics.get("valid_margin_pair", float("nan")),
                record["pairs_per_second"], " (best)" if record.get("best") else "",
            )
            self.save_checkpoint()
        (st.best_valid_nll, st.best_valid_bleu, st.best_step, st.bad_validations, st.lr,
         st.lr_bad_validations) = distributed.broadcast_object(
            (st.best_valid_nll, st.best_valid_bleu, st.best_step, st.bad_validations, st.lr, st.lr_bad_validations))
        set_learning_rate(self.optimizer, st.lr)
        self.reset_interval()

    def measure(self) -> Dict[str, float]:
        """The validation figures of the model's current weights (BLEU too, for sentence pairs)."""
        metrics = validate(self.model, self.valid_pairs, self.device, self.precision)
        if self.references is not None:
            metrics["valid_bleu"] = validation_bleu(self.model, self.valid_pairs, self.target_vocab, self.references,
                                                    self.config.valid_beam, self.device, self.precision)
        return metrics

    def average_recent_weights(self) -> None:
        """Validate the mean of the kept weights; it becomes model.pt when it beats the best
        single weights by ``valid_metric``. config.json records the outcome under ``averaged``."""
        st = self.state
        files = recent_weight_files(self.directory.path / RECENT_WEIGHTS)[-self.config.average_checkpoints :]
        if len(files) < 2:
            return
        trained = {k: v.clone() for k, v in self.model.state_dict().items()}
        averaged = average_weights(files)
        self.model.load_state_dict(averaged)
        metrics = self.measure()
        kept = self.improved(metrics["valid_nll_token"], metrics.get("valid_bleu"))
        if kept:
            self.directory.save_weights(averaged, BEST_WEIGHTS)
        self.model.load_state_dict(trained)
        self.directory.update_config(averaged={
            "steps": [int(f.stem.split("-")[1]) for f in files], "kept_as_model": kept,
            "valid_nll_token": metrics["valid_nll_token"], "valid_bleu": metrics.get("valid_bleu"),
            "best_single": {"step": st.best_step, "valid_nll_token": st.best_valid_nll,
                            "valid_bleu": None if st.best_valid_bleu == -math.inf else st.best_valid_bleu},
        })
        log.info("mean of the weights of steps %s: valid NLL %.4f/token%s; %s", ", ".join(f.stem[5:] for f in files),
                 metrics["valid_nll_token"], f", BLEU {metrics['valid_bleu']:.2f}" if "valid_bleu" in metrics else "",
                 "kept as model.pt" if kept else f"the weights of step {st.best_step} stay model.pt")

    def improved(self, nll: float, bleu: Optional[float]) -> bool:
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
