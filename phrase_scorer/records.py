"""The one answer to "is this output still made from these inputs?".

Every output that can be reused or resumed keeps a record of what made it: an annotated table
its signature ``OUT.json``, an interrupted run its resume record, the training-pair cache its
description, each step of an experiment its ``inputs.json``. Whoever asks whether the output is
current compares that record with the settings it would use now, here:

* :func:`differences` -- every setting that differs, nested mappings compared key by key and
  named with dotted paths; :func:`changed` -- the top-level names only;
  :func:`describe_difference` -- the first difference, as one phrase;
* :func:`refuse_changed` -- ``--resume``'s rule: an interrupted run goes on only with the
  settings it began with, else one error naming every difference;
* :func:`finished` -- the signature of an output finished with these settings, or None;
* :func:`reuse_or_clear` -- an experiment step's outputs are reused when their record matches,
  else removed so that the step runs afresh; :class:`Step` -- that rule and the writing of the
  record, the one protocol of every step of the experiments;
* :func:`as_recorded` -- a value as its JSON record reads back (tuples as lists);
* :class:`Signature` -- the record written beside a finished output (``OUT.json``) by
  ``annotate``, ``rescore``, ``rerank`` and ``translate-system --moses``, built, written and read here
  only; :class:`SignedModel` -- a model as a signature names it; :func:`signature_line` -- a
  signature as one line to quote beside a score (``tool:rescore|models:RNN0=3f2a9c1b0d4e|...``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from phrase_scorer import __version__
from phrase_scorer.errors import PhraseScorerError, Setting, Text, setting
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_sha256, hash_identities, identity_change, is_file_identity
from phrase_scorer.io.paths import STDIO, PathLike, part_path
from phrase_scorer.io.outputs import writes_directly
from phrase_scorer.subwords import segmentation_records

log = logging.getLogger(__name__)

_MISSING = "(none)"


def read_record(path: PathLike) -> Optional[dict]:
    """The JSON record at ``path``; None when it is missing or unreadable (a record that cannot be
    read makes its output stale, never an error)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                prefix: str = "") -> Iterator[Tuple[str, Any, Any]]:
    """(dotted name, saved value, current value) of every setting that differs; a setting only
    one side has is ``(none)`` on the other. An input file (:func:`~phrase_scorer.io.file_identity.file_identity`)
    differs only when its bytes do (its ``size``, else its ``sha256``): not for its path or time."""
    for key in [*saved, *(k for k in current if k not in saved)]:
        old, new = saved.get(key, _MISSING), current.get(key, _MISSING)
        if old == new:
            continue
        name = f"{prefix}{key}"
        if is_file_identity(old) and is_file_identity(new) and isinstance(new, dict):
            change = identity_change(old, new)
            if change is not None:
                yield f"{name}.{change[0]}", change[1], change[2]
        elif isinstance(old, Mapping) and isinstance(new, Mapping):
            yield from differences(old, new, name + ".")
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):  # per model, say: NAME.0.KEY
            yield from differences({str(i): v for i, v in enumerate(old)}, {str(i): v for i, v in enumerate(new)},
                                   name + ".")
        else:
            yield name, old, new


def changed(recorded: Optional[Mapping[str, Any]], current: Mapping[str, Any]) -> List[str]:
    """The names of ``current`` whose value ``recorded`` does not hold, sorted (all of them when
    there is no record)."""
    if not isinstance(recorded, Mapping):
        return sorted(current)
    return sorted(k for k in current if not same(recorded.get(k), current[k]))


def same(saved: Any, current: Any) -> bool:
    """Whether a recorded setting and the current one are the same (as :func:`differences` compares)."""
    return next(differences({"": saved}, {"": current}), None) is None


def describe_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """The first differing setting, as ``name: theirs -> ours`` (dotted for nested ones)."""
    for name, old, new in differences(theirs, ours):
        return f"{name}: {old!r} -> {new!r}"
    return "none"


def refuse_changed(saved: Mapping[str, Any], current: Mapping[str, Any], *, path: Optional[PathLike] = None,
                   hint: str = Text("run again without ", setting("resume")),
                   label: Callable[[str], Union[str, Setting]] = str) -> None:
    """Raise a one-line :class:`PhraseScorerError` naming what changed, if anything did:

    ``cannot resume: NAME, ... changed since the interrupted run (NAME.KEY: SAVED -> NOW, ...)``,
    each setting by its dotted name with both values where they differ (:func:`show_change`);
    ``label`` names a setting (:func:`~phrase_scorer.errors.setting`: as the reader knows it).
    """
    changes = list(differences(saved, current))
    if not changes:
        return
    names = list(dict.fromkeys(label(name.split(".")[0]) for name, _, _ in changes))
    message = Text("cannot resume: ", *_joined(names, ", "), " changed since the interrupted run (",
                   *_joined([Text(label(name), f": {show_change(old, new)}") for name, old, new in changes], ", "), ")")
    raise PhraseScorerError(message, path=path, hint=hint)


def _joined(items: List[Union[str, Setting]], separator: str) -> List[Union[str, Setting]]:
    """``items`` with ``separator`` between them (str.join, keeping the settings)."""
    return [part for i, item in enumerate(items) for part in ((separator, item) if i else (item,))]


def finished(output: PathLike, settings: Mapping[str, Any]) -> Optional["Signature"]:
    """The signature ``OUTPUT.json`` of ``output`` if the output is finished (it exists, and its
    signature names it) and was made with ``settings`` (each of them recorded with the same
    value), else None. A damaged signature is no signature: the output is made again."""
    output = os.fspath(output)
    if output == STDIO or not os.path.isfile(output):
        return None
    try:
        signature = Signature.read(output)
    except PhraseScorerError:
        return None
    if signature is None or signature.output != os.path.abspath(output):
        return None
    recorded = {**signature.fields, "package_version": signature.package_version}
    if not all(same(recorded.get(key), value) for key, value in settings.items()):
        return None
    return signature


def reuse_or_clear(record_path: Path, inputs: Mapping[str, Any], outputs: Sequence[Path],
                   resumable: Sequence[str] = ()) -> bool:
    """True when every output exists and ``record_path`` records ``inputs`` as finished. When the
    record holds other inputs, the outputs and their partial files are removed so that the step
    runs afresh; with the same inputs and the step interrupted (an output missing, or the record
    not finished: a training's weights exist from its first validation on), they are kept for the
    step to resume from. When only ``resumable`` inputs changed (a training's stopping criteria),
    the step is not done and its outputs are kept: it goes on from them to the new criteria."""
    recorded = read_record(record_path)
    if recorded is None:
        return False
    differing = changed(recorded, inputs)
    if differing and set(differing) <= set(resumable):
        log.info("%s: %s changed: going on from what was made", record_path, ", ".join(differing))
        return False
    if not differing:
        # the same inputs: done, or interrupted (the step goes on from its partial output)
        return recorded.get("finished") is not False and all(p.exists() for p in outputs)
    log.info("%s is out of date (%s changed): making it again", ", ".join(map(str, outputs)) or record_path.parent,
             ", ".join(differing))
    for path in outputs:
        for leftover in (path, part_path(path), Path(str(part_path(path)) + ".json")):
            leftover.unlink(missing_ok=True)
    return False


def as_recorded(value: Any) -> Any:
    """``value`` as JSON reads it back from a record (tuples become lists, keys strings), so that it
    compares equal to what a record written from it holds."""
    return json.loads(json.dumps(value))


class Step:
    """One step of an experiment: outputs made from recorded inputs, reused when a re-run has the
    same inputs, made again when they changed, resumed when the step was interrupted.

    ::

        step = Step(folder / "inputs.json", inputs, [output])
        if step.done:
            return output  # made from the same inputs before
        with step:
            ...  # make the outputs (a partial output left by an interrupted run may be resumed)

    Entering the step records the inputs as not finished yet, so an interrupted step is seen as
    the same step by the next run (its partial outputs kept for it to resume from); leaving it
    without an exception records them as finished. Outputs made from other inputs are removed
    when the step is created (:func:`reuse_or_clear`); a step that works in a ``folder`` of its
    own has the whole folder removed instead. A folder there that no record of the step names (or
    a link, or a file) is not the step's: it is refused, never removed.
    ``resumable`` inputs are those whose change continues the step from what it made (a
    training's stopping criteria: more updates go on from the last checkpoint).
    """

    def __init__(self, record: PathLike, inputs: Mapping[str, Any], outputs: Sequence[PathLike], *,
                 folder: Optional[PathLike] = None, resumable: Sequence[str] = ()) -> None:
        self.record = Path(record)
        self.inputs = as_recorded(inputs)
        self.outputs = [Path(p) for p in outputs]
        if folder is not None and os.path.lexists(folder):
            recorded = read_record(self.record)
            if recorded is None or os.path.islink(folder) or not os.path.isdir(folder):
                raise PhraseScorerError("something is in the way of this step's folder, and no record of this "
                                        "command's says what made it", path=os.fspath(folder),
                                        hint="move it away (it may be yours), or choose another working folder")
            stale = changed(recorded, self.inputs)
            if stale and not set(stale) <= set(resumable):
                log.info("%s was made with other inputs (%s changed): removing it to run it again", folder,
                         ", ".join(stale))
                shutil.rmtree(folder)
        self.done = reuse_or_clear(self.record, self.inputs, self.outputs, resumable)

    def __enter__(self) -> "Step":
        if self.done:
            raise RuntimeError(f"the step recorded in {self.record} is done: nothing to make")
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self._write({**self.inputs, "finished": False})
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._write(self.inputs)
            self.done = True

    def _write(self, record: Mapping[str, Any]) -> None:
        write_text_atomically(self.record, json.dumps(hash_identities(dict(record)), indent=1) + "\n")


def show_change(old: Any, new: Any, limit: int = 80, context: int = 24) -> str:
    """``OLD -> NEW`` in full; where one is longer than ``limit`` characters, both are shown
    from the same place, ``context`` characters before the first character where they differ, so
    that the difference is always in view: ``...abc1 -> ...abc2 (from character 75)``."""
    a, b = (value if isinstance(value, str) else repr(value) for value in (old, new))
    if len(a) <= limit and len(b) <= limit:
        return f"{a} -> {b}"
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    start = max(0, first - context)
    end = first + limit - context

    def cut(text: str) -> str:
        return ("..." if start else "") + text[start:end] + ("..." if len(text) > end else "")

    return f"{cut(a)} -> {cut(b)} (they differ from character {first + 1})"


# --- signatures ------------------------------------------------------------------------------------

SIGNATURE_VERSION = 1  # written as ``signature_version``; a signature without it was written before it


@dataclass
class SignedModel:
    """A model as a signature names it: its directory, the SHA-256 of its weights and its
    config; for a rescoring feature also the feature's name, whether it reads target to source
    (``reverse``) and the ensemble it belongs to."""

    directory: str
    weights_sha256: str
    config: Dict[str, Any]
    name: Optional[str] = None
    reverse: Optional[bool] = None
    ensemble: Optional[bool] = None  # a rescoring feature: one model of an ensemble
    # A subword model's segmentation: {side: its sentencepiece model's record, SHA-256 included};
    # None for a word model (whose records are as before).
    subwords: Optional[Dict[str, Any]] = None

    @classmethod
    def of(cls, loaded: Any, **feature: Any) -> "SignedModel":
        """The record of a loaded model (:class:`~phrase_scorer.model_dir.LoadedModel`)."""
        subwords = segmentation_records(loaded.source_vocab, loaded.target_vocab)
        return cls(os.path.abspath(loaded.directory), loaded.weights_sha256, loaded.config.to_dict(), **feature,
                   subwords=subwords or None)

    def to_json(self) -> Dict[str, Any]:
        feature = {"name": self.name, "reverse": self.reverse, "ensemble": self.ensemble} if self.name else {}
        subwords = {"subwords": self.subwords} if self.subwords else {}
        return {**feature, "directory": self.directory, "weights_sha256": self.weights_sha256, "config": self.config,
                **subwords}

    @classmethod
    def from_json(cls, data: Any, where: str, path: PathLike) -> "SignedModel":
        if not isinstance(data, dict):
            raise _damaged(path, f"{where} is not an object")
        for key, kind in (("directory", str), ("weights_sha256", str), ("config", dict)):
            if not isinstance(data.get(key), kind):
                raise _damaged(path, f"{where}.{key} is missing or not a {'string' if kind is str else 'object'}")
        name = data.get("name")
        if name is not None and (not isinstance(name, str) or not isinstance(data.get("reverse"), bool)):
            raise _damaged(path, f"{where} names a feature without a string name and a true/false reverse")
        ensemble = data.get("ensemble")
        if ensemble is not None and not isinstance(ensemble, bool):
            raise _damaged(path, f"{where}.ensemble is not true or false")
        subwords = data.get("subwords")
        if subwords is not None and not isinstance(subwords, dict):
            raise _damaged(path, f"{where}.subwords is not an object")
        return cls(data["directory"], data["weights_sha256"], data["config"], name, data.get("reverse"), ensemble,
                   subwords)


@dataclass
class Signature:
    """What made an output and what it holds, written beside it as ``OUT.json``: the command
    (``tool``), ``fields`` (the settings that make its bytes -- inputs by identity, models by the
    SHA-256 of their weights, every option that moves a byte -- and what its values are: columns,
    features, value format; each tool its own keys, at the top level of the file), the output,
    its line count, its size and SHA-256 (:meth:`describes`), the package version and when it
    finished. ``version`` is the file's schema (``signature_version``)."""

    tool: str
    fields: Dict[str, Any]
    output: Optional[str] = None
    lines: Optional[int] = None
    output_size: Optional[int] = None
    output_sha256: Optional[str] = None
    package_version: str = __version__
    finished: Optional[str] = None
    version: int = SIGNATURE_VERSION

    OWN = ("signature_version", "tool", "output", "lines", "output_size", "output_sha256", "package_version",
           "finished")

    @classmethod
    def build(cls, tool: str, settings: Mapping[str, Any], *, output: Optional[str] = None,
              lines: Optional[int] = None, content: Optional[PathLike] = None, **described: Any) -> "Signature":
        """The signature of an output finished now. ``settings``: what made it (their file
        identities get their SHA-256 when the signature goes beside a file); ``content``: the file
        holding the output's finished bytes (``OUT.part`` before the rename), whose size and
        SHA-256 are recorded; ``described``: what its values are."""
        if output is not None and not writes_directly(output):  # a signature written beside a file
            hash_identities(settings)
        fields = {k: v for k, v in {**settings, **described}.items() if k not in cls.OWN}
        return cls(tool, as_recorded(fields),
                   output=None if output is None else (os.path.abspath(output) if output != STDIO else STDIO),
                   lines=lines,
                   output_size=None if content is None else os.path.getsize(content),
                   output_sha256=None if content is None else file_sha256(content),
                   package_version=settings.get("package_version", __version__),
                   finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def to_json(self) -> Dict[str, Any]:
        record: Dict[str, Any] = {"signature_version": self.version, "tool": self.tool, **self.fields}
        for key in ("output", "lines", "output_size", "output_sha256"):
            if getattr(self, key) is not None:
                record[key] = getattr(self, key)
        record.update(package_version=self.package_version, finished=self.finished)
        return record

    @classmethod
    def from_json(cls, data: Any, path: PathLike) -> "Signature":
        """The signature ``data`` (parsed from ``path``) holds, its own keys checked."""
        if not isinstance(data, dict) or not isinstance(data.get("tool"), str):
            raise _damaged(path, "not a phrase-scorer signature (no tool)")
        version = data.get("signature_version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise _damaged(path, f"signature_version {version!r} is not a version number")
        if version > SIGNATURE_VERSION:
            raise PhraseScorerError(f"written by a newer phrase-scorer (signature version {version}; this one reads "
                                    f"up to {SIGNATURE_VERSION})", path=path, hint="use that version, or make the "
                                    "output again with this one")
        for key, kind in (("output", str), ("lines", int), ("output_size", int), ("output_sha256", str),
                          ("package_version", str), ("finished", str)):
            value = data.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise _damaged(path, f"{key} is {json.dumps(value)[:40]}, not a {kind.__name__}")
        return cls(data["tool"], {k: v for k, v in data.items() if k not in cls.OWN}, data.get("output"),
                   data.get("lines"), data.get("output_size"), data.get("output_sha256"),
                   data.get("package_version", ""), data.get("finished"), version)

    @classmethod
    def read(cls, output: PathLike) -> Optional["Signature"]:
        """The signature of ``output`` (``OUTPUT.json``); None when there is none. One that cannot
        be read as a signature is an error naming it."""
        path = os.fspath(output) + ".json"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise _damaged(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise _damaged(path, "is not JSON") from None
        return cls.from_json(data, path)

    def write(self, output: PathLike) -> None:
        """``OUTPUT.json``, written atomically."""
        write_text_atomically(os.fspath(output) + ".json", json.dumps(self.to_json(), indent=2) + "\n")

    def describes(self, output: PathLike) -> Optional[bool]:
        """Whether this signature describes the bytes of ``output`` now: their size first, then,
        when it matches, their SHA-256. None for a signature that records neither (written
        before signatures did): the caller decides what to trust."""
        if self.output_size is None and self.output_sha256 is None:
            return None
        if os.path.getsize(output) != self.output_size:
            return False
        return file_sha256(output) == self.output_sha256

    def model(self) -> SignedModel:
        """The one model of an annotated table (``model``)."""
        return SignedModel.from_json(self.fields.get("model"), "model", self._path())

    def models(self) -> List[SignedModel]:
        """The models of a rescored list (``models``), one per model, an ensemble's in order."""
        models = self.fields.get("models")
        if not isinstance(models, list):
            raise _damaged(self._path(), "models is not a list")
        return [SignedModel.from_json(m, f"models[{i}]", self._path()) for i, m in enumerate(models)]

    def line(self) -> str:
        """The signature as one quotable line (:func:`signature_line`)."""
        return signature_line(self)

    def _path(self) -> str:
        return f"{self.output}.json" if self.output else "the signature"


def _damaged(path: PathLike, problem: str) -> PhraseScorerError:
    return PhraseScorerError(f"the signature is damaged: {problem}", path=path,
                             hint="make the output again (its signature is written with it)")


# --- the one-line form -----------------------------------------------------------------------------

#: The short form of a SHA-256 in the line: 48 bits, enough to tell a model's weights from another's.
SHORT_HASH = 12


def signature_line(signature: Signature) -> str:
    """What made an output, as one line to quote beside its score (as sacrebleu's signature):
    ``tool:rescore|models:RNN0=3f2a9c1b0d4e|norm:no|device:cpu|precision:fp32|version:0.1.0``.

    Read from the signature's record only, each field where the record has it, in this order:
    ``tool`` (the verb, its words joined by ``+``), ``models`` (each feature's name and the first
    12 hex digits of its weights' SHA-256, an ensemble's models joined by ``+``), ``ignored`` (the
    features a reranker leaves out), ``reranker`` and ``ini`` (their files' SHA-256), ``nbest``
    (a reranker's n-best size), ``norm`` (log p per predicted token), ``device`` and ``precision``
    (the scorer's), ``bound`` (the reranked translation's bounded scoring) and ``version`` (the
    package's). docs/python.md lists them. A value holding ``|``, ``,``, ``=``, ``+``, ``%`` or a
    space is percent-escaped, so that the line always splits into its fields."""
    fields = signature.fields
    parts: List[Tuple[str, str]] = [("tool", "+".join(word.lstrip("-") for word in
                                                      signature.tool.removeprefix("phrase-scorer ").split()))]
    models = _signed_models(fields)
    if models:
        parts.append(("models", ",".join(
            "=".join([*([_escaped(name)] if name else []), "+".join(digest[:SHORT_HASH] for digest in digests)])
            for name, digests in models)))
    if fields.get("ignore_features"):
        parts.append(("ignored", ",".join(_escaped(str(name)) for name in fields["ignore_features"])))
    for key, label in (("reranker sha256", "reranker"), ("moses.ini sha256", "ini")):
        if isinstance(fields.get(key), str):
            parts.append((label, fields[key][:SHORT_HASH]))
    decoder = fields.get("decoder")
    if isinstance(decoder, dict) and decoder.get("nbest_size") is not None:
        parts.append(("nbest", str(decoder["nbest_size"])))
    options = fields.get("options")
    if isinstance(options, dict) and isinstance(options.get("normalize"), bool):
        parts.append(("norm", _yes_no(options["normalize"])))
    scoring = fields.get("scoring")
    described = scoring if isinstance(scoring, list) else [scoring] if isinstance(scoring, dict) else []
    for key in ("device", "precision"):
        values = list(dict.fromkeys(str(d[key]) for d in described if isinstance(d, dict) and d.get(key) is not None))
        if values:
            parts.append((key, ",".join(_escaped(v) for v in values)))
    if isinstance(fields.get("bound"), bool):
        parts.append(("bound", _yes_no(fields["bound"])))
    parts.append(("version", _escaped(signature.package_version or "unknown")))
    return "|".join(f"{key}:{value}" for key, value in parts)


def _signed_models(fields: Mapping[str, Any]) -> List[Tuple[Optional[str], List[str]]]:
    """(feature name or None, its weights' SHA-256 digests) per feature of a record: a rescored
    list's or a translation's ``models`` (one entry per model, an ensemble's under one name), a
    reranker's (name -> record) or an annotated table's ``model``."""
    models = fields.get("models", [fields["model"]] if isinstance(fields.get("model"), dict) else [])
    entries = [(name, record) for name, record in models.items()] if isinstance(models, dict) else \
        [(m.get("name"), m) for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    found: Dict[Optional[str], List[str]] = {}
    for name, record in entries:
        digest = record.get("weights_sha256") if isinstance(record, dict) else None
        digests = digest if isinstance(digest, list) else [digest]
        found.setdefault(name if isinstance(name, str) else None, []).extend(
            d for d in digests if isinstance(d, str))
    return list(found.items())


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _escaped(value: str) -> str:
    """``value`` with the line's separators, ``%``, whitespace and what does not print
    percent-escaped, as the bytes of its UTF-8 (as a URL escapes them)."""
    return "".join("".join(f"%{byte:02X}" for byte in c.encode("utf-8", "surrogatepass"))
                   if c in "|,=+%" or c.isspace() or not c.isprintable() else c for c in value)
