"""The step Moses' Experiment Management System (EMS, ``experiment.perl``) runs to add the features.

EMS builds a system from one config file and re-runs a step only when something it depends on
changed. This module is the command behind one EMS config line::

    [TRAINING]
    binarize-all = "phrase-scorer ems-config --preset small"
    ttable-binarizer = ""

EMS's ``binarize-config`` step runs ``$binarize-all IN OUT -Binarizer "$ttable-binarizer"``, IN
being the moses.ini its ``create-config`` step wrote (``model/moses.ini.N``) and OUT the config
that tuning and evaluation then use (``model/moses.bin.ini.N``). :func:`build_ems_config` trains
the model on IN's phrase table (or takes a trained one), annotates the table, binarises it when
``-Binarizer`` names a Moses binariser, and writes OUT with the phrase-table feature pointing at
the new table, ``num-features`` raised and the new columns' start weights appended
(:func:`phrase_scorer.moses.ini_patch.patch_moses_ini` makes that change).

Why this step. ``binarize-config`` is the one EMS step that takes a whole moses.ini and hands a
new one to tuning and evaluation, and its re-run rule covers what matters here: EMS re-runs it
(and tuning, evaluation, the report) when the ``binarize-all`` value changes or when
``create-config`` re-ran, and re-uses it otherwise. Nothing upstream (word alignment, phrase
extraction, scoring) re-runs for a model option. The other hooks fall short:
``custom-phrase-table-pruning`` declares no ``rerun-on-change``, so EMS ignores a changed command;
``create-config`` and the tuning and evaluation filters all write the table's ``num-features``
through ``train-model.perl``, so patching only one of them leaves the others at 4 (EMS's
``apply-filter`` copies the filtered feature line back over the patched one); a wrapper given as
``[TRAINING] script`` would carry the options into every training step's re-run rule, word
alignment included. With ``binarize-all`` set, EMS does not filter the tables for tuning and
evaluation; the decoder loads the whole table, as with Moses' own ``binarize-model.perl``.

Re-running by hand. EMS runs a step again under the same number after a crash (``-continue``);
then this step resumes training from its checkpoint, re-uses a finished annotation (its signature
``OUT.json`` matches) and a binary table newer than it, and resumes an interrupted annotation.

Files, next to OUT (EMS deletes them with the step's version)::

    OUT.rnn-model/            the model (unless --model names one)
    OUT.phrase-table.gz       the annotated text table, with its signature .json
    OUT.phrase-table.minphr   (or .probing/, .ondisk/) the binary table, if -Binarizer names one

torch is imported only inside :func:`build_ems_config`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
from dataclasses import dataclass, field
from typing import List, Optional, Set

from phrase_scorer.config import AnnotateOptions, ModelConfig, MosesIniOptions, RunOptions, ScoringOptions, TrainConfig
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import file_key, new_temporary, remove_if_same
from phrase_scorer.io.paths import PathLike, part_path
from phrase_scorer.io.outputs import OutputKind, check_output
from phrase_scorer.io.moses_ini import TEXT_TABLE_TYPES, MosesIni, binary_table_file
from phrase_scorer.moses.ini_patch import patch_moses_ini
from phrase_scorer.moses.binarise import BINARIZERS

log = logging.getLogger(__name__)

#: What ``-Binarizer`` says when ``ttable-binarizer`` asks for no binary table.
NO_BINARIZER = ("", "none")

#: Suffixes of the files this step writes next to its output config.
MODEL_SUFFIX = ".rnn-model"
TABLE_SUFFIX = ".phrase-table.gz"
BINARY_SUFFIXES = {
    "PhraseDictionaryCompact": ".phrase-table.minphr",
    "ProbingPT": ".phrase-table.probing",
    "PhraseDictionaryOnDisk": ".phrase-table.ondisk",
}


@dataclass(frozen=True)
class BinaryTarget:
    """The binary table a ``ttable-binarizer`` command asks for."""

    feature_type: str  # PhraseDictionaryCompact, ProbingPT or PhraseDictionaryOnDisk
    program: str  # absolute path of the Moses program
    moses_home: str  # the folder whose bin/ holds it
    ignored: List[str] = field(default_factory=list)  # its arguments, replaced by ours


def parse_binarizer(command: Optional[str]) -> Optional[BinaryTarget]:
    """Read EMS's ``ttable-binarizer`` value: None for a text table, else the binary table type.

    The program's name picks the type (``processPhraseTableMin``: compact, ``CreateProbingPT``:
    probing, ``CreateOnDiskPt``: on-disk). Its arguments are not used: EMS's usual
    ``CreateOnDiskPt 1 1 4 100 2`` names 4 scores, and the annotated table has more, so the
    program is run with the score count of the new table (see
    :func:`phrase_scorer.io.moses_ini.binarize_command`).
    """
    text = (command or "").strip()
    if text in NO_BINARIZER:
        return None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise PhraseScorerError(Text(setting("binarizer", repr(text)), f" cannot be read ({exc})"),
                                hint="set ttable-binarizer to a Moses binariser, "
                                     "e.g. $moses-bin-dir/processPhraseTableMin") from None
    program, arguments = words[0], words[1:]
    by_program = {name: kind for kind, name in BINARIZERS.items()}
    name = os.path.basename(program)
    if name not in by_program:
        raise PhraseScorerError(
            Text(setting("binarizer", repr(program)), " is not a phrase-table binariser this step knows"),
            hint=f"set ttable-binarizer to one of {', '.join(sorted(by_program))} (with its path), "
            "or to \"\" for a text table",
        )
    found = program if os.sep in program else shutil.which(program)
    if not found or not (os.path.isfile(found) and os.access(found, os.X_OK)):
        raise PhraseScorerError("binariser is not an executable file", path=program,
                                hint="ttable-binarizer must name the program, e.g. $moses-bin-dir/" + name)
    found = os.path.abspath(found)
    bin_dir = os.path.dirname(found)
    if os.path.basename(bin_dir) != "bin":
        raise PhraseScorerError("the binariser must be in a Moses bin/ folder", path=found,
                                hint="point ttable-binarizer at $moses-bin-dir/" + name)
    return BinaryTarget(by_program[name], found, os.path.dirname(bin_dir), arguments)


def phrase_table_file(ini: MosesIni, path_value: str, line: int) -> str:
    """The file Moses reads for a text table's ``path=``: the path, or the path with ``.gz``.

    EMS names tables by their stem (``model/phrase-table.N``) while train-model.perl writes
    ``model/phrase-table.N.gz``; Moses and the filter script try ``.gz`` when the stem is absent.
    """
    path = ini.resolve(path_value)
    for candidate in (path, path + ".gz"):
        if os.path.isfile(candidate):
            return candidate
    raise ini.error(f"the phrase table {path_value} does not exist (nor {path_value}.gz)", line,
                    "this config must come from EMS's create-config step, after build-ttable")


def last_logged_step(model_dir: PathLike) -> Optional[int]:
    """The step of the last validation record in a model's training log, None if there is none."""
    from phrase_scorer.model_dir import TRAIN_LOG

    last = None
    try:
        with open(os.path.join(os.fspath(model_dir), TRAIN_LOG), encoding="utf-8") as f:
            for text in f:
                try:
                    last = int(json.loads(text)["step"])
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        return None
    return last


@dataclass
class EmsResult:
    """What :func:`build_ems_config` did."""

    config: str  # the moses.ini written
    table: str  # the text table read
    model_dir: str
    annotated: str  # the annotated text table
    phrase_table: str  # the path= now in the config (the binary table, if any)
    feature_name: str
    num_features: int
    training: str  # "trained", "resumed", "finished before" or "given"
    annotation: str  # "annotated", "resumed" or "finished before"
    binarized: Optional[str] = None  # "built" or "built before"; None for a text table
    ignored_binarizer_arguments: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class ModelTraining:
    """How the step trains its model when none is given, as
    :func:`phrase_scorer.training.run.train` takes it: the training settings, the network (None:
    the settings' preset) and the names of the settings given explicitly (None: none)."""

    config: TrainConfig = TrainConfig()
    model_config: Optional[ModelConfig] = None
    explicit: Optional[Set[str]] = None


def build_ems_config(
    ini_in: PathLike,
    ini_out: PathLike,
    *,
    binarizer: Optional[str] = None,
    model_dir: Optional[PathLike] = None,
    training: ModelTraining = ModelTraining(),
    annotate_options: AnnotateOptions = AnnotateOptions(),
    scoring_options: ScoringOptions = ScoringOptions(),
    feature_name: Optional[str] = None,
) -> EmsResult:
    """EMS's ``binarize-config`` step: ``ini_in`` (create-config's moses.ini) -> ``ini_out``.

    Trains a model on ``ini_in``'s phrase table into ``ini_out.rnn-model`` (or uses
    ``model_dir``), annotates the table, binarises it if ``binarizer`` names a Moses binariser,
    and writes ``ini_out`` for the new table. ``training`` says how the model is trained (and the
    device it then annotates on).
    """
    from phrase_scorer.scoring.annotate import annotate, finished_annotation
    from phrase_scorer.runtime.device import resolve_device
    from phrase_scorer.model_dir import ModelDirectory, load_model
    from phrase_scorer.scoring.batch_scorer import BatchScorer
    from phrase_scorer.training.run import train

    ini_in, ini_out = os.fspath(ini_in), os.fspath(ini_out)
    # EMS numbers its steps' outputs and re-runs a step into the same OUT: an existing OUT is
    # replaced, but never when it is the input (by device and inode) or not a regular file.
    with check_output(ini_out, [("the input config", ini_in)], overwrite=True,
                      kind=OutputKind("the output config", regular_only=True)):
        target = parse_binarizer(binarizer)
        ini = MosesIni.read(ini_in)
        feature = ini.find_phrase_table(feature_name)
        if feature.type not in TEXT_TABLE_TYPES:
            raise ini.error(
                f"{feature.name} is a {feature.type}; this step reads the text table create-config declares",
                feature.line.number, "leave binarising to this step: set ttable-binarizer, not a binary table type",
            )
        table = phrase_table_file(ini, feature.get("path") or "", feature.line.number)

        # 1. the model
        if model_dir is not None:
            trained = "given"
        else:
            model_dir = ini_out + MODEL_SUFFIX
            resume = ModelDirectory(model_dir).exists()
            before = last_logged_step(model_dir) if resume else None
            state = train(table, model_dir, training.config, resume=resume, model_config=training.model_config,
                          explicit=training.explicit)
            trained = "trained" if not resume else "finished before" if state.step == before else "resumed"
        loaded = load_model(model_dir, resolve_device(training.config.device))

        # 2. the annotated text table
        annotated = ini_out + TABLE_SUFFIX
        scoring = BatchScorer(loaded.model, scoring_options).describe()
        if finished_annotation(table, annotated, loaded, annotate_options, scoring) is not None:
            log.info("%s is already the annotation of %s with this model and options; kept", annotated, table)
            annotation = "finished before"
        else:
            annotation = "annotated"
            if part_path(annotated).exists():
                try:
                    annotate(table, annotated, loaded, annotate_options, scoring_options,
                             run=RunOptions(resume=True, overwrite=True))
                    annotation = "resumed"
                except PhraseScorerError as exc:
                    log.info("not resuming the earlier annotation (%s); starting again", exc)
            if annotation == "annotated":
                annotate(table, annotated, loaded, annotate_options, scoring_options, run=RunOptions(overwrite=True))
        added = len(annotate_options.columns)

        # 3. the config (and the binary table)
        if target is None:
            patch = MosesIniOptions(add_features=added, feature_name=feature.name, absolute_paths=True)
            result = patch_moses_ini(ini_in, ini_out, phrase_table=os.path.abspath(annotated), options=patch,
                                     overwrite=True)
            binarized = None
        else:
            binary = os.path.abspath(ini_out + BINARY_SUFFIXES[target.feature_type])
            opened = binary_table_file(target.feature_type, binary)
            fresh = annotation == "finished before" and os.path.exists(opened) and \
                os.path.getmtime(opened) >= os.path.getmtime(annotated)
            # the input with the binary table type, for patch_moses_ini: a new file beside OUT, made by this run
            start, end, _ = feature.line.tokens()[0]
            feature.line.text = feature.line.text[:start] + target.feature_type + feature.line.text[end:]
            fd, declared = new_temporary(ini_out + ".declared.ini")
            key = file_key(os.fstat(fd))
            with os.fdopen(fd, "wb") as f:
                f.write(ini.text().encode("utf-8"))
            try:
                patch = MosesIniOptions(add_features=added, feature_name=feature.name, absolute_paths=True)
                result = patch_moses_ini(declared, ini_out, phrase_table=binary, options=patch,
                                         binarize_from=None if fresh else annotated, moses_home=target.moses_home,
                                         overwrite=True)
            finally:
                remove_if_same(declared, key)
            binarized = "built before" if fresh else "built"
        return EmsResult(
            config=ini_out, table=table, model_dir=os.fspath(model_dir), annotated=annotated,
            phrase_table=result.table_path, feature_name=result.feature_name, num_features=result.new_num_features,
            training=trained, annotation=annotation, binarized=binarized,
            ignored_binarizer_arguments=list(target.ignored) if target else [],
        )
