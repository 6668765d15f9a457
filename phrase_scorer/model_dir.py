"""The model directory: fixed file names, safe loading.

    MODEL_DIR/
      config.json          model sizes, training settings, vocabulary sizes and SHA-256s, package version
      vocab.source.json    source shortlist
      vocab.target.json    target shortlist
      subwords.*.model     a subword model's sentencepiece models (train --vocabulary bpe|unigram)
      model.pt             best weights so far (lowest validation NLL): used for scoring
      checkpoint.pt        last state: weights, optimiser, data position (for --resume)
      train.log.jsonl      one JSON record per validation
      cache/               the pair cache, word ids read with pread (can be deleted once trained)

Weights are read with ``torch.load(..., weights_only=True)``, which refuses pickled code, and
checked against the config and vocabularies before a model is built. ``config.json`` records
the SHA-256 of each vocabulary (``vocab_sha256``: ``source`` and ``target``, of the vocabulary as
:meth:`~phrase_scorer.vocab.Vocabulary.to_json` writes it), written with the vocabularies and
checked at every load, so vocabularies swapped for another model's of the same size are refused
instead of scoring garbage. A config.json without the key (written by earlier versions) loads
as before. Every size of the model section is a whole number in its range
(:class:`~phrase_scorer.config.ModelConfig`), checked before anything is allocated. A config.json
of a newer ``version`` than this package reads is refused (upgrade the package).

Every weights file training writes (``model.pt``, ``checkpoint.pt``, ``recent/step-N.pt``)
records the model its weights were trained as (``trained_as``, :func:`weights_identity`: the
architecture and its sizes, the target's reading order, the SHA-256s of the vocabularies and of
a subword model's sentencepiece models), and every load checks it against the directory's config
and vocabularies (:func:`check_trained_as`): another model's weights of the same shapes copied
into the directory (a reverse or a right-to-left model's) are refused instead of scoring
garbage. In ``model.pt`` and ``recent/`` it is one more entry of the state dict; in a checkpoint
an entry beside ``model``. Weights written before the record existed load as they did.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional, Tuple, cast

import torch

from phrase_scorer import __version__
from phrase_scorer.config import MAX_SHORTLIST, AnyModelConfig, check_whole_number, model_config_from_dict
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_sha256
from phrase_scorer.io.paths import PathLike
from phrase_scorer.models.architectures import uninitialised_model
from phrase_scorer.models.base import TranslationModel
from phrase_scorer.subwords import SubwordVocabulary, load_vocabulary, segmentation_records
from phrase_scorer.vocab import Vocabulary

from phrase_scorer.io.model_layout import (  # noqa: F401  (the names of a model directory's files)
    BEST_WEIGHTS, CACHE, CHECKPOINT, CONFIG, CONFIG_VERSION, MODEL_FILES, MODEL_STATE_FILES, RECENT_WEIGHTS,
    SOURCE_SUBWORDS, SOURCE_VOCAB, TARGET_SUBWORDS, TARGET_VOCAB, TRAIN_LOG, refuse_newer_version,
)

MODEL_FORMAT = "phrase-scorer-model"
VOCAB_HASHES = "vocab_sha256"  # config.json's record of the vocabularies: {"source": sha256, "target": sha256}
VOCAB_FILES = {"source": SOURCE_VOCAB, "target": TARGET_VOCAB}
SUBWORDS = "subwords"  # config.json's record of a subword model's sentencepiece models: {side: {file, sha256, ...}}
TRAINED_AS = "trained_as"  # a weights file's record of the model its weights were trained as (weights_identity)
COPY_WHOLE = "copy the whole model directory, not one file"


def vocab_hashes(source_vocab: Vocabulary, target_vocab: Vocabulary) -> Dict[str, str]:
    """config.json's ``vocab_sha256`` section for these vocabularies."""
    return {"source": source_vocab.sha256(), "target": target_vocab.sha256()}


def config_record(*, preset: str, model: AnyModelConfig, source_vocab: Vocabulary, target_vocab: Vocabulary,
                  training: Dict[str, Any], data_kind: str, data_info: Dict[str, Any]) -> Dict[str, Any]:
    """config.json of a new model, its schema in one place (:meth:`ModelDirectory.write_config` adds
    the format, its version and the package version): the preset, the network's settings, the
    vocabularies' sizes and SHA-256s, the training settings, and what it was trained on under
    ``data_kind`` (``phrase_table`` or ``corpus``)."""
    subwords = segmentation_records(source_vocab, target_vocab)
    return {
        "preset": preset,
        "model": model.to_dict(),
        "source_vocab_size": len(source_vocab),
        "target_vocab_size": len(target_vocab),
        "vocab_sha256": vocab_hashes(source_vocab, target_vocab),
        **({SUBWORDS: subwords} if subwords else {}),  # a word model's config.json as before
        "training": training,
        data_kind: data_info,
    }


def weights_identity(model: AnyModelConfig, source_vocab: Vocabulary, target_vocab: Vocabulary) -> Dict[str, Any]:
    """What gives weights their meaning, as a weights file records it (``trained_as``): the
    architecture and its sizes (the whole-number settings of the model section), whether the
    target is read right to left, and the SHA-256s of the two vocabularies (a reverse model's are
    this model's, swapped) and of a subword model's sentencepiece models."""
    sides = (("source", source_vocab), ("target", target_vocab))
    return {
        "arch": model.arch,
        "sizes": {name: value for name, value in model.to_dict().items() if type(value) is int},
        "right_to_left": bool(target_vocab.right_to_left),
        "vocab_sha256": vocab_hashes(source_vocab, target_vocab),
        "subwords_sha256": {side: vocab.model_sha256() for side, vocab in sides
                            if isinstance(vocab, SubwordVocabulary)},
    }


_IDENTITY_TYPES = {"arch": str, "sizes": dict, "right_to_left": bool, "vocab_sha256": dict, "subwords_sha256": dict}


def check_trained_as(record: Any, expected: Dict[str, Any], path: PathLike) -> None:
    """Refuse weights (at ``path``) whose record of the model they were trained as (``record``,
    None: written before weights recorded it, which load as they did) differs from what the
    directory's config and vocabularies describe (``expected``, :func:`weights_identity`). A
    setting the record does not hold is not compared."""
    if record is None:
        return
    if not isinstance(record, dict) or any(key in record and type(record[key]) is not kind
                                           for key, kind in _IDENTITY_TYPES.items()):
        raise PhraseScorerError(f"damaged: its record of the model the weights were trained as ({TRAINED_AS}) is not "
                                "readable", path=path, hint="restore the file, or train the model again")
    found = {**expected, **{key: record[key] for key in _IDENTITY_TYPES if key in record}}

    def refuse(what: str) -> None:
        raise PhraseScorerError(f"the weights were trained {what}", path=path, hint=COPY_WHOLE)

    if found["arch"] != expected["arch"]:
        a = {arch: "an" if arch[:1] in "aeiou" else "a" for arch in (found["arch"], expected["arch"])}
        refuse(f"as {a[found['arch']]} {found['arch']} model, but config.json describes "
               f"{a[expected['arch']]} {expected['arch']} model")
    if found["right_to_left"] != expected["right_to_left"]:
        order = {True: "a right-to-left model (the target read last word first)", False: "a left-to-right model"}
        refuse(f"as {order[found['right_to_left']]}, but config.json describes {order[expected['right_to_left']]}")
    hashes, ours = {side: found["vocab_sha256"].get(side) for side in VOCAB_FILES}, expected["vocab_sha256"]
    if hashes != ours:
        if hashes == {"source": ours["target"], "target": ours["source"]}:
            refuse("as a reverse model (target to source), but config.json describes a forward model "
                   "(source to target)")
        sides = " and ".join(VOCAB_FILES[side] for side in VOCAB_FILES if hashes.get(side) != ours[side])
        refuse(f"with other vocabularies (they do not match {sides})")
    if found["subwords_sha256"] != expected["subwords_sha256"]:
        refuse("with another subword segmentation (its sentencepiece models differ from this directory's)")
    sizes = [name for name, value in found["sizes"].items()
             if name in expected["sizes"] and value != expected["sizes"][name]]
    if sizes:
        refuse("with other sizes (" + ", ".join(f"{name} {found['sizes'][name]}, config.json "
                                                f"{expected['sizes'][name]}" for name in sizes) + ")")


def check_zip_crcs(path: PathLike) -> None:
    """Refuse a weights file in PyTorch's zip format whose bytes changed since it was written:
    torch.load does not check the CRC-32 the archive records for each of its files, and a byte
    changed inside a tensor would load as another weight."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except FileNotFoundError:
        raise PhraseScorerError("file is missing", path=path) from None
    except Exception as exc:  # what zipfile raises on a damaged archive: BadZipFile, ValueError, ...
        raise PhraseScorerError(f"not a readable PyTorch weights file (damaged: {type(exc).__name__})",
                                path=path, hint="restore the file, or train the model again") from None
    if damaged is not None:
        raise PhraseScorerError(f"not a readable PyTorch weights file (damaged: the bytes of {damaged!r} changed "
                                "since it was saved)", path=path, hint="restore the file, or train the model again")


def safe_torch_load(path: PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load`` with ``weights_only=True``: tensors and plain containers only, never code;
    a file in PyTorch's zip format is first checked against its CRC-32s (:func:`check_zip_crcs`)."""
    try:
        if zipfile.is_zipfile(path):
            check_zip_crcs(path)
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise PhraseScorerError("file is missing", path=path) from None
    except pickle.UnpicklingError as exc:
        code = re.search(r"unsupported GLOBAL \S+|Unsupported global: \S+", str(exc), re.IGNORECASE)
        if code is None:
            raise PhraseScorerError("not a readable PyTorch weights file (damaged, or not saved by torch.save)",
                                    path=path, hint="model files must contain tensors only") from None
        raise PhraseScorerError(
            f"refused to load: the file holds more than weights ({code.group(0)})",
            path=path,
            hint="model files must contain tensors only; never load model files from an untrusted source",
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError, IndexError, KeyError, TypeError, AttributeError,
            UnicodeDecodeError, struct.error) as exc:  # what torch's unpickler raises on damaged bytes
        raise PhraseScorerError("not a readable PyTorch weights file "
                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                                path=path) from None


@dataclass
class LoadedModel:
    """A model ready to score, with everything that describes it."""

    model: TranslationModel
    source_vocab: Vocabulary
    target_vocab: Vocabulary
    config: AnyModelConfig
    directory: Path
    weights_path: Path
    weights_sha256: str


class _WriteErrors:
    """A binary file for ``torch.save`` that keeps the OSError a write raised (a full disk, a
    file-size limit): torch's zip writer replaces it by ``RuntimeError: [enforce fail at
    inline_container.cc] ... unexpected pos``, which names neither the file nor the cause."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.file.flush()


class ModelDirectory:
    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)
        self._trained_as: Optional[Dict[str, Any]] = None  # weights_identity of config.json, once read

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def cache_dir(self) -> Path:
        return self.path / CACHE

    def exists(self) -> bool:
        return (self.path / CONFIG).is_file()

    # --- writing -----------------------------------------------------------------------------

    def write_config(self, data: Dict[str, Any]) -> None:
        data = {"format": MODEL_FORMAT, "version": CONFIG_VERSION, "package_version": __version__, **data}
        self._trained_as = None
        write_text_atomically(self.path / CONFIG, json.dumps(data, indent=2, sort_keys=False) + "\n")

    def update_config(self, **sections: Any) -> None:
        """Add or replace top-level sections of config.json."""
        write_text_atomically(self.path / CONFIG, json.dumps({**self.read_config(), **sections}, indent=2) + "\n")

    def save_weights(self, state: Dict[str, Any], name: str) -> None:
        """Save a state dict (or checkpoint dict) atomically, with the record of the model the
        weights are trained as (``trained_as``: :meth:`trained_as`) as one more entry."""
        saved = type(state)(state)
        if hasattr(state, "_metadata"):  # what load_state_dict reads of a module's own version
            saved._metadata = state._metadata  # type: ignore[attr-defined]
        saved[TRAINED_AS] = self.trained_as()
        from phrase_scorer.io.atomic import AtomicOutput
        from phrase_scorer.io.os_errors import describe_os_error

        target = self.path / name
        try:
            with AtomicOutput(target) as out:  # a new temporary file, never one already there
                written = _WriteErrors(out.file)
                try:
                    torch.save(saved, cast(BinaryIO, written))  # a file's writer that names its failures
                except RuntimeError:  # torch's zip writer reports a failed write as its own error
                    if written.error is None:
                        raise
                    raise written.error from None
                out.commit()
        except OSError as exc:
            raise describe_os_error(exc, target) from None

    def truncate_log(self, last_step: int) -> None:
        """Drop training-log records after ``last_step`` (a resumed run writes them again)."""
        path = self.path / TRAIN_LOG
        if not path.exists():
            return
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= last_step:
                    kept.append(line)
            except ValueError:
                continue  # a line cut short by a kill
        write_text_atomically(path, "".join(l + "\n" for l in kept))

    def append_log(self, record: Dict[str, Any]) -> None:
        with open(self.path / TRAIN_LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps(record) + "\n")

    # --- reading -----------------------------------------------------------------------------

    def read_config(self) -> Dict[str, Any]:
        if not self.path.exists():
            raise PhraseScorerError("model directory does not exist", path=self.path,
                                    hint="train one with 'phrase-scorer train'")
        if not self.path.is_dir():
            raise PhraseScorerError("is not a model directory", path=self.path)
        path = self.path / CONFIG
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PhraseScorerError(
                f"not a phrase-scorer model directory (no {CONFIG})", path=self.path,
                hint="train one with 'phrase-scorer train'",
            ) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise PhraseScorerError(f"config is not valid JSON ({exc})", path=path) from None
        if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
            raise PhraseScorerError("not a phrase-scorer model config", path=path)
        refuse_newer_version(data.get("version"), CONFIG_VERSION, path=path, what="config",
                             damaged_hint="use the config.json saved with this model")
        return data

    def trained_as(self) -> Dict[str, Any]:
        """What config.json and the vocabularies say the directory's weights were trained as
        (:func:`weights_identity`), checked as every load checks them."""
        if self._trained_as is None:
            data = self.read_config()
            self._trained_as = weights_identity(self.model_config(data), *self.vocabularies(data))
        return self._trained_as

    def model_config(self, data: Optional[Dict[str, Any]] = None) -> AnyModelConfig:
        """The model section, as its architecture's config ("arch"; none: the encoder-decoder)."""
        data = data if data is not None else self.read_config()
        try:
            return model_config_from_dict(data["model"])
        except PhraseScorerError as exc:  # a size of the wrong type or out of its range
            raise PhraseScorerError(exc.message, path=self.path / CONFIG,
                                    hint="correct it, or use the config.json saved with this model") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise PhraseScorerError(f"config has no valid 'model' section ({exc})", path=self.path / CONFIG) from None

    def vocabularies(self, data: Optional[Dict[str, Any]] = None) -> Tuple[Vocabulary, Vocabulary]:
        """The source and target vocabularies, checked against what config.json records of them:
        their SHA-256 (``vocab_sha256``) and sizes, where it records them."""
        data = data if data is not None else self.read_config()
        vocabs = {side: load_vocabulary(self.path / name) for side, name in VOCAB_FILES.items()}
        config = self.path / CONFIG
        hashes = data.get(VOCAB_HASHES)
        if hashes is not None and not (isinstance(hashes, dict)
                                       and all(isinstance(hashes.get(side), str) for side in VOCAB_FILES)):
            raise PhraseScorerError(f"'{VOCAB_HASHES}' is not a record of the two vocabularies' SHA-256", path=config,
                                    hint="use the config.json saved with this model")
        for side, vocab in vocabs.items():
            size = data.get(f"{side}_vocab_size")
            if size is not None:
                try:
                    check_whole_number(f"{side}_vocab_size", size, 4, MAX_SHORTLIST + 3)
                except PhraseScorerError as exc:
                    raise PhraseScorerError(exc.message, path=config,
                                            hint="use the config.json saved with this model") from None
            redo = "put back the vocabulary saved with this model, or train the model again"
            if hashes is not None and vocab.sha256() != hashes[side]:
                raise PhraseScorerError("is not the vocabulary these weights were trained with (its SHA-256 differs "
                                        "from the one config.json records)", path=self.path / VOCAB_FILES[side],
                                        hint=redo)
            if size is not None and size != len(vocab):
                raise PhraseScorerError(f"holds {len(vocab)} entries, but config.json records {size}",
                                        path=self.path / VOCAB_FILES[side], hint=redo)
            self.check_subwords(data, side, vocab)
        return vocabs["source"], vocabs["target"]

    def check_subwords(self, data: Dict[str, Any], side: str, vocab: Vocabulary) -> None:
        """A subword model's segmentation is the one config.json records (its SHA-256); a word
        model's config.json records none."""
        record = data.get(SUBWORDS, {})
        expected = record.get(side) if isinstance(record, dict) else None
        config = self.path / CONFIG
        if not isinstance(vocab, SubwordVocabulary):
            if expected is not None:
                raise PhraseScorerError(f"config.json records a subword model for the {side} side, but its vocabulary "
                                        "has none", path=self.path / VOCAB_FILES[side],
                                        hint="put back the vocabulary saved with this model")
            return
        if not (isinstance(expected, dict) and isinstance(expected.get("sha256"), str)):
            raise PhraseScorerError(f"records no subword model for the {side} side, but its vocabulary has one",
                                    path=config, hint="use the config.json saved with this model")
        if expected["sha256"] != vocab.model_sha256():
            raise PhraseScorerError("is not the subword model these weights were trained with (its SHA-256 differs "
                                    "from the one config.json records)", path=self.path / vocab.file_name,
                                    hint="put back the file saved with this model, or train the model again")

    def load(self, device: Any = "cpu", weights: str = BEST_WEIGHTS) -> LoadedModel:
        """Build the model from its directory, checking that every part agrees with the others."""
        data = self.read_config()
        config = self.model_config(data)
        source_vocab, target_vocab = self.vocabularies(data)
        weights_path = self.path / weights
        if not weights_path.exists():
            hint = ("training has not reached its first validation yet" if (self.path / CHECKPOINT).exists()
                    else "train the model first")
            raise PhraseScorerError("the model has no trained weights", path=weights_path, hint=hint)
        state = safe_torch_load(weights_path)
        if not isinstance(state, dict):
            raise PhraseScorerError("weights file does not hold a state dict", path=weights_path)
        trained_as = state.pop(TRAINED_AS, None)
        if "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # a training checkpoint
        # the shapes the config calls for, without allocating a weight
        skeleton = uninitialised_model(config, len(source_vocab), len(target_vocab), "meta")
        check_state_matches(skeleton, state, weights_path)
        # weights of the same shapes may still be another model's (a reverse or right-to-left one)
        check_trained_as(trained_as, weights_identity(config, source_vocab, target_vocab), weights_path)
        model = uninitialised_model(config, len(source_vocab), len(target_vocab))  # every weight loaded next
        model.load_state_dict(state)
        model.to(device)
        model.eval()
        return LoadedModel(
            model=model,
            source_vocab=source_vocab,
            target_vocab=target_vocab,
            config=config,
            directory=self.path,
            weights_path=weights_path,
            weights_sha256=file_sha256(weights_path),
        )


def check_state_matches(model: torch.nn.Module, state: Dict[str, Any], path: PathLike) -> None:
    """Refuse weights whose names or shapes disagree with the config and vocabularies."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(map(repr, set(state) - set(expected)))
    if missing or unexpected:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise PhraseScorerError(f"weights do not belong to this model ({detail})", path=path)
    for name, tensor in expected.items():
        value = state[name]
        if not isinstance(value, torch.Tensor) or value.shape != tensor.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise PhraseScorerError(
                f"weight {name} has shape {shape}, but config.json and the vocabularies call for {tuple(tensor.shape)}",
                path=path,
                hint="the config, vocabularies and weights come from different models",
            )
        if not value.is_floating_point():
            raise PhraseScorerError(f"weight {name} holds {value.dtype} values, not floating-point numbers", path=path)
        if not torch.isfinite(value).all():
            raise PhraseScorerError(f"weight {name} holds NaN or infinite values", path=path)


def load_model(path: PathLike, device: Any = "cpu") -> LoadedModel:
    return ModelDirectory(path).load(device)


def recent_weight_files(folder: Path) -> list:
    """The kept weight files of ``folder``, oldest first."""
    return sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1])) if folder.is_dir() else []


def average_weights(paths, trained_as: Optional[Dict[str, Any]] = None) -> Dict[str, torch.Tensor]:
    """The element-wise mean of the state dicts in ``paths`` (summed in fp64, each tensor back
    in its own dtype), each file's record of the model it was trained as checked against
    ``trained_as`` (a directory's :meth:`~ModelDirectory.trained_as`) when given."""
    total: Dict[str, torch.Tensor] = {}
    dtypes: Dict[str, torch.dtype] = {}
    for path in paths:
        state = safe_torch_load(path)
        record = state.pop(TRAINED_AS, None)
        if trained_as is not None:
            check_trained_as(record, trained_as, path)
        for name, tensor in state.items():
            dtypes[name] = tensor.dtype
            total[name] = total.get(name, 0) + tensor.double()
    return {name: (tensor / len(paths)).to(dtypes[name]) for name, tensor in total.items()}


# --- what a model reads: its direction and its languages ----------------------------------------

#: Lines of each text a model's vocabularies are measured on when its record of the corpus does not
#: decide (:func:`check_model_reads`): enough for shares that differ by tens of points
SAMPLE_LINES = 2000


def known_share(vocab: Vocabulary, words: list) -> float:
    """How well ``vocab`` reads ``words``: the mean over the words of 1 / the pieces a word takes,
    0 for one read as ``<unk>``: the share of the words in the shortlist for a word vocabulary; for
    subword pieces, a text in the language they were learnt on takes fewer pieces per word."""
    from phrase_scorer.vocab import UNK_ID

    total = 0.0
    for word in words:
        ids = vocab.encode([word])
        total += 0.0 if UNK_ID in ids else 1.0 / max(len(ids), 1)
    return total / max(len(words), 1)


def _sample_words(path: PathLike) -> list:
    from itertools import islice

    from phrase_scorer.io.inputs import TextLines

    return [word for _, line in islice(TextLines(path), SAMPLE_LINES) for word in line.split()]


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, stat: Tuple[int, ...]) -> str:
    """The SHA-256 of the file at ``path`` as ``stat`` (device, inode, size, modification and
    change time) finds it: read once while it stays that file, for the several models checked
    against one corpus."""
    from phrase_scorer.io.file_identity import file_identity, identity_sha256

    return identity_sha256(file_identity(path))


def _corpus_sha256(path: PathLike) -> str:
    info = os.stat(path)
    return _sha256_of(os.path.abspath(path), (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns,
                                                   info.st_ctime_ns))


def _corpus_hashes(record: Any) -> Optional[Tuple[Any, Any]]:
    """The SHA-256s of the two sides of the corpus a config.json records (``corpus``), or None."""
    if not isinstance(record, dict):
        return None
    sides = [record.get(side) for side in ("source", "target")]
    if not all(isinstance(side, dict) and isinstance(side.get("sha256"), str) for side in sides):
        return None
    source, target = cast(List[dict], sides)  # both checked above
    return source["sha256"], target["sha256"]


#: Words of a text as :func:`check_model_reads` weighs them: the name it is shown by, and its words
WordSample = Tuple[str, List[str]]


def text_sample(path: PathLike) -> WordSample:
    """The words of the first :data:`SAMPLE_LINES` lines of the text at ``path``."""
    return shown_path(path), _sample_words(path)


def check_model_reads(path: PathLike, role: str, *, reverse: bool, right_to_left: Optional[bool] = None,
                      corpus: Optional[Tuple[PathLike, PathLike]] = None,
                      texts: Optional[Tuple[PathLike, PathLike]] = None,
                      loaded: Optional[LoadedModel] = None,
                      samples: Optional[Tuple[WordSample, WordSample]] = None) -> None:
    """Refuse the model at ``path`` (``loaded`` from there already, or loaded here), given as
    ``role`` (its name in the message, ``forward`` say), unless it loads and reads what the role
    needs: the system's source to its target (or, where ``reverse``, its target to its source),
    its target left to right (or, where ``right_to_left``, last word first; None: either).

    The reading order is in the weights' record (``trained_as``). The direction and the languages
    are decided by the corpus its config.json records when that is ``corpus`` (the system's
    training corpus, source and target: the same bytes, by SHA-256, read one way or the other);
    else by its vocabularies against ``texts`` (a source text and its translation: the tuning
    set): its source vocabulary must read the side it is to read better than its target
    vocabulary does, and its target vocabulary the side it predicts better than its source
    vocabulary does. A model of the other direction, or into another language, fails one of them.
    ``samples`` (:func:`text_sample`, or words gathered elsewhere) stand for ``texts`` where the
    words are at hand; a sample that no vocabulary reads better than the other decides nothing.
    One line names the folder, what the model is and what the role needs."""
    folder = Path(path)
    if loaded is None:
        loaded = ModelDirectory(folder).load("cpu")  # it exists, loads, and its parts agree
    source_vocab, target_vocab = loaded.source_vocab, loaded.target_vocab
    wanted = "reads the system's target and predicts its source" if reverse else \
        "reads the system's source and predicts its target"
    order = {None: "", True: ", right to left (last word first)", False: ", left to right"}[right_to_left]
    hint = f"give a model that {wanted}{order}"

    def refuse(what: str) -> None:
        raise PhraseScorerError(f"given as {role}, but {what}", path=folder, hint=hint)

    if right_to_left is not None and bool(target_vocab.right_to_left) != right_to_left:
        refuse("it predicts its target " + ("right to left (a right-to-left model)" if target_vocab.right_to_left
                                             else "left to right"))
    data = ModelDirectory(folder).read_config()
    recorded = _corpus_hashes(data.get("corpus"))
    if corpus is not None and recorded is not None:
        given = tuple(_corpus_sha256(side) for side in corpus)
        if given[0] != given[1] and recorded in (given, given[::-1]):  # trained on this very corpus
            backwards = recorded == given[::-1]
            if backwards != reverse:
                refuse("it was trained on the corpus read " + ("target to source (a reverse model)" if backwards
                                                                 else "source to target (a forward model)"))
            return
    if samples is None:
        if texts is None:
            return
        samples = (text_sample(texts[0]), text_sample(texts[1]))
    (source_name, source_words), (target_name, target_words) = samples
    if not source_words or not target_words:
        return  # texts without words say nothing of a language
    reads, predicts = (target_words, source_words) if reverse else (source_words, target_words)
    shares = {(vocab, side): known_share(vocab_of, words)
              for vocab, vocab_of in (("source", source_vocab), ("target", target_vocab))
              for side, words in (("reads", reads), ("predicts", predicts))}
    if shares["source", "reads"] == shares["target", "reads"] and \
            shares["source", "predicts"] == shares["target", "predicts"]:
        return  # neither vocabulary reads either text better: no evidence of a language
    names = (target_name, source_name) if reverse else (source_name, target_name)
    if shares["source", "reads"] <= shares["target", "reads"] and shares["target", "predicts"] <= \
            shares["source", "predicts"]:
        refuse(f"it translates the other way: its source vocabulary reads {names[1]} "
               f"({shares['source', 'predicts']:.0%} of its words known) better than {names[0]} "
               f"({shares['source', 'reads']:.0%})")
    if shares["source", "reads"] <= shares["target", "reads"]:
        refuse(f"it reads another language: its source vocabulary knows {shares['source', 'reads']:.0%} of the "
               f"words of {names[0]}, its target vocabulary {shares['target', 'reads']:.0%}")
    if shares["target", "predicts"] <= shares["source", "predicts"]:
        refuse(f"it translates into another language: its target vocabulary knows "
               f"{shares['target', 'predicts']:.0%} of the words of {names[1]}, its source vocabulary "
               f"{shares['source', 'predicts']:.0%}")


def shown_path(path: PathLike) -> str:
    return os.path.basename(os.fspath(path))
