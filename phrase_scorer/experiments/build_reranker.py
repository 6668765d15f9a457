"""From a tuned Moses system to its best reranker in one command: ``build-reranker``.

::

    training corpus, tuning set --shortlist coverage--> words or subword pieces   vocabulary/
        --train, one model per direction--> the sentence models                   models/<model>/
    tuned moses.ini --moses, N distinct--> the tuning set's n-best list             nbest/<set>.nbest
        --rescore, every feature--> the rescored list                               rescored/<set>.nbest.gz
        --rerank, per candidate row and optimiser seed--> tuned weights, BLEU       rows/<row>/seed<k>/
        --the best row (near-ties: fewer models)--> the reranker and the report     reranker.json, report.md

The models. ``forward`` reads the source and predicts the target left to right, ``right-to-left``
the same read last word first, ``reverse`` predicts the source from the target. With ``members``
N > 1 the forward and right-to-left kinds are each trained N times, with seeds 1..N (``forward``,
``forward-2``, ...), and once more per further architecture of ``archs`` (``forward-transformer``,
``forward-transformer-2``, ...); the reverse model is of ``reverse_arch``. They give three
features: *Forward* (the first forward model), *Ensemble*
(the mean log p of every forward and right-to-left model) and *Reverse*. The candidate rows are
the decoder's features plus *Forward*, *Ensemble*, *Forward* and *Reverse*, *Ensemble* and
*Reverse* (those the trained models allow), and the decoder's features alone (*Moses, re-tuned
on the list*: what re-tuning by itself buys).

The choice. Each row is tuned on the tuning set's list with ``runs`` optimiser seeds; a row's
figure is the mean BLEU of its reranked tuning set over the seeds. The row kept is the one with
the fewest models among those within ``tie_margin`` BLEU of the best (a model fewer is a cheaper
system to run), the higher figure among equals; its reranker is the weights of its seed with the
best tuning BLEU. The tuning set both tunes and chooses: the figures of the report are tuning-set
figures, not a test result.

Before its first step the build checks everything it will use (:func:`preflight`), and a run
given again checks it all again before it continues: the options; each model given, which must
load and read the direction and the languages its name says (by the corpus its config.json
records, else by its vocabularies against the tuning set); the moses.ini and the files it names;
the corpus and the tuning set; the memory the trainings side by side and the rescoring need
(``members`` multiplies both); Moses; the working folder. One log line says so.

Every step records what made it (:class:`~phrase_scorer.records.Step`: files by their bytes) and
is reused when a re-run has the same inputs, redone when they changed; an interrupted run given
again continues where it stopped (a training from its checkpoint, a rescoring inside its list).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from phrase_scorer.config import ARCH_PRESETS, BuildRerankerOptions, ScoringOptions, TrainConfig, preset_config
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.experiments.report import NONE, closing_lines, mean_sd, table, two_decimals, write_report
from phrase_scorer.experiments.system_steps import (
    RETUNED_ROW, EvalSet, Row, decoded_nbest, first_hypotheses, nbest_flags, rescored_nbest, scores_of,
    RowTuning, set_name, tuned_row_run, write_rerankers,
)
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_identity
from phrase_scorer.io.inputs import TextLines
from phrase_scorer.io.output_lock import OutputLock
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.model_layout import BEST_WEIGHTS, CHECKPOINT
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.moses.system import system_record
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation, read_lines
from phrase_scorer.records import Signature, Step, read_record
from phrase_scorer.runtime.progress import duration
from phrase_scorer.vocab import Vocabulary

log = logging.getLogger(__name__)

# The models a run can train: name -> (reads the corpus the other way round, right to left)
MODEL_KINDS: Dict[str, Tuple[bool, bool]] = {
    "forward": (False, False),
    "right-to-left": (False, True),
    "reverse": (True, False),
}
ENSEMBLED = ("forward", "right-to-left")  # the kinds trained once per ensemble member (seed)
FORWARD, ENSEMBLE, REVERSE = "Forward", "Ensemble", "Reverse"  # the features, as the lists name them
COMMAND = "phrase-scorer build-reranker"
WORK_MARK = "build-reranker.json"  # in the working folder: this command made it
# Settings a training goes on from its checkpoint with when they change (a larger --budget or
# --max-steps trains on; the rest of a model's settings, changed, train it anew)
STOPPING = ("max_steps", "max_time", "valid_every", "device")


@dataclass(frozen=True)
class Candidate:
    """A candidate row: its features and the models it runs."""

    row: Row
    models: Tuple[str, ...]


def member_name(kind: str, seed: int, arch: str = "") -> str:
    """The model of ``kind`` trained with ``seed``, of a further architecture ``arch`` ("": the
    first of ``archs``): ``forward``, ``forward-2``, ``forward-transformer-2``, ..."""
    return kind + (f"-{arch}" if arch else "") + (f"-{seed}" if seed > 1 else "")


def model_identity(name: str) -> Tuple[str, str, int]:
    """The kind, further architecture ("" for none) and seed of a model name (:func:`member_name`);
    a name of no kind is returned as it is, with no architecture and seed 1."""
    rest, seed = name, 1
    head, _, tail = name.rpartition("-")
    if tail.isdigit() and int(tail) > 1:
        rest, seed = head, int(tail)
    for kind in ENSEMBLED:
        if rest == kind:
            return kind, "", seed
        if rest.startswith(kind + "-") and rest[len(kind) + 1:] in ARCH_PRESETS:
            return kind, rest[len(kind) + 1:], seed
    return name, "", 1


def kind_and_seed(name: str) -> Tuple[str, int]:
    """The kind and seed of a model name (:func:`model_identity`)."""
    kind, _, seed = model_identity(name)
    return kind, seed


def model_names(kinds: Sequence[str], members: int, archs: Sequence[str] = ("",)) -> List[str]:
    """The models a run uses: each of ``kinds``, those of :data:`ENSEMBLED` once per member of
    each architecture of ``archs`` (the first named "")."""
    further = ["", *archs[1:]]
    return [member_name(kind, seed, arch) for kind in kinds for arch in (further if kind in ENSEMBLED else [""])
            for seed in range(1, (members if kind in ENSEMBLED else 1) + 1)]


def model_arch(name: str, options: BuildRerankerOptions) -> str:
    """The architecture the model ``name`` trains as."""
    kind, arch, _ = model_identity(name)
    if kind in ENSEMBLED:
        return arch or options.archs[0]
    return options.reverse_arch


def ensemble_members(models: Sequence[str]) -> List[str]:
    """The models whose mean log p is the *Ensemble* feature: every forward and right-to-left one."""
    return [m for m in models if kind_and_seed(m)[0] in ENSEMBLED]


def candidates(models: Sequence[str]) -> List[Candidate]:
    """The rows the trained ``models`` allow, the decoder's features alone first."""
    have = set(models)
    rows = [Candidate(Row(RETUNED_ROW, ()), ())]
    bases: List[Tuple[Tuple[str, ...], Tuple[str, ...]]] = [((FORWARD,), ("forward",))]
    ensemble = ensemble_members(models)
    if len(ensemble) > 1:
        bases.append(((ENSEMBLE,), tuple(ensemble)))
    for features, used in bases:
        rows.append(Candidate(Row(" + ".join(features), features), used))
        if "reverse" in have:
            rows.append(Candidate(Row(" + ".join(features + (REVERSE,)), features + (REVERSE,)),
                                  used + ("reverse",)))
    return rows


def choose(figures: Sequence[Tuple[Candidate, float]], tie_margin: float) -> Candidate:
    """The row kept: the fewest models among those within ``tie_margin`` BLEU of the best figure,
    then the higher figure, then the earlier row."""
    best = max(bleu for _, bleu in figures)
    near = [(len(c.models), -bleu, i) for i, (c, bleu) in enumerate(figures) if bleu >= best - tie_margin]
    return figures[min(near)[2]][0]


# --- words or subword pieces ---------------------------------------------------------------------


def words_of(path: PathLike) -> Iterator[str]:
    for _, line in TextLines(path):
        yield from line.split()


def outside_shortlist(counts: Counter, held: Counter, size: int) -> float:
    """The share of the ``held`` tokens outside the shortlist of ``size`` words that ``train``
    makes from ``counts`` (:meth:`~phrase_scorer.vocab.Vocabulary.from_counts`): what a word model
    reads as ``<unk>``."""
    shortlist = Vocabulary.from_counts(counts, size)
    return sum(n for w, n in held.items() if w not in shortlist) / max(sum(held.values()), 1)


def vocabulary_choice(corpus: Tuple[str, str], tuning: Tuple[str, str], work: Path,
                      options: BuildRerankerOptions) -> str:
    """``options.vocabulary``, or from the measured coverage: subword pieces when a word shortlist of
    the preset's size leaves more than ``options.bpe_above`` of the tuning set's tokens out, on
    either side; recorded in ``vocabulary/choice.json``."""
    if options.vocabulary is not None:
        return options.vocabulary
    record = work / "vocabulary" / "choice.json"
    model = preset_config(training_config(options, "words", False))
    sizes = (model.source_shortlist, model.target_shortlist)
    step = Step(work / "vocabulary" / "inputs.json",
                {"corpus": [file_identity(p) for p in corpus], "tuning": [file_identity(p) for p in tuning],
                 "shortlists": list(sizes), "bpe above": options.bpe_above}, [record])
    if not step.done:
        with step:
            shares = [outside_shortlist(Counter(words_of(train)), Counter(words_of(held)), size)
                      for train, held, size in zip(corpus, tuning, sizes)]
            choice = "bpe" if max(shares) > options.bpe_above else "words"
            write_text_atomically(record, json.dumps({"vocabulary": choice, "outside shortlist": shares}) + "\n")
    data = json.loads(record.read_text(encoding="utf-8"))
    source, target = data["outside shortlist"]
    log.info("vocabulary: %s (tuning-set tokens outside a word shortlist: source %.1f%%, target %.1f%%; "
             "subword pieces above %.1f%%)", data["vocabulary"], 100 * source, 100 * target, 100 * options.bpe_above)
    return data["vocabulary"]


# --- the models ------------------------------------------------------------------------------------


def side_by_side_threads(options: BuildRerankerOptions, trainings: int, device: str) -> int:
    """The threads of each training when the ``trainings`` run side by side, else 0 (one after
    another). By default (``options.side_by_side`` None) they do on a CPU with two threads or
    more: on one core each, two, three or five trainings go 1.8 to 2.1 times as far in the same
    time as one on both (docs/benchmarks.md, "Training side by side")."""
    import torch

    threads = torch.get_num_threads()
    wanted = options.side_by_side if options.side_by_side is not None else device == "cpu" and threads >= 2
    return max(1, threads // trainings) if wanted and trainings > 1 else 0


def training_config(options: BuildRerankerOptions, vocabulary: str, right_to_left: bool,
                    seed: int = 1, arch: Optional[str] = None) -> TrainConfig:
    """The training of one model (of ``arch``; None: the first of ``options.archs``)."""
    hours = options.training_hours
    share = 1 if options.side_by_side else max(len(options.model_kinds), 1)  # side by side: each has the whole budget
    return TrainConfig(arch=arch or options.archs[0], preset=options.preset, vocabulary=vocabulary,
                       batch_size=options.batch_size,
                       valid_every=options.valid_every, max_steps=options.max_steps, device=options.device,
                       right_to_left=right_to_left, seed=seed, average_checkpoints=options.average_checkpoints,
                       max_time=None if hours is None else hours * 3600 / share)


def trained_model(name: str, corpus: Tuple[str, str], tuning: Tuple[str, str], work: Path, vocabulary: str,
                  options: BuildRerankerOptions) -> Path:
    """``models/<name>``: trained, or continued from its checkpoint, or reused as it was finished."""
    from phrase_scorer.data.sentence_pairs import SentenceCorpus
    from phrase_scorer.training.run import given_settings, train

    kind, seed = kind_and_seed(name)
    reverse, right_to_left = MODEL_KINDS[kind]
    source, target = (corpus[1], corpus[0]) if reverse else corpus
    dev_source, dev_target = (tuning[1], tuning[0]) if reverse else tuning
    config = training_config(options, vocabulary, right_to_left, seed, model_arch(name, options))
    folder = work / "models" / name
    settings = asdict(config)
    stopping = {key: settings.pop(key) for key in STOPPING}
    step = Step(work / "models" / f"{name}.inputs.json",
                {"corpus": [file_identity(source), file_identity(target)],
                 "dev": [file_identity(dev_source), file_identity(dev_target)], "training": settings,
                 "stopping": stopping},
                [folder / BEST_WEIGHTS], folder=folder, resumable=["stopping"])
    if step.done:
        log.info("%s model: already trained (%s)", name, folder)
        return folder
    with step:  # an interrupted training continues from its last checkpoint; with none, it starts again
        checkpoint = (folder / CHECKPOINT).exists()
        train(SentenceCorpus(source, target, dev_source, dev_target), folder, config, resume=checkpoint,
              overwrite=not checkpoint, explicit=given_settings(config) | set(STOPPING))  # the new stopping
    return folder


# --- the whole run ---------------------------------------------------------------------------------


@dataclass
class BuildResult:
    reranker: str
    chosen: str
    figures: Dict[str, List[float]]  # row -> tuning BLEU per seed
    markdown: str


class StepClock:
    """Which step of how many, and the time each took: what the user sees between the steps'
    own progress bars."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.times: Dict[str, float] = {}

    @contextmanager
    def step(self, name: str, what: str) -> Iterator[None]:
        """Log ``what`` as the next step; record its time under ``name`` when it ends."""
        self.done += 1
        log.info("step %d of %d: %s", self.done, self.total, what)
        began = time.monotonic()
        yield
        self.times[name] = time.monotonic() - began


def build_reranker(moses_ini: PathLike, corpus: Tuple[str, str], tuning: Tuple[str, str], work_dir: PathLike, *,
                   options: BuildRerankerOptions = BuildRerankerOptions(),
                   scoring_options: ScoringOptions = ScoringOptions(), given_models: Optional[Dict[str, str]] = None,
                   moses: MosesGiven = None) -> BuildResult:
    """Run (or continue) the whole build into ``work_dir``; returns the chosen row and the
    reranker's path (``work_dir/reranker.json``). ``given_models`` maps a model name
    (:func:`model_names`: a kind of :data:`MODEL_KINDS`, or a further member such as ``forward-2``)
    to a directory trained before, used instead of training it. Moses is ``moses``, an
    installation or the folder of one (None: ``MOSES_HOME``)."""
    check_decoder_flags(options.experiment.decoder_flags)  # before anything is made
    given = dict(given_models or {})
    ini, work = Path(moses_ini).resolve(), Path(work_dir).resolve()
    plan = preflight(ini, corpus, tuning, work, options, given, moses)
    work = claim_work_folder(work)
    with OutputLock(work):  # WORK.lock: a second build into the same folder is refused
        return _build(ini, corpus, tuning, work, plan, options, scoring_options)


# --- everything checked before the first step ----------------------------------------------------

#: A training process before its model: torch, the pair cache's reader, the batches prefetched
#: (a small-preset training on 500 sentence pairs, a shortlist of their 1,500 words, peaked at 416 MiB)
TRAINING_BASE_BYTES = 300 << 20
TYPICAL_TOKENS = 50  # target tokens of a long training sentence: the logits a batch holds per pair


def training_bytes(options: BuildRerankerOptions) -> int:
    """About what one training of ``options``' preset takes at its peak (the largest of its
    architectures'): the process, the weights with their gradients and the optimiser's two
    moments (16 bytes a parameter), and a batch's logits and their gradients over the full
    target shortlist."""
    from phrase_scorer.models.architectures import full_size_parameters

    peaks = []
    for arch in (*options.archs, options.reverse_arch):
        model = preset_config(training_config(options, "words", False, arch=arch))
        logits = options.batch_size * TYPICAL_TOKENS * (model.target_shortlist + 3) * 4 * 2
        peaks.append(TRAINING_BASE_BYTES + 16 * full_size_parameters(model) + logits)
    return max(peaks)


def check_machine_holds(options: BuildRerankerOptions, models: Sequence[str], to_train: Sequence[str],
                        given: Dict[str, str], side_by_side: bool) -> str:
    """Refuse a build whose trainings at once, or whose models loaded together for the rescoring,
    would need more memory than the machine has (the trainings grow with ``members``: 2 x N + 1
    processes side by side). Returns what was found, for the log."""
    from phrase_scorer.experiments.preflight import machine_memory
    from phrase_scorer.models.architectures import full_size_parameters

    gib = 1 << 30
    total = machine_memory()
    each = training_bytes(options) if to_train else 0
    at_once = len(to_train) if side_by_side else min(len(to_train), 1)
    fix = Text("give fewer ", setting("members"), " or a smaller ", setting("preset"), ", or use a machine with more "
               "memory")
    if at_once * each > total:
        raise PhraseScorerError(Text(f"{len(to_train):,} trainings side by side (", setting("members", options.members),
                                     f") need about {at_once * each / gib:.1f} GiB ({each / gib:.2f} GiB each, preset "
                                     f"{options.preset}), more than the {total / gib:.1f} GiB this machine has"),
                                hint=fix)
    loaded = sum(os.path.getsize(Path(given[m]) / BEST_WEIGHTS) if m in given else
                 4 * full_size_parameters(preset_config(training_config(options, "words", False,
                                                                        arch=model_arch(m, options))))
                 for m in models)
    if loaded > total:
        raise PhraseScorerError(Text(f"the {len(models):,} models (", setting("members", options.members),
                                     f") rescore the list together and need about {loaded / gib:.1f} GiB, more than "
                                     f"the {total / gib:.1f} GiB this machine has"), hint=fix)
    trainings = (f"{at_once} training{'s' if at_once != 1 else ''} at once in about {size_text(at_once * each)}"
                 if at_once else "no training")
    return f"{trainings}, the {len(models)} models together in about {size_text(loaded)}, of {size_text(total)}"


def size_text(size: int) -> str:
    """Bytes as a person reads them: MiB below a GiB, else GiB with one decimal."""
    if size < 1 << 20:
        return "under 1 MiB"
    return f"{size / (1 << 20):,.0f} MiB" if size < 1 << 30 else f"{size / (1 << 30):,.1f} GiB"


def check_options(options: BuildRerankerOptions) -> None:
    """Every value of ``options`` in its range (a library caller's too; the command line's parser
    refuses the same values under their flags)."""
    from phrase_scorer.config import check_number, check_whole_number

    experiment = options.experiment
    for name, value, least in (("members", options.members, 1), ("max_steps", options.max_steps, 1),
                               ("valid_every", options.valid_every, 1), ("batch_size", options.batch_size, 1),
                               ("average_checkpoints", options.average_checkpoints, 0),
                               ("nbest_size", experiment.nbest_size, 1), ("nbest_factor", experiment.nbest_factor, 1),
                               ("runs", experiment.runs, 1), ("restarts", experiment.restarts, 0)):
        check_whole_number(name, value, least, 1 << 31)
    check_number("tie_margin", options.tie_margin, 0.0, 100.0)  # BLEU points
    check_number("bpe_above", options.bpe_above, 0.0, 1.0)
    if options.training_hours is not None:
        check_number("training_hours", options.training_hours, 0.0, 1e6, low_open=True)
    if not options.archs or len(set(options.archs)) != len(options.archs):
        raise PhraseScorerError(Text(setting("archs"), f" is {','.join(options.archs)!r}; name each architecture "
                                     "of the ensemble once"))
    for arch in (*options.archs, options.reverse_arch):  # each architecture is known, even where none trains
        if arch not in ARCH_PRESETS:
            preset_config(training_config(options, "words", False, arch=arch))  # its message names the known ones
    trained = (*options.archs, *((options.reverse_arch,) if "reverse" in options.model_kinds else ()))
    for arch in trained:  # the preset is one of each architecture that trains
        if options.preset not in ARCH_PRESETS[arch]:
            having = [a for a, presets in ARCH_PRESETS.items() if options.preset in presets]
            option = "archs" if arch in options.archs else "reverse_arch"
            raise PhraseScorerError(
                Text(setting("preset", options.preset), f" is not a preset of {arch}, which ", setting(option),
                     f" names (its presets: {', '.join(ARCH_PRESETS[arch])})"),
                hint=Text(f"give {' or '.join(having)} as ", setting(option), f" for {options.preset}, or another ",
                          setting("preset")) if having else None)


@dataclass(frozen=True)
class BuildPlan:
    """What the build uses, as the checks before its first step found it: the models (their
    names, :func:`model_names`), those given trained before (name -> folder) and Moses."""

    models: List[str]
    given: Dict[str, str]
    moses: MosesInstallation


def preflight(ini: Path, corpus: Tuple[str, str], tuning: Tuple[str, str], work: Path,
              options: BuildRerankerOptions, given: Dict[str, str], moses: MosesGiven) -> BuildPlan:
    """Everything the build will use, checked before its first step, as every run checks it again
    (a build given again continues only what a fresh run would accept): the options, the models
    given (each loads, reads the direction and the languages its name needs:
    :func:`~phrase_scorer.model_dir.check_model_reads`), the moses.ini and the files it names, the
    corpus and the tuning set, the memory the trainings and the rescoring need, Moses, and the
    working folder. Returns the models the build uses and the Moses installation; logs one line."""
    from phrase_scorer.experiments.preflight import (
        check_disk_holds, check_ini, check_moses, check_text_pair, log_checked,
    )
    from phrase_scorer.model_dir import check_model_reads
    from phrase_scorer.runtime.device import resolve_device

    check_options(options)
    unknown = [m for m in options.model_kinds if m not in MODEL_KINDS]
    if unknown:
        raise PhraseScorerError(f"no model kind {unknown[0]!r}", hint=f"the kinds are {', '.join(MODEL_KINDS)}")
    allowed = model_names(list(MODEL_KINDS), options.members, options.archs)
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise PhraseScorerError(f"no model {unknown[0]!r} to give", hint=Text(
            f"give one of {', '.join(allowed)} (further members with ", setting("members"), ")"))
    models = list(dict.fromkeys([*model_names(options.model_kinds, options.members, options.archs), *given]))
    if "forward" not in models:
        raise PhraseScorerError("every row needs the forward model",
                                hint=Text("keep forward in ", setting("model_kinds"), " or give one trained before"))
    to_train = [m for m in models if m not in given]
    device = resolve_device(options.device)
    side_by_side = side_by_side_threads(options, len(to_train), device.type) > 0
    check_ini(ini)
    pairs = check_text_pair(corpus, "the corpus")
    sentences = check_text_pair(tuning, "the tuning set")
    for name, folder in given.items():
        reverse, right_to_left = MODEL_KINDS[kind_and_seed(name)[0]]
        check_model_reads(folder, name, reverse=reverse, right_to_left=right_to_left, corpus=corpus, texts=tuning)
    resources = check_machine_holds(options, models, to_train, given, side_by_side)
    disk = check_disk_holds(work, options.experiment.nbest_size, sentences)
    installation = MosesInstallation.given(moses)
    check_moses(installation, options.experiment.decoder, options.experiment.mertdir)
    check_work_folder(work)
    check_models_keep_their_arch(work, to_train, options)
    log_checked(["the options", f"{len(given)} model{'s' if len(given) != 1 else ''} given", "the moses.ini",
                 f"the corpus ({pairs:,} pairs)", f"the tuning set ({sentences:,} sentences)", "Moses",
                 "the working folder", resources, disk])
    return BuildPlan(models, given, installation)


def _build(ini: Path, corpus: Tuple[str, str], tuning: Tuple[str, str], work: Path, plan: BuildPlan,
           options: BuildRerankerOptions, scoring_options: ScoringOptions) -> BuildResult:
    from phrase_scorer.rescoring.rescore import ensembles_by_name, feature_models
    from phrase_scorer.runtime.device import resolve_device
    from phrase_scorer.runtime.side_by_side import Task, run_side_by_side

    models, given, moses = plan.models, plan.given, plan.moses
    dev = EvalSet(set_name(tuning[0]), tuning[0], tuning[1])
    rows = candidates(models)
    to_train = [m for m in models if m not in given]
    threads_each = side_by_side_threads(options, len(to_train), resolve_device(options.device).type)
    clock = StepClock(total=(1 if threads_each else len(to_train)) + 4)

    vocabulary = vocabulary_choice(corpus, tuning, work, options) if to_train else "given"
    dirs: Dict[str, str] = dict(given)
    # a --budget is shared among the models trained here, or given whole to each when they train side by side
    training = replace(options, model_kinds=tuple(to_train), side_by_side=bool(threads_each))
    if threads_each:
        with clock.step("training", f"training the {', '.join(to_train)} models side by side "
                                    f"({threads_each} thread{'s' if threads_each > 1 else ''} each)"):
            folders = run_side_by_side([Task(name, trained_model, (name, corpus, tuning, work, vocabulary, training))
                                        for name in to_train], threads_each)
        dirs.update({name: os.fspath(folder) for name, folder in zip(to_train, folders)})
    else:
        for k, name in enumerate(to_train):
            with clock.step(f"training {name}", f"training the {name} model ({k + 1} of {len(to_train)})"):
                dirs[name] = os.fspath(trained_model(name, corpus, tuning, work, vocabulary, training))
            left = len(to_train) - k - 1
            if left and clock.times[f"training {name}"] > 60:  # a training that ran, not one reused
                log.info("about %s left for the other %d training(s), at this one's pace",
                         duration(clock.times[f"training {name}"] * left), left)

    with clock.step("decoding", f"decoding the tuning set's {options.experiment.nbest_size}-best list with Moses"):
        nbest = decoded_nbest(ini, dev, work, moses, options.experiment)

    ensemble = ensemble_members(models)
    forward = [("forward", FORWARD)] + ([(m, ENSEMBLE) for m in ensemble] if len(ensemble) > 1 else [])
    reverse = [("reverse", REVERSE)] if "reverse" in dirs else []
    with clock.step("rescoring", "rescoring the list with every feature"):
        loaded = ensembles_by_name(feature_models([dirs[m] for m, _ in forward], [dirs[m] for m, _ in reverse],
                                                  [f for _, f in forward], [f for _, f in reverse],
                                                  resolve_device(options.device)))
        rescored = rescored_nbest(nbest, dev, work, loaded, options.experiment, scoring_options)

    features = list(dict.fromkeys(m.name for m in loaded))  # an ensemble's models share one feature
    with clock.step("tuning", f"tuning {len(rows)} rows x {options.experiment.runs} optimiser seeds"):
        row_tuning = RowTuning({dev.name: rescored}, [dev], features, ini, work, moses, options.experiment)
        runs = {candidate.row.label: [tuned_row_run(candidate.row, seed, row_tuning)
                                      for seed in range(1, options.experiment.runs + 1)]
                for candidate in rows}

    with clock.step("choosing", "choosing the row and writing the reranker"):
        figures = {label: [r.scores[dev.name]["bleu"] for r in row_runs] for label, row_runs in runs.items()}
        chosen = choose([(c, statistics.mean(figures[c.row.label])) for c in rows], options.tie_margin)
        reranker = work / "reranker.json"
        flags = nbest_flags(options.experiment)
        step = Step(work / "reranker.inputs.json", {"row": asdict(chosen.row), "list": file_identity(rescored),
                                                    "runs": [asdict(r) for r in runs[chosen.row.label]],
                                                    "decoder flags": flags}, [reranker])
        if not step.done:
            with step:
                written = write_rerankers(runs[chosen.row.label], [chosen.row], rescored, work, flags,
                                          command=COMMAND, system=system_record(ini))
                write_text_atomically(reranker, Path(written[chosen.row.label]).read_text(encoding="utf-8"))
        moses_bleu = scores_of(first_hypotheses(nbest), read_lines(dev.reference), options.experiment)
    markdown = report(RowChoice(rows, figures, chosen, reranker, moses_bleu.bleu), dev, ini, dirs, vocabulary, options,
                      clock, {"BLEU": moses_bleu.bleu_signature, "chrF": moses_bleu.chrf_signature,
                              "reranker": Signature.from_json(json.loads(reranker.read_text(encoding="utf-8")),
                                                              reranker).line()})
    write_report(work, markdown, {"chosen": chosen.row.label, "reranker": os.fspath(reranker),
                                  "tuning BLEU per seed": figures, "Moses 1-best tuning BLEU": moses_bleu.bleu,
                                  "models": dirs, "vocabulary": vocabulary, "step seconds": clock.times})
    log.info("kept %s (tuning BLEU %.2f; Moses' 1-best %.2f): %s", chosen.row.label,
             statistics.mean(figures[chosen.row.label]), moses_bleu.bleu, reranker)
    return BuildResult(os.fspath(reranker), chosen.row.label, figures, markdown)


def check_work_folder(work: Path) -> None:
    """Refuse ``work`` unless it is new or empty, or one this command made (its mark,
    ``build-reranker.json``, says so): a folder holding anything else may hold the user's own
    files, which the build would write over."""
    mark = work / WORK_MARK
    if work.exists() and not (mark.is_file() and not mark.is_symlink()):
        if not work.is_dir() or any(work.iterdir()):
            raise PhraseScorerError("the working folder holds files build-reranker did not make", path=work,
                                    hint="give a new or empty folder (or the one an earlier build-reranker run made)")


def check_models_keep_their_arch(work: Path, to_train: Sequence[str], options: BuildRerankerOptions) -> None:
    """Refuse a build that would train one of ``to_train`` as another architecture than the one its
    folder in ``work`` was trained as (its step's record says): the old model would be removed to
    train the new one, hours of training lost to an option or a default that changed since."""
    for name in to_train:
        record = work / "models" / f"{name}.inputs.json"
        if record.is_symlink() or not record.is_file():
            continue  # none, or not this command's: the step refuses what it did not make
        recorded = (read_record(record) or {}).get("training")
        was = recorded.get("arch") if isinstance(recorded, dict) else None
        now = model_arch(name, options)
        if isinstance(was, str) and was != now:
            option = "reverse_arch" if kind_and_seed(name)[0] not in ENSEMBLED else "archs"
            raise PhraseScorerError(
                f"models/{name} was trained as {was}; this build would remove it to train a {now} in its place",
                path=work, hint=Text("give ", setting(option, was), " to go on with that build, or a new working "
                                     "folder for a new one"))


def claim_work_folder(work: Path) -> Path:
    """``work`` (:func:`check_work_folder`), made and marked as this command's."""
    mark = work / WORK_MARK
    check_work_folder(work)
    work.mkdir(parents=True, exist_ok=True)
    if not mark.exists():
        write_text_atomically(mark, json.dumps({"format": "phrase-scorer build-reranker folder", "version": 1}) + "\n")
    return work


@dataclass(frozen=True)
class RowChoice:
    """What the tuning chose: the candidate rows, each one's tuning BLEU per seed (row label ->
    figures), the row kept and its reranker file, and Moses' own 1-best tuning BLEU."""

    rows: Sequence[Candidate]
    figures: Dict[str, List[float]]
    chosen: Candidate
    reranker: Path
    moses_bleu: float


def report(choice: RowChoice, dev: EvalSet, ini: Path, dirs: Dict[str, str], vocabulary: str,
           options: BuildRerankerOptions, clock: StepClock, signatures: Dict[str, str]) -> str:
    rows, figures, chosen, reranker, moses_bleu = (choice.rows, choice.figures, choice.chosen, choice.reranker,
                                                   choice.moses_bleu)
    cells = [(c.row.label + (" **(kept)**" if c == chosen else ""), len(c.models), mean_sd(figures[c.row.label]),
              f"{statistics.mean(figures[c.row.label]) - moses_bleu:+.2f}") for c in rows]
    cells.insert(0, ("Moses 1-best", 0, two_decimals(moses_bleu), NONE))
    steps = table(["step", "time"], [(what, duration(seconds)) for what, seconds in clock.times.items()])
    return (
        f"**Reranker of `{ini}`**, tuned on {dev.name} (`{dev.source}`)\n\n"
        + table(["row", "models", f"BLEU {dev.name} (mean ± sd over seeds)", "Δ vs Moses"], cells) + "\n\n"
        f"Kept: {chosen.row.label}, the fewest models among the rows within {options.tie_margin:g} BLEU of the best "
        f"mean; its reranker is the weights of its seed with the best tuning BLEU: `{reranker}`. "
        "All figures are of the tuning set the weights were tuned on, not a test result.\n\n"
        f"New text through the whole system:\n\n    phrase-scorer translate-system --moses {ini} --reranker {reranker} "
        "INPUT -o OUTPUT\n\n"
        "Settings:\n\n"
        + "".join(f"- {name}: `{path}`\n" for name, path in dirs.items())
        + f"- vocabulary: {vocabulary}; {', '.join(options.archs)} (reverse: {options.reverse_arch}) "
        f"`{options.preset}`, batch {options.batch_size}, "
        f"{options.max_steps} updates at most"
        + (f", {options.members} members (seeds) of each left-to-right kind" if options.members > 1 else "")
        + (f", {options.training_hours:g} h of training in all" if options.training_hours else "") + "\n"
        f"- n-best lists: {options.experiment.nbest_size} distinct, decoder flags "
        f"`{nbest_flags(options.experiment)}`; {options.experiment.method}, {options.experiment.restarts} restarts, "
        f"seeds 1–{options.experiment.runs}\n"
        + f"- the reranker's signature: `{signatures['reranker']}`\n"
        + closing_lines(signatures) + "\nTime per step (this run; a reused step takes seconds):\n\n" + steps + "\n"
    )
