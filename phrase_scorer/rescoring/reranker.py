"""The reranker: tuned weights with the models behind their features, and its file.

:class:`Reranker` is the one shape of tuned weights: ``rerank`` writes it (``OUTPUT.json``), and
``apply-reranker`` and ``translate-system --moses --reranker`` read it back through one validated
schema (:class:`RerankerFile`). A list to rerank must have been rescored by the reranker's models:
its rescore signature (``NBEST.json``) says so, checked first to describe the list as it is now.

One function makes a reranker from tuned weights (:func:`tuned_reranker`: the features it drops,
the n-best size it records) and one signs it (:meth:`Reranker.signature`), for ``rerank`` and for
both experiments (``rescore-experiment``, ``build-reranker``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple


from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import (
    Layout,
    describe_layout,
    group_by_sentence,
    read_nbest,
)
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.records import Signature
from phrase_scorer.rescoring.weights import Weights, write_best_hypotheses
from phrase_scorer.runtime.job import OutputJob

if TYPE_CHECKING:
    from phrase_scorer.rescoring.mert_files import MertData

log = logging.getLogger(__name__)


RERANKER_FORMAT = "phrase-scorer-reranker"



RERANKER_VERSION = 1



def rescore_signature(nbest: PathLike) -> Optional[Signature]:
    """The signature ``rescore`` wrote beside ``nbest`` (``NBEST.json``), checked to describe the
    list as it is now (:meth:`~phrase_scorer.records.Signature.describes`: its size, then its
    SHA-256); None when the list has no rescore signature (a list made otherwise). A signature
    of other bytes (the list was rewritten since, by another command or another rescore) is
    refused: its models are not those of this list's features; so is a damaged one."""
    signature = Signature.read(nbest)
    if signature is None or signature.tool != "phrase-scorer rescore":
        return None
    current = signature.describes(nbest)
    if current is False:
        raise PhraseScorerError(f"{os.fspath(nbest)}.json does not describe this list any more: the list was "
                                "rewritten since rescore signed it, so the models behind its features are unknown",
                                path=nbest, hint="rescore the list again with the models the reranker was tuned with")
    if current is None:
        # Written before signatures recorded the list's size and SHA-256: accepted, as a list
        # without any signature is (refusing it would only teach deleting NBEST.json), with a
        # warning that it cannot be checked against the list.
        log.warning("%s.json predates signatures that record their list's size and SHA-256: cannot check that it "
                    "still describes %s (rescore the list again to make it checkable)", os.fspath(nbest),
                    os.fspath(nbest))
    return signature


def rescored_models(nbest: PathLike) -> Dict[str, dict]:
    """The models behind the features ``rescore`` added to ``nbest``, read from its signature
    (:func:`rescore_signature`, :meth:`~phrase_scorer.records.Signature.models`): feature name ->
    directory, weights_sha256, reverse, normalize (for an ensemble, directory and weights_sha256
    list its models). Empty when the list has no such signature (a list made otherwise)."""
    signature = rescore_signature(nbest)
    if signature is None:
        return {}
    options = signature.get("options", {})
    normalize = bool(options.get("normalize", False)) if isinstance(options, dict) else False
    found: Dict[str, dict] = {}
    for m in signature.models():
        if m.name is None:
            raise PhraseScorerError("the signature is damaged: a model without its feature name",
                                    path=f"{os.fspath(nbest)}.json", hint="rescore the list again")
        if m.name in found:  # another model of an ensemble
            for key in ("directory", "weights_sha256"):
                before = found[m.name][key]
                found[m.name][key] = (before if isinstance(before, list) else [before]) + [getattr(m, key)]
        else:
            found[m.name] = {"directory": m.directory, "weights_sha256": m.weights_sha256,
                             "reverse": bool(m.reverse), "normalize": normalize}
    return found


@dataclass
class Reranker:
    """Tuned weights, the only shape they take: one weight per dense feature value in the lists'
    order, the features left out, the models behind the features ``rescore`` added (feature name
    -> directory, weights_sha256, reverse, normalize), and the n-best size (most hypotheses of a
    dev sentence) and decoder options of the lists it was tuned on. ``path``: the file it was read
    from, if any."""

    weights: Weights
    ignore_features: Tuple[str, ...] = ()
    models: Dict[str, dict] = field(default_factory=dict)
    nbest_size: Optional[int] = None
    decoder_flags: Optional[str] = None
    path: Optional[str] = None
    # the system the lists were decoded by (moses/system.py's system_record: its moses.ini and the
    # weights of its dense features); None when not known (lists given without their moses.ini)
    system: Optional[Dict[str, Any]] = None

    @property
    def decoder(self) -> Dict[str, Any]:
        return {"nbest_size": self.nbest_size, "decoder_flags": self.decoder_flags}

    def to_json(self) -> Dict[str, Any]:
        """What the reranker file holds (``rerank`` adds its runs and dev BLEU beside it)."""
        return {"format": RERANKER_FORMAT, "version": RERANKER_VERSION,
                "layout": [[name, count] for name, count in self.weights.layout], "weights": self.weights.by_name(),
                "ignore_features": list(self.ignore_features), "models": self.models, "decoder": self.decoder,
                **({"system": self.system} if self.system is not None else {})}

    def signature(self, tool: str, **described: Any) -> Signature:
        """The reranker signed as ``tool`` made it: the file's contents (:meth:`to_json`), with
        ``described`` beside them (the output, the runs, the dev BLEU, ...)."""
        return Signature.build(tool, self.to_json(), **described)

    @classmethod
    def from_json(cls, data: Any, path: str = "<reranker>") -> "Reranker":
        """The reranker ``data`` (parsed JSON) holds, checked by :class:`RerankerFile`'s schema."""
        return RerankerFile(path).parse(data)

    @classmethod
    def read(cls, path: PathLike) -> "Reranker":
        """The reranker file ``path``, read through its one schema (:class:`RerankerFile`): the format
        and version, a non-empty layout of dense features, one list of finite numbers per feature as
        long as the layout says, the features left out, the models (directory, weights' SHA-256,
        direction, normalisation), the decoder's n-best size and flags (never options that make Moses
        write or read files of its own) and the system tuned for, when recorded. Keys it does not know
        (the runs and BLEU ``rerank`` records) are left alone."""
        return RerankerFile(os.fspath(path)).read()


class _NotFinite(str):
    """A JSON number that is not a finite float (NaN, Infinity, 1e400), kept as its text for the message."""



def _parse_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)



class RerankerFile:
    """The typed reader of a reranker file: each method returns the value at ``key`` (a JSON path
    such as ``weights.LM0[0]``) checked to be of its type, or raises a one-line error naming the
    file and the key."""

    HINT = Text("tune it again with 'phrase-scorer rerank ", setting("dev", "...", verb="rerank"),
                "', or give the OUTPUT.json it wrote unchanged")

    def __init__(self, path: str) -> None:
        self.path = path

    def error(self, key: str, problem: str) -> PhraseScorerError:
        return PhraseScorerError(f"the reranker is damaged: {key} {problem}", path=self.path, hint=self.HINT)

    def describe(self, value: Any) -> str:
        if isinstance(value, _NotFinite):
            return value
        if isinstance(value, (dict, list)):
            return "an object" if isinstance(value, dict) else "a list"
        return json.dumps(value)[:40]

    def required(self, data: dict, key: str, name: str) -> Any:
        if name not in data:
            raise self.error(key, "is missing")
        return data[name]

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"is {self.describe(value)}, not a finite number")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            raise self.error(key, f"is {self.describe(value)}, not a finite number") from None
        if not math.isfinite(number):  # from_json of data parsed elsewhere
            raise self.error(key, f"is {number}, not a finite number")
        return number

    def count(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(key, f"is {self.describe(value)}, not a whole number of at least 1")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or isinstance(value, _NotFinite):
            raise self.error(key, f"is {self.describe(value)}, not a string")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"is {self.describe(value)}, not true or false")
        return value

    def mapping(self, value: Any, key: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(key, f"is {self.describe(value)}, not an object")
        return value

    def sequence(self, value: Any, key: str) -> list:
        if not isinstance(value, list):
            raise self.error(key, f"is {self.describe(value)}, not a list")
        return value

    def feature_name(self, value: Any, key: str) -> str:
        name = self.string(value, key)
        if not name or "_" in name or "=" in name or name != "".join(name.split()):
            raise self.error(key, f"{name!r} is not a dense feature name (no '_', '=' or spaces)")
        return name

    def layout(self, value: Any) -> Layout:
        items = self.sequence(value, "layout")
        if not items:
            raise self.error("layout", "is empty: the reranker weights no feature")
        layout: List[Tuple[str, int]] = []
        for i, item in enumerate(items):
            pair = self.sequence(item, f"layout[{i}]")
            if len(pair) != 2:
                raise self.error(f"layout[{i}]", f"has {len(pair)} items, not [name, number of values]")
            name = self.feature_name(pair[0], f"layout[{i}][0]")
            if any(name == seen for seen, _ in layout):
                raise self.error(f"layout[{i}][0]", f"names {name} a second time")
            layout.append((name, self.count(pair[1], f"layout[{i}][1]")))
        return tuple(layout)

    def weights(self, value: Any, layout: Layout) -> Weights:
        by_name = self.mapping(value, "weights")
        for name in by_name:
            if all(name != known for known, _ in layout):
                raise self.error(f"weights.{name}", f"is not in the layout ({describe_layout(layout)})")
        values: List[float] = []
        for name, count in layout:
            key = f"weights.{name}"
            given = self.sequence(self.required(by_name, key, name), key)
            if len(given) != count:
                raise self.error(key, f"has {len(given)} values, but the layout gives {name} {count}")
            values += [self.number(v, f"{key}[{i}]") for i, v in enumerate(given)]
        return Weights(layout, values)

    def model(self, value: Any, key: str) -> dict:
        record = self.mapping(value, key)
        directory = self.required(record, f"{key}.directory", "directory")
        digest = self.required(record, f"{key}.weights_sha256", "weights_sha256")
        if isinstance(directory, list):  # an ensemble: one directory and digest per model
            if not directory:
                raise self.error(f"{key}.directory", "is an empty list")
            directory = [self.string(d, f"{key}.directory[{i}]") for i, d in enumerate(directory)]
            digest = self.sequence(digest, f"{key}.weights_sha256")
            if len(digest) != len(directory):
                raise self.error(f"{key}.weights_sha256",
                                 f"has {len(digest)} digests for {len(directory)} directories")
            digest = [self.string(d, f"{key}.weights_sha256[{i}]") for i, d in enumerate(digest)]
        else:
            directory = self.string(directory, f"{key}.directory")
            digest = self.string(digest, f"{key}.weights_sha256")
        return {"directory": directory, "weights_sha256": digest,
                "reverse": self.boolean(self.required(record, f"{key}.reverse", "reverse"), f"{key}.reverse"),
                "normalize": self.boolean(record.get("normalize", False), f"{key}.normalize")}

    def decoder(self, value: Any) -> Dict[str, Any]:
        record = self.mapping(value, "decoder")
        size, flags = record.get("nbest_size"), record.get("decoder_flags")
        if flags is not None:  # Moses is given them: never options that write or read files of their own
            check_decoder_flags(self.string(flags, "decoder.decoder_flags"), path=self.path,
                                key="decoder.decoder_flags")
        return {"nbest_size": None if size is None else self.count(size, "decoder.nbest_size"),
                "decoder_flags": None if flags is None else self.string(flags, "decoder.decoder_flags")}

    def system(self, value: Any) -> Dict[str, Any]:
        record = self.mapping(value, "system")
        ini = self.string(self.required(record, "system.moses.ini", "moses.ini"), "system.moses.ini")
        weights = {self.feature_name(name, f"system.weights.{name}"):
                   [self.number(v, f"system.weights.{name}[{i}]")
                    for i, v in enumerate(self.sequence(values, f"system.weights.{name}"))]
                   for name, values in self.mapping(self.required(record, "system.weights", "weights"),
                                                    "system.weights").items()}
        return {"moses.ini": ini, "weights": weights}

    def read(self) -> Reranker:
        try:
            data = json.loads(Path(self.path).read_text(encoding="utf-8"), parse_float=_parse_float,
                              parse_constant=_NotFinite)
        except OSError as exc:
            raise PhraseScorerError(f"cannot read the reranker ({exc.strerror})", path=self.path) from None
        except (ValueError, RecursionError):
            data = None
        return self.parse(data)

    def parse(self, data: Any) -> Reranker:
        if not isinstance(data, dict) or data.get("format") != RERANKER_FORMAT:
            raise PhraseScorerError(
                "not a reranker file", path=self.path,
                hint=Text("give the OUTPUT.json that 'phrase-scorer rerank ", setting("dev", "...", verb="rerank"),
                          "' wrote beside its output"))
        if data.get("version") != RERANKER_VERSION or isinstance(data.get("version"), bool):
            raise PhraseScorerError(f"reranker version {self.describe(data.get('version'))}; this version of "
                                    f"phrase-scorer reads {RERANKER_VERSION}", path=self.path,
                                    hint="tune it again with this version's rerank")
        layout = self.layout(self.required(data, "layout", "layout"))
        weights = self.weights(self.required(data, "weights", "weights"), layout)
        ignore = tuple(self.string(n, f"ignore_features[{i}]")  # any label --ignore-feature took
                       for i, n in enumerate(self.sequence(data.get("ignore_features", []), "ignore_features")))
        models = {self.feature_name(name, f"models.{name}"): self.model(record, f"models.{name}")
                  for name, record in self.mapping(data.get("models", {}), "models").items()}
        decoder = self.decoder(data.get("decoder", {}))
        system = self.system(data["system"]) if "system" in data else None
        return Reranker(weights, ignore, models, decoder["nbest_size"], decoder["decoder_flags"], self.path, system)




def most_hypotheses(nbest: PathLike) -> int:
    """The n-best size a reranker records: the most hypotheses of one sentence of its dev list
    (the list ``translate-system --moses --reranker`` asks Moses for; 0 for an empty list)."""
    return max((len(group) for _, group in group_by_sentence(read_nbest(nbest))), default=0)


@dataclass(frozen=True)
class FeatureDropping:
    """What a model feature must buy to keep its tuned weight: the dev BLEU (x 100) above which it
    stays (``rerank --min-feature-gain``), measured on the dev list's extractor data."""

    min_feature_gain: float
    dev_data: "MertData"


def tuned_reranker(weights: Weights, dev_nbest: PathLike, *, ignore_features: Sequence[str] = (),
                   decoder_flags: Optional[str], system: Optional[Dict[str, Any]],
                   models: Optional[Dict[str, dict]] = None, nbest_size: Optional[int] = None,
                   dropping: Optional[FeatureDropping] = None) -> Tuple[Reranker, Dict[str, float]]:
    """The one maker of a reranker from ``weights`` tuned on ``dev_nbest``, and the model features
    it dropped (name -> dev BLEU x 100 once dropped, in the order they went).

    ``models``: the models behind the features ``rescore`` added to the dev list (default: read
    from its signature, :func:`rescored_models`). The n-best size recorded is
    :func:`most_hypotheses` of the dev list, or ``nbest_size`` where the caller counted it so
    already (``rerank``, while it copied the list for the extractor). With ``dropping``, a model
    feature neither left out nor buying more than its ``min_feature_gain`` dev BLEU is weighted 0,
    so that its model is not run (:func:`~phrase_scorer.rescoring.optimisers.drop_unhelpful`,
    measured on its ``dev_data``): ``rerank --min-feature-gain``. Without, every feature is kept:
    an experiment's row names the features it adds, and its report gives that row's weights,
    which its reranker holds unchanged."""
    if models is None:
        models = rescored_models(dev_nbest)
    dropped: Dict[str, float] = {}
    if dropping is not None:
        from phrase_scorer.rescoring.optimisers import drop_unhelpful

        weights, dropped = drop_unhelpful(dropping.dev_data, weights,
                                          [n for n in models if n not in ignore_features], dropping.min_feature_gain)
    if nbest_size is None:
        nbest_size = most_hypotheses(dev_nbest)
    reranker = Reranker(weights, tuple(ignore_features), models, nbest_size=nbest_size, decoder_flags=decoder_flags,
                        system=system)
    return reranker, dropped


def check_rescored_with_same_models(reranker: Reranker, nbest: PathLike) -> None:
    """Refuse a list whose added features were computed by other models (other weights, other
    direction or normalisation) than the ones the reranker was tuned with, as far as the list's
    signature tells."""
    if not reranker.models:
        return
    found = rescored_models(nbest)
    if not found:
        log.warning("%s has no rescore signature (%s.json): cannot check that its features %s come from the models "
                    "the reranker was tuned with", os.fspath(nbest), os.fspath(nbest), ", ".join(reranker.models))
        return
    for name, tuned in reranker.models.items():
        now = found.get(name)
        if now is None:
            continue  # not added by the last rescore: the layout check names a missing feature
        for key in ("weights_sha256", "reverse", "normalize"):
            if now.get(key) != tuned.get(key):
                raise PhraseScorerError(
                    f"feature {name} was tuned with the model {tuned.get('directory')} ({key} {tuned.get(key)}), but "
                    f"this list's was computed with {now.get('directory')} ({key} {now.get(key)})", path=nbest,
                    hint="rescore the list with the models the reranker was tuned with, or tune a new reranker")



def apply_reranker(reranker: PathLike, nbest: PathLike, output: PathLike, *, overwrite: bool = False) -> int:
    """Write the best hypothesis of each sentence of ``nbest`` under the weights of the reranker
    file ``reranker``: the lines ``rerank`` wrote for the list when it tuned them. Returns the
    number of lines written. ``output`` (``-``: standard output) is never the list or the
    reranker, nor a link to one; an existing one is replaced only with ``overwrite``."""
    with OutputJob(output, [("the test n-best list", nbest), ("the reranker", reranker)],
                   overwrite=overwrite) as job:
        loaded = Reranker.read(reranker)
        check_rescored_with_same_models(loaded, nbest)
        sentences = write_best_hypotheses(nbest, loaded.weights, lambda data: job.write_text(0, data),
                                          loaded.ignore_features)
        job.commit()
    return sentences

