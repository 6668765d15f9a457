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
import json
import logging
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Optional, Set, Tuple

import torch

from phrase_scorer.runtime import distributed
from phrase_scorer.data.sentence_pairs import SentenceCorpus
from phrase_scorer.data.batches import BatchSampler
from phrase_scorer.data.cache import PairSet
from phrase_scorer.data.phrase_pairs import PhraseTableData
from phrase_scorer.runtime.device import device_label, resolve_device, resolve_precision
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import remove_stale_temporaries
from phrase_scorer.io.output_lock import OutputLock
from phrase_scorer.config import AnyModelConfig, TrainConfig, preset_config
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
    SOURCE_SUBWORDS,
    SOURCE_VOCAB,
    TARGET_SUBWORDS,
    TARGET_VOCAB,
    ModelDirectory,
    recent_weight_files,
    config_record,
)
from phrase_scorer.training.loop import LoopParts, TrainingLoop
from phrase_scorer.training.checkpoints import TrainState, load_checkpoint
from phrase_scorer.training.optimisation import make_grad_scaler, make_optimizer, set_learning_rate
from phrase_scorer.records import refuse_changed
from phrase_scorer.runtime.replacement import FolderReplacement
from phrase_scorer.subwords import learn_vocabulary, load_vocabulary, piece_counts
from phrase_scorer.vocab import FORMAT as VOCAB_FORMAT, Vocabulary

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
                hint=Text("continue it with ", setting("resume", True), ", start again with ",
                          setting("overwrite", True), ", or choose another folder"),
            )
        raise PhraseScorerError(
            f"holds a model without its config.json ({', '.join(present)})", path=path,
            hint=(Text(setting("resume"), " cannot continue it; ") if resume else "")
            + Text("start again with ", setting("overwrite", True), " (replaces them), or choose another folder"),
        )
    if resume:
        log.info("nothing to resume in %s: starting afresh", path)
    if path.exists() and any(path.iterdir()) and not present and not overwrite:
        foreign = [p.name for p in path.iterdir() if not setup_leftover(p)]
        if foreign:
            raise PhraseScorerError(
                f"output folder is not empty and holds no phrase-scorer model ({', '.join(sorted(foreign)[:3])}"
                f"{', ...' if len(foreign) > 3 else ''} are not what a setup leaves)", path=path,
                hint=Text("choose another folder, or pass ", setting("overwrite", True), " to replace what is there"))
    for name in MODEL_FILES:
        (path / name).unlink(missing_ok=True)
    for old in recent_weight_files(path / RECENT_WEIGHTS):
        old.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return False


def model_folder(directory: ModelDirectory, resume: bool, overwrite: bool) -> Tuple[ModelDirectory, bool]:
    """The folder this run trains in, checked against the flags (:func:`prepare_directory`), and
    whether it resumes (rank 0, holding the output's lock); the temporary files of its model files
    that killed runs left there are removed (:func:`remove_stale_temporaries`).

    A model replaced with ``overwrite`` stays whole until the new one is: the new model is trained
    in ``DIR.new`` and swapped in when training ends (:class:`FolderReplacement`, also for what a
    killed run left there). ``resume`` continues such an interrupted replacement; a run that is
    not resuming removes it when it replaces the model again, or when it holds nothing to continue
    (no config.json: a setup that never reached its first checkpoint), and is refused otherwise."""
    replacement = model_replacement(directory.path)
    replacement.refuse_a_build()
    replacement.recover()
    if replacement.pending:
        building = ModelDirectory(replacement.building)
        if resume:
            log.info("continuing the interrupted run that replaces %s, in %s", replacement.target, building.path)
            remove_stale_model_temporaries(building.path)
            return building, prepare_directory(building, True, True)
        if building.exists() and not overwrite:
            raise PhraseScorerError(
                "an interrupted run that was to replace this model is kept beside it", path=building.path,
                hint=Text("continue it with ", setting("resume", True), ", or start again with ",
                          setting("overwrite", True)))
        replacement.discard()
    replaces = any((replacement.target / name).exists() for name in MODEL_STATE_FILES)
    if overwrite and replaces and not (resume and directory.exists()):
        building = ModelDirectory(replacement.begin())
        log.info("the new model is trained in %s; it replaces %s when training ends", building.path,
                 replacement.target)
        return building, prepare_directory(building, False, True)
    if directory.path.is_dir():
        remove_stale_model_temporaries(directory.path)
    return directory, prepare_directory(directory, resume, overwrite)


def remove_stale_model_temporaries(folder: Path) -> None:
    """Remove what killed writes of the model's files left in ``folder`` (a checkpoint, a config
    or weights cut short under a temporary name), while provably the tool's and abandoned."""
    recent = folder / RECENT_WEIGHTS
    removed = [path for name in MODEL_FILES for path in remove_stale_temporaries(folder / name)]
    if recent.is_dir() and not recent.is_symlink():
        removed += remove_stale_temporaries(recent, every_name=True)
    for stale in removed:
        log.info("removed %s, left by a run that was killed", stale)


def model_replacement(output: Path) -> FolderReplacement:
    """The replacement of the model folder ``output`` (its links followed: a link to a model keeps
    pointing at the new one)."""
    return FolderReplacement(Path(os.path.realpath(output)), model_entry)


def model_entry(name: str) -> bool:
    """Whether ``name`` is an entry ``train`` makes in a model folder: the model's files, its pair
    cache, the weights of its last validations, and the temporary files of their writes."""
    return (name in MODEL_FILES or name in (CACHE, CACHE + ".part", RECENT_WEIGHTS)
            or re.fullmatch(r".+\.[0-9a-f]{8}\.part", name) is not None)


def interrupted_checkpoint(output: os.PathLike | str) -> bool:
    """Whether a run into ``output`` that was interrupted left a checkpoint to resume from: the
    checkpoint of a replacement being trained beside ``output``, if there is one, else
    ``output``'s own."""
    replacement = model_replacement(Path(output))
    folder = replacement.building if replacement.pending else Path(output)
    return (folder / CHECKPOINT).exists()


def setup_leftover(entry: Path) -> bool:
    """Whether ``entry`` of a model folder is what a setup killed before config.json leaves, made
    by this tool (so that a new run may replace it): a vocabulary in this tool's format, its
    pair cache (a folder whose description is this tool's), a sentencepiece model beside them, or
    a temporary file of a write that never finished. By content, not by name alone: a user's file
    that only carries one of these names is not replaced without ``--overwrite``."""
    name = entry.name
    if entry.is_symlink():
        return False
    if name in (SOURCE_VOCAB, TARGET_VOCAB):
        try:
            return json.loads(entry.read_text(encoding="utf-8")).get("format") == VOCAB_FORMAT
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            return False
    if name in (CACHE, CACHE + ".part"):
        if not entry.is_dir() or not all(cache_file(child) for child in entry.iterdir()):
            return False
        try:  # a finished cache has its description; a cache.part being written may not yet
            return isinstance(json.loads((entry / "meta.json").read_text(encoding="utf-8")), dict)
        except (OSError, ValueError, UnicodeDecodeError):
            return name == CACHE + ".part"
    if name in (SOURCE_SUBWORDS, TARGET_SUBWORDS):
        return entry.is_file()
    return entry.is_file() and re.fullmatch(r".+\.[0-9a-f]{8}\.part", name) is not None


def cache_file(entry: Path) -> bool:
    """Whether ``entry`` of a pair cache folder is a file the cache writer makes: its
    description, checksums, or a split's arrays (``SPLIT.NAME``, ``SPLIT.NAME.ids``, ...)."""
    written = re.fullmatch(r"(train|valid)\.(lengths|(src|tgt)\.(ids|offsets))(\.(w[0-9-]+-[0-9a-f]{8}\.)?[0-9a-f]{8}"
                           r"\.part)?", entry.name)
    return entry.is_file() and not entry.is_symlink() and (
        entry.name in ("meta.json", "checksums.json") or written is not None)


def check_resume_settings(saved: TrainConfig, asked: TrainConfig, explicit: Set[str]) -> TrainConfig:
    """The saved settings, updated with those given again that --resume may change.

    ``explicit`` names the settings the user gave; a differing one that --resume cannot change
    (the model, the data, the optimiser) is an error rather than a silent surprise.
    """
    fixed = sorted(name for name in explicit if name not in TrainConfig.RESUMABLE)
    refuse_changed(
        {name: getattr(saved, name) for name in fixed}, {name: getattr(asked, name) for name in fixed},
        label=setting,
        hint="leave them out (the saved ones are used) or start a new run",
    )
    return replace(saved, **{name: getattr(asked, name) for name in TrainConfig.RESUMABLE if name in explicit})


# --- the loop -------------------------------------------------------------------------------------


TrainingData = PhraseTableData | SentenceCorpus  # the data sources training reads


def given_settings(config: TrainConfig) -> Set[str]:
    """The settings of ``config`` that differ from the defaults: those a caller gave."""
    default = TrainConfig()
    return {f.name for f in fields(TrainConfig) if getattr(config, f.name) != getattr(default, f.name)}


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
        explicit = given_settings(config)
    output = Path(output)
    started = distributed.init(distributed.device_for_rank(resolve_device(config.device)))
    try:
        if distributed.world().is_main:
            output.parent.mkdir(parents=True, exist_ok=True)
            lock: ContextManager[object] = OutputLock(output.resolve())  # a second run aimed at it is refused
        else:
            lock = contextlib.nullcontext()
        with lock:
            try:
                return _train(data, output, config, resume, overwrite, model_config, explicit)
            except Exception:
                if distributed.world().is_main:
                    discard_unstarted(output)
                raise
    finally:
        if started:
            distributed.shutdown()


def discard_unstarted(output: Path) -> None:
    """After a failure: remove the replacement of ``output`` being trained beside it when it
    holds nothing to continue (no config.json: it never reached its first checkpoint). Ctrl-C
    keeps it (the next run removes it), as the message after Ctrl-C reads what it holds."""
    replacement = model_replacement(output)
    if replacement.pending and not (replacement.building / CONFIG).exists():
        try:
            replacement.discard()
        except PhraseScorerError as exc:  # a file of the user's put there meanwhile: kept, and said
            log.warning("%s", exc)


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
    # the folder trained in: the output, or DIR.new where the run replaces a model (model_folder)
    folder: str = ""


def prepare_run(data: TrainingData, directory: ModelDirectory, config: TrainConfig, resume: bool, overwrite: bool,
                model_config: Optional[AnyModelConfig], explicit: Set[str]) -> RunSetup:
    """Prepare the directory: settings, vocabularies and the pair cache (rank 0 only)."""
    directory, resuming = model_folder(directory, resume, overwrite)
    output = directory.path
    new_config = None
    if resuming:
        saved = directory.read_config()
        saved_model = directory.model_config(saved)  # its "arch" is the saved run's architecture
        try:
            saved_config = TrainConfig.from_dict({**saved.get("training", {}), "arch": saved_model.arch})
            saved_config = saved_config.resolved(corpus="corpus" in saved)
        except PhraseScorerError as exc:  # a setting of the wrong type or out of its range
            raise PhraseScorerError(exc.message, path=directory.file(CONFIG),
                                    hint=Text("correct it, or start a new run with ",
                                              setting("overwrite", True))) from None
        except TypeError as exc:
            raise PhraseScorerError(f"config has no valid 'training' section ({exc})", path=directory.file(CONFIG),
                                    hint=Text("start a new run with ", setting("overwrite", True))) from None
        config = check_resume_settings(saved_config, config.resolved(corpus="corpus" in saved), explicit)
        if model_config is not None:
            names = ("source_shortlist", "target_shortlist")
            refuse_changed({n: getattr(saved_model, n) for n in names}, {n: getattr(model_config, n) for n in names},
                           label=setting, path=output,
                           hint="leave them out (the saved ones are used) or start a new run")
        model_config = saved_model
        source_vocab, target_vocab = directory.vocabularies(saved)
        if data.kind not in saved:
            trained_on = Text("a sentence corpus (", setting("corpus"), ")") if "corpus" in saved else "a phrase table"
            raise PhraseScorerError(Text("the interrupted run trained on ", trained_on), path=output,
                                    hint="resume with the same training data, or start a new run")
        data_info = saved[data.kind]
        data.refuse_other_data(data_info, output)  # the cache may be gone: its check would be skipped
    else:
        model_config = model_config or preset_config(config)
        config = replace(config, arch=model_config.arch).resolved(corpus=data.kind == "corpus")
        if config.valid_metric == "bleu" and data.kind != "corpus":
            raise PhraseScorerError(Text(setting("valid_metric", "bleu"), " needs sentence pairs (", setting("corpus"),
                                         "); a phrase table validates by nll"))
        source_counts, target_counts, data_info = data.count_words(config)
        source_vocab, target_vocab = make_vocabularies(config, model_config, source_counts, target_counts)
        source_vocab.save(directory.file(SOURCE_VOCAB))
        target_vocab.save(directory.file(TARGET_VOCAB))
        data_info.update({
            "source_words": len(source_counts),
            "target_words": len(target_counts),
            "source_coverage": coverage(source_counts, source_vocab),
            "target_coverage": coverage(target_counts, target_vocab),
        })
        if config.vocabulary == "words":
            log.info(
                "shortlists keep %d of %d source words (%.1f%% of tokens) and %d of %d target words (%.1f%%)",
                len(source_vocab) - 3, len(source_counts), 100 * data_info["source_coverage"],
                len(target_vocab) - 3, len(target_counts), 100 * data_info["target_coverage"],
            )
        else:
            for side, counts, vocab in (("source", source_counts, source_vocab),
                                        ("target", target_counts, target_vocab)):
                pieces, words = piece_counts(counts, vocab)
                data_info[f"{side}_pieces_per_word"] = round(pieces / max(words, 1), 4)
            log.info("%s pieces: %d source (%.2f per word), %d target (%.2f per word), for %d and %d words",
                     config.vocabulary, len(source_vocab) - 3, data_info["source_pieces_per_word"],
                     len(target_vocab) - 3, data_info["target_pieces_per_word"], len(source_counts),
                     len(target_counts))
    data.build_cache(directory.cache_dir, source_vocab, target_vocab, data_info, config, keep_existing=resuming)
    config = check_validation_split(directory, data, config, resuming, explicit)
    if not resuming:
        new_config = config_record(preset=config.preset, model=model_config, source_vocab=source_vocab,
                                   target_vocab=target_vocab, training=config.to_dict(), data_kind=data.kind,
                                   data_info=data_info)
    return RunSetup(resuming, config, model_config, new_config=new_config, folder=os.fspath(directory.path))


def check_validation_split(directory: ModelDirectory, data: TrainingData, config: TrainConfig, resuming: bool,
                           explicit: Set[str]) -> TrainConfig:
    """The run's settings for its validation split. Without validation pairs (``--valid-pairs 0``,
    or none held out of a small corpus) the training NLL picks the best weights: the BLEU of no
    translations cannot, so a BLEU metric that was only the default for sentence pairs becomes
    nll; one asked for (``--valid-metric bleu``) is refused."""
    if config.valid_metric != "bleu" or len(PairSet(directory.cache_dir, "valid")):
        return config
    held_out = (Text(setting("dev"), " holds no pair with two non-empty sides") if getattr(data, "dev_source", None)
                else Text(setting("valid_pairs", config.valid_pairs), " held out none of the pairs"))
    if resuming or "valid_metric" in explicit:
        raise PhraseScorerError(Text(setting("valid_metric", "bleu"), " needs validation pairs, but ", held_out),
                                path=data.path,
                                hint=Text("give ", setting("dev", "SRC TGT"), " or a larger ", setting("valid_pairs"),
                                          ", or validate by ", setting("valid_metric", "nll")))
    log.info("no validation pairs (%s): the training NLL picks the best weights (%s)", held_out,
             setting("valid_metric", "nll"))
    return replace(config, valid_metric="nll")


def agree_on_setup(run: Callable[[], RunSetup]) -> RunSetup:
    """Rank 0 runs ``run``; the others wait for its outcome (an error there is an error everywhere)."""
    if not distributed.world().is_distributed:
        return run()
    if distributed.world().is_main:
        try:
            setup = run()
        except BaseException as exc:
            error = exc.text if isinstance(exc, PhraseScorerError) else str(exc) or type(exc).__name__
            distributed.broadcast_object(RunSetup(False, TrainConfig(), None, error=error))
            raise
        return distributed.broadcast_object(setup)
    setup = distributed.broadcast_object()
    if setup.error:
        raise PhraseScorerError(Text("rank 0 could not prepare the run: ", setup.error))
    return setup


def _train(data: TrainingData, output: Path, config: TrainConfig, resume: bool, overwrite: bool,
           model_config: Optional[AnyModelConfig], explicit: Set[str]) -> TrainState:
    directory = ModelDirectory(output)
    setup = agree_on_setup(lambda: prepare_run(data, directory, config, resume, overwrite, model_config, explicit))
    resuming, config, model_config = setup.resuming, setup.config, setup.model_config
    directory = ModelDirectory(Path(setup.folder))  # DIR.new where the run replaces a model
    source_vocab = load_vocabulary(directory.file(SOURCE_VOCAB))
    target_vocab = load_vocabulary(directory.file(TARGET_VOCAB))
    train_pairs = PairSet(directory.cache_dir, "train")
    valid_pairs = PairSet(directory.cache_dir, "valid")
    if len(train_pairs) == 0:
        raise PhraseScorerError("no pairs left for training after holding out the validation set", path=data.path,
                                hint=Text("lower ", setting("valid_pairs")))
    log.info("pair cache: %d training pairs, %d validation pairs", len(train_pairs), len(valid_pairs))
    world = distributed.world().size
    if config.batch_size % world:
        raise PhraseScorerError(Text(setting("batch_size", config.batch_size), " (the global batch) does not divide "
                                     f"among {world} processes"),
                                hint=f"use a multiple of {world}")
    log.info("global batch: %d pairs per update (%d process%s x %d pairs)", config.batch_size, world,
             "es" if world > 1 else "", config.batch_size // world)

    device = distributed.device_for_rank(resolve_device(config.device))
    if world > 1 and torch.distributed.get_backend() != distributed.backend_for(device):
        raise PhraseScorerError(f"the run trains on {device.type}, but the processes joined for another device",
                                hint=Text("give ", setting("device"), " explicitly under torchrun"))
    precision = resolve_precision(device, config.precision)
    torch.manual_seed(config.seed)
    model = build_model(model_config, len(source_vocab), len(target_vocab))
    assert config.init is not None and config.dropout is not None and config.lr is not None  # resolved: the recipe's
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
    log.info("model: %s, preset %s, %s parameters, device %s, precision %s", model_config.arch, config.preset,
             f"{count_parameters(model):,}", state.device, precision)

    train_module: torch.nn.Module = model
    if world > 1:
        train_module = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    sampler = BatchSampler(train_pairs, config.batch_size, config.seed, window_batches=data.window_batches)
    references = None
    if config.valid_metric == "bleu":
        assert isinstance(data, SentenceCorpus)  # bleu validates a sentence corpus alone (refused otherwise)
        references = data.valid_references(valid_pairs, target_vocab)
    parts = LoopParts(model, optimizer, scaler, device, precision, sampler, train_pairs, valid_pairs,
                      train_module=train_module, target_vocab=target_vocab, references=references)
    loop = TrainingLoop(parts, directory, config, state, new_config=setup.new_config)
    set_learning_rate(optimizer, state.lr)
    loop.run()
    if distributed.world().is_main and not directory.file(BEST_WEIGHTS).exists():  # never a "model" without weights
        raise PhraseScorerError(Text("training stopped (", loop.state.stop_reason, ") without weights to keep: no "
                                     "validation gave a finite NLL"), path=directory.file(BEST_WEIGHTS),
                                hint=Text("lower ", setting("lr"), ", or raise the stopping limits and resume with ",
                                          setting("resume", True)))
    if distributed.world().is_main and directory.path != output:
        model_replacement(output).commit()  # the finished model takes the old one's place
    return loop.state


def make_vocabularies(config: TrainConfig, model_config: AnyModelConfig, source_counts, target_counts
                      ) -> Tuple[Vocabulary, Vocabulary]:
    """The two vocabularies of a new model: the shortlists of the most frequent words, or
    (``config.vocabulary`` bpe | unigram) subword models with as many pieces, learnt from the
    same word counts (:mod:`phrase_scorer.subwords`)."""
    if config.vocabulary == "words":
        return (Vocabulary.from_counts(source_counts, model_config.source_shortlist),
                Vocabulary.from_counts(target_counts, model_config.target_shortlist,
                                       right_to_left=config.right_to_left))
    return (learn_vocabulary(source_counts, model_config.source_shortlist, config.vocabulary, SOURCE_SUBWORDS),
            learn_vocabulary(target_counts, model_config.target_shortlist, config.vocabulary, TARGET_SUBWORDS,
                             right_to_left=config.right_to_left))


def coverage(counts, vocab: Vocabulary) -> float:
    total = sum(counts.values())
    return sum(c for w, c in counts.items() if w in vocab) / total if total else 0.0
