"""The system a moses.ini describes, as a reranker sees it: the dense features Moses writes in its
n-best lists, and the weights it decodes with.

A reranker weights the dense features of the lists it was tuned on; Moses writes, for each
tuneable feature of the ini (``moses/ScoreComponentCollection.cpp``, ``OutputAllFeatureScores``),
as many values as its ``[weight]`` line has. :func:`ini_features` reads them from the ini, so
that a reranker is checked against the system before Moses decodes anything
(:func:`check_features`: a feature the reranker weights that the ini lacks, or one the ini adds).

A reranker also records the system it was tuned for (:func:`system_record`: those features and
their weights). The weights identify a tuned system cheaply and survive what leaves it the same
system: its tables binarised, filtered for a test set (as EMS does) or moved; another language
pair's system, or the same one tuned again, has other weights, and Moses' lists from it are not
the lists the reranker's weights were tuned on (:func:`check_system`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.io.nbest import read_nbest

# Feature types Moses does not tune unless told to (their constructors set m_tuneable = false):
# their values are not in the n-best lists
UNTUNEABLE_TYPES = ("UnknownWordPenalty", "BleuScoreFeature", "ConstrainedDecoding", "DeleteRules",
                    "MaxSpanFreeNonTermSource", "SetSourcePhrase", "ControlRecombination")
RELATIVE_TOLERANCE = 1e-6  # weights written with fewer digits by another tool are the same weights
# Moses prints features and totals to 6 significant digits: a total off by more than this share
# of the sum's size was not made with these weights
TOTAL_TOLERANCE = 1e-4


def ini_features(ini: MosesIni) -> Dict[str, List[float]]:
    """The dense features Moses writes in the n-best lists of ``ini`` (feature name -> its weights,
    as many as the values it writes), in the ini's order: every feature with a ``[weight]`` line
    but those Moses does not tune (``tuneable=false``, or an untuneable type)."""
    weighted = set(ini.weight_names())
    found: Dict[str, List[float]] = {}
    for feature in ini.features():
        tuneable = feature.get("tuneable")
        if tuneable is not None and tuneable.lower() in ("false", "0", "no"):
            continue
        if feature.type in UNTUNEABLE_TYPES and tuneable is None:
            continue
        if feature.name in weighted:
            found[feature.name] = ini.weight_line(feature.name).weights
    return found


def system_record(ini: PathLike) -> Dict[str, Any]:
    """What a reranker records of the system it was tuned for: the ini (for people to read) and its
    dense features with their weights (:func:`ini_features`)."""
    return {"moses.ini": os.path.abspath(ini), "weights": ini_features(MosesIni.read(ini))}


def decoded_with(nbest: PathLike, weights: Dict[str, List[float]], added: Sequence[str], sample: int = 20) -> \
        Optional[bool]:
    """Whether the n-best list ``nbest`` was decoded with ``weights`` (:func:`ini_features`): Moses'
    total of each of its first ``sample`` hypotheses is the weighted sum of its features, to the
    digits Moses prints (another system's weights miss by far more: English-Czech weights on an
    English-French list by 28% of the sum's size, against 1e-6 for its own). Features in ``added``
    (those rescore appended) are not in the total. None when it cannot tell: a hypothesis carries
    a feature the weights do not name (a sparse one, or one added otherwise), or the list is empty."""
    checked = 0
    for entry in read_nbest(nbest):
        if checked == sample:
            break
        products = []
        for name, values in entry.features:
            if name in added:
                continue
            if name not in weights or len(weights[name]) != len(values):
                return None
            products += [w * v for w, v in zip(weights[name], values)]
        scale = 1 + abs(entry.total) + sum(abs(p) for p in products)
        if abs(sum(products) - entry.total) > TOTAL_TOLERANCE * scale:
            return False
        checked += 1
    return True if checked else None


def _count(count: int) -> str:
    return f"{count} value{'s' if count != 1 else ''}"


def check_features(layout: Sequence[Tuple[str, int]], ignored: Sequence[str], models: Sequence[str],
                   ini: PathLike, reranker: Optional[str]) -> None:
    """Refuse a system whose lists would not have the dense features the reranker weights:
    ``layout`` (the reranker's weights) less its model features (``models``) must be the ini's
    features less those the reranker leaves out (``ignored``), each with as many values."""
    parsed = MosesIni.read(ini)
    have = {name: len(weights) for name, weights in ini_features(parsed).items()}
    name_of = reranker or "the reranker"
    hint = "translate with the moses.ini the reranker was tuned for, or tune a reranker for this system"
    for name, count in layout:
        if name in models:
            continue
        if name not in have:
            raise PhraseScorerError(f"{name_of} weights the decoder feature {name} ({_count(count)}), which this "
                                    "moses.ini does not have (nor is it one of the reranker's models)", path=ini,
                                    hint=hint)
        if have[name] != count:
            raise PhraseScorerError(f"{name} has {_count(have[name])} here, but {name_of} weights "
                                    f"{_count(count)} of it", path=ini, line=parsed.weight_line(name).line.number,
                                    hint=hint)
    weighted = {name for name, _ in layout}
    for name in have:
        if name not in weighted and name not in ignored:
            raise PhraseScorerError(f"feature {name} is not among the features {name_of} was tuned with",
                                    path=ini, line=parsed.weight_line(name).line.number, hint=hint)


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12)
                                    for x, y in zip(a, b))


def check_system(recorded: Optional[Dict[str, Any]], ini: PathLike, reranker: Optional[str]) -> None:
    """Refuse the system of ``ini`` when the reranker ``recorded`` another (:func:`system_record`):
    a feature's weights differ. A reranker without the record (written before rerankers kept
    one, or tuned on lists whose moses.ini was not given) is not checked."""
    if not recorded:
        return
    now = ini_features(MosesIni.read(ini))
    tuned_for = recorded.get("moses.ini", "another moses.ini")
    for name, weights in recorded.get("weights", {}).items():
        if name in now and not _same(now[name], weights):
            shown = " ".join(f"{w:g}" for w in now[name][:3]), " ".join(f"{w:g}" for w in weights[:3])
            raise PhraseScorerError(
                f"{reranker or 'the reranker'} was tuned for another system ({tuned_for}): the weights of {name} "
                f"are {shown[0]} here, {shown[1]} there", path=ini,
                hint="translate with the system the reranker was tuned for, or build a reranker for this one")
