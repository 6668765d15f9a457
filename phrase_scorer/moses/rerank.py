"""Re-tuning the weights of an n-best list's features with Moses' own optimisers, and reranking.

::

    dev n-best list --extractor--> features.dat + scores.dat --mert or kbmira, one run per seed--> weights
    test n-best list --weights--> the best hypothesis of each sentence, one line per sentence

The lists are fixed: nothing is decoded again. Every dense feature of the lists is weighted,
the decoder's and those ``rescore`` appended. The optimiser starts from the decoder's weights,
read from the ``[weight]`` section of its moses.ini (features it does not name start at 0), or,
without a moses.ini, fitted by least squares to the totals of the dev list (the total Moses
prints is the weighted sum of the features). ``mert`` runs with ``restarts`` random starting
points (``-n``, drawn between 0 and 1 for every weight, as mert-moses.pl does) besides the
decoder's; ``kbmira`` (batch MIRA) runs ``mira_iterations`` epochs. Each seed is one run of the
optimiser (``mert -r`` / ``kbmira --random-seed``); the run whose weights give the best BLEU on
the dev list is kept. Every BLEU here is Moses' own (the optimisers' corpus BLEU, computed from
the extractor's statistics), on the dev list as reranked by the weights.

A sentence's best hypothesis is the first of those with the largest weighted sum of the dense
features; it is written as its hypothesis field with the surrounding spaces removed, which is
the words Moses prints as the 1-best translation (it ends that line with a space). A sentence id that the test list skips gets an
empty line, so line k + 1 is always sentence k. Every sentence with hypotheses gets its line
(:func:`weighted_sum`, :func:`better`): a feature weighted 0 does not count, even at -inf; a sum
that is no number (+inf and -inf features together) ranks below every number, -inf included; so
among hypotheses whose sums are all -inf, or all undefined, the first wins: Moses' own 1-best,
as in every tie. A feature value that is NaN is refused, naming the list and the line.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import RerankOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import STDIO, AtomicOutput, PathLike
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.io.nbest import NBestEntry, check_sentence_order, dense_feature_vector, group_by_sentence, read_nbest
from phrase_scorer.runtime.programs import run_logged
from phrase_scorer.moses.installation import MosesInstallation, read_lines, require_program, write_lines
from phrase_scorer.moses.tune import fresh_directory
from phrase_scorer.runtime.resumable import make_signature, signature_describes, write_signature

log = logging.getLogger(__name__)

BLEU_ORDER = 4  # Moses' BleuScorer: n-grams up to 4, statistics (matches, total) per order, then the reference length
MIN_WEIGHT, MAX_WEIGHT = 0.0, 1.0  # where mert draws its random starting points (mert-moses.pl's default range)

Layout = Tuple[Tuple[str, int], ...]  # the dense features of a line: (name, number of values), in order


def without_features(entry: NBestEntry, ignore: Sequence[str]) -> NBestEntry:
    """``entry`` without the features labelled with a name in ``ignore`` (``entry`` itself when
    there are none to remove)."""
    if not ignore or not any(name in ignore for name, _ in entry.features):
        return entry
    return replace(entry, features=[(name, values) for name, values in entry.features if name not in ignore])


def dense_layout(entry: NBestEntry) -> Layout:
    """The dense features of an entry (labels without ``_``), as the extractor reads them."""
    return tuple((name, len(values)) for name, values in entry.features if "_" not in name)


def describe_layout(layout: Layout) -> str:
    return " ".join(f"{name}=x{count}" if count > 1 else f"{name}=" for name, count in layout)


def checked_dense_values(entry: NBestEntry, path: PathLike) -> np.ndarray:
    """The dense feature values of ``entry`` (:func:`dense_feature_vector`), refusing a NaN: no
    weight can rank a hypothesis by it. Infinite values are kept (Moses writes -inf for an
    impossible hypothesis); :func:`weighted_sum` and :func:`better` rank them."""
    values = np.asarray(dense_feature_vector(entry), np.float64)
    if np.isnan(values).any():
        position = int(np.argmax(np.isnan(values)))
        names = [name for name, count in dense_layout(entry) for _ in range(count)]
        raise PhraseScorerError(f"feature {names[position]} is nan", path=path, line=entry.line_number,
                                hint="no weight can rank a hypothesis by a value that is not a number; "
                                     "fix or drop the hypotheses that have one")
    return values


def weighted_sum(values: np.ndarray, weights: np.ndarray):
    """The weighted sum of a hypothesis' dense features (of each row, for a matrix of hypotheses);
    a feature weighted 0 does not count (its value may be -inf). Infinite values or a sum too large
    for a float give +-inf, or NaN when +inf meets -inf: :func:`better` ranks those."""
    used = weights != 0
    with np.errstate(over="ignore", invalid="ignore"):
        sums = values[..., used] @ weights[used]
    return float(sums) if sums.ndim == 0 else sums


def better(score: float, best: Optional[float]) -> bool:
    """Whether a hypothesis of weighted sum ``score`` replaces the best so far (``best``, None for
    none yet): only a strictly larger sum does, so the first of equals wins, as Moses orders its
    lists best first; NaN ranks below every number, -inf included."""
    if best is None:
        return True
    if math.isnan(score):
        return False
    return math.isnan(best) or score > best


def best_of(sums: Sequence[float]) -> int:
    """The index of the best of a sentence's weighted sums, by :func:`better`."""
    best, index = None, 0
    for i, score in enumerate(sums):
        if better(float(score), best):
            best, index = float(score), i
    return index


@dataclass
class Weights:
    """One weight per dense feature value, in the lists' order."""

    layout: Layout
    values: List[float]

    def by_name(self) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        position = 0
        for name, count in self.layout:
            out[name] = self.values[position : position + count]
            position += count
        return out

    def value_names(self) -> List[str]:
        """Each value's feature name, repeated for a feature with several values (mert-moses.pl's
        dense weight file)."""
        return [name for name, count in self.layout for _ in range(count)]


@dataclass
class OptimiserRun:
    seed: int
    weights: List[float]
    dev_bleu: float  # x 100, Moses' BLEU of the dev list reranked with these weights
    reported_bleu: Optional[float]  # x 100, what the optimiser printed as its best


@dataclass
class RerankResult:
    output: str
    sentences: int
    weights: Dict[str, List[float]]
    start_weights: Dict[str, List[float]]
    start_from: str  # the moses.ini, or "n-best totals"
    start_dev_bleu: float  # x 100
    dev_bleu: float  # x 100, of the weights kept
    best_seed: int
    runs: List[OptimiserRun] = field(default_factory=list)
    working_dir: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# --- the dev list: checking it, and what the extractor made of it -----------------------------------


@dataclass
class DevList:
    layout: Layout
    sentences: int  # largest id + 1
    gram: np.ndarray  # X'X of the dense features, for the fit to the totals
    moment: np.ndarray  # X'y
    totals_square: float  # y'y
    lines: int
    largest_list: int = 0  # most hypotheses of one sentence: the n-best size the lists were decoded with


def copy_checked(nbest: PathLike, copy: Path, ignore: Sequence[str] = ()) -> DevList:
    """Copy ``nbest`` to ``copy`` as plain text, without the features in ``ignore``, checking
    that its ids are grouped in increasing order and that every line has the same dense features, as the optimisers need.

    Accumulates what the least-squares fit to the totals needs, with features and totals taken
    relative to their sentence's mean: a total also holds features Moses leaves out of n-best
    lists (the unknown-word penalty, -100 per word passed through), which are the same for every
    hypothesis of a sentence."""
    layout: Optional[Layout] = None
    gram = moment = None
    totals_square = 0.0
    last_id = -1
    count = largest = 0
    with open(copy, "wb") as out:
        for _, entries in group_by_sentence(without_features(e, ignore) for e in read_nbest(nbest)):
            for entry in entries:
                found = dense_layout(entry)
                if layout is None:
                    layout = found
                    if not layout:
                        raise PhraseScorerError("the n-best list has no dense features", path=nbest, line=entry.line_number)
                elif found != layout:
                    raise PhraseScorerError(
                        f"the dense features are {describe_layout(found)}, not {describe_layout(layout)} as on the "
                        "first line", path=nbest, line=entry.line_number,
                        hint="every line must carry the same features, in the same order")
                check_sentence_order(entry, last_id, nbest)
                last_id = entry.sentence_id
                out.write(entry.to_line().encode("utf-8"))
            features = np.array([checked_dense_values(e, nbest) for e in entries])  # (H, D)
            totals = np.array([e.total for e in entries])  # (H,)
            features -= features.mean(0)
            totals -= totals.mean()
            if gram is None:
                gram, moment = np.zeros((features.shape[1],) * 2), np.zeros(features.shape[1])
            gram += features.T @ features
            moment += features.T @ totals
            totals_square += float(totals @ totals)
            count += len(entries)
            largest = max(largest, len(entries))
    if count == 0:
        raise PhraseScorerError("the n-best list is empty", path=nbest)
    return DevList(layout, last_id + 1, gram, moment, totals_square, count, largest)


@dataclass
class MertData:
    """The extractor's files for the dev list: per sentence, its hypotheses' dense features and
    BLEU statistics."""

    features: List[np.ndarray]  # per sentence (H, D)
    stats: List[np.ndarray]  # per sentence (H, 2 * BLEU_ORDER + 1)


_BEGIN = re.compile(r"^(FEATURES|SCORES)_TXT_BEGIN_0 (\S+) (\d+) (\d+)")


def read_blocks(path: Path, width: int) -> Iterator[Tuple[str, np.ndarray]]:
    """(sentence index, (H, width) values) for each block of a text features.dat or scores.dat;
    sparse features after the first ``width`` values are ignored."""
    with open(path, encoding="utf-8") as f:
        number = 0
        for line in f:
            number += 1
            match = _BEGIN.match(line)
            if not match:
                raise PhraseScorerError("expected a *_TXT_BEGIN_0 header", path=path, line=number,
                                        hint="the extractor's output looks damaged")
            index, rows, columns = match.group(2), int(match.group(3)), int(match.group(4))
            if columns != width:
                raise PhraseScorerError(f"{columns} values per hypothesis, expected {width}", path=path, line=number)
            block = np.empty((rows, width))
            for r in range(rows):
                number += 1
                block[r] = [float(v) for v in next(f).split()[:width]]
            number += 1
            next(f)  # *_TXT_END_0
            yield index, block


def read_mert_data(features_path: Path, scores_path: Path, dimensions: int) -> MertData:
    features, stats = [], []
    for (f_index, f_block), (s_index, s_block) in zip(read_blocks(features_path, dimensions),
                                                      read_blocks(scores_path, 2 * BLEU_ORDER + 1)):
        if f_index != s_index or len(f_block) != len(s_block):
            raise PhraseScorerError(f"sentence {f_index} of the features does not match sentence {s_index} of the scores",
                                    path=scores_path)
        features.append(f_block)
        stats.append(s_block)
    return MertData(features, stats)


def moses_bleu(stats: np.ndarray) -> float:
    """Corpus BLEU from summed statistics, as Moses' BleuScorer computes it (x 100)."""
    log_bleu = 0.0
    for n in range(BLEU_ORDER):
        matches, total = stats[2 * n], stats[2 * n + 1]
        if matches == 0:
            return 0.0
        log_bleu += math.log(matches) - math.log(total)
    log_bleu /= BLEU_ORDER
    brevity = 1.0 - stats[2 * BLEU_ORDER] / stats[1]
    if brevity < 0.0:
        log_bleu += brevity
    return 100.0 * math.exp(log_bleu)


def reranked_bleu(data: MertData, weights: Sequence[float]) -> float:
    """BLEU (x 100) of the dev list's best hypotheses under ``weights``, chosen as
    :func:`apply_weights` chooses them (:func:`weighted_sum`, :func:`best_of`)."""
    w = np.asarray(weights, np.float64)
    total = np.zeros(2 * BLEU_ORDER + 1)
    for features, stats in zip(data.features, data.stats):
        total += stats[best_of(weighted_sum(features, w))]
    return moses_bleu(total)


# --- starting weights ----------------------------------------------------------------------------


def weights_from_ini(ini: PathLike, layout: Layout) -> Weights:
    """The decoder's weights for the lists' features; features the ini does not weight start at 0."""
    parsed = MosesIni.read(ini)
    named = {line.content.split()[0][:-1] for line in parsed.section_lines("weight") if line.content.split()[0].endswith("=")}
    values: List[float] = []
    for name, count in layout:
        if name not in named:
            log.info("%s is not in %s; its weights start at 0", name, ini)
            values += [0.0] * count
            continue
        found = parsed.weight_line(name)
        if len(found.weights) != count:
            raise parsed.error(f"{name} has {len(found.weights)} weights, but the n-best list has {count} values of it",
                               found.line.number, "give the moses.ini the n-best lists were decoded with")
        values += found.weights
    return Weights(layout, values)


def weights_from_totals(dev: DevList) -> Tuple[Weights, float]:
    """Least-squares weights that reproduce the differences between the totals of a sentence's
    hypotheses from their dense features, and the root-mean-square difference left."""
    solution = np.linalg.lstsq(dev.gram, dev.moment, rcond=None)[0]
    residual = dev.totals_square - 2 * solution @ dev.moment + solution @ dev.gram @ solution
    return Weights(dev.layout, [float(v) for v in solution]), math.sqrt(max(residual, 0.0) / dev.lines)


# --- the optimisers ------------------------------------------------------------------------------


_BEST_POINT = re.compile(r"^Best point:(.*)=>\s*(\S+)")
_MIRA_WEIGHT = re.compile(r"^F(\d+) (\S+)$")
_MIRA_BLEU = re.compile(r"^Best BLEU = (\S+)")


def run_mert(mert: Path, data_dir: Path, run_dir: Path, start: Weights, seed: int, options: RerankOptions) -> Tuple[List[float], float]:
    size = len(start.values)
    with open(run_dir / "init.opt", "w", encoding="utf-8") as f:
        f.write(" ".join(repr(v) for v in start.values) + "\n")
        f.write(" ".join([repr(MIN_WEIGHT)] * size) + "\n")
        f.write(" ".join([repr(MAX_WEIGHT)] * size) + "\n")
    args = [mert, "-d", str(size), "--sctype", "BLEU", "--scfile", data_dir / "dev.scores.dat",
            "--ffile", data_dir / "dev.features.dat", "--ifile", run_dir / "init.opt",
            "-n", str(options.restarts), "-r", str(seed)]
    if options.threads > 1:
        args += ["--threads", str(options.threads)]
    log_path = run_dir / "mert.log"
    run_logged(args, log_path, cwd=run_dir)
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _BEST_POINT.match(line)
        if match:
            weights = [float(v) for v in match.group(1).split()]
            if len(weights) != size:
                break
            return weights, 100 * float(match.group(2))
    raise PhraseScorerError("mert finished without a 'Best point' line of the expected size", path=log_path)


def run_kbmira(kbmira: Path, data_dir: Path, run_dir: Path, start: Weights, seed: int, options: RerankOptions) -> Tuple[List[float], Optional[float]]:
    size = len(start.values)
    write_lines(run_dir / "init.dense", [f"{name}= {value!r}" for name, value in zip(start.value_names(), start.values)])
    args = [kbmira, "--sctype", "BLEU", "--dense-init", run_dir / "init.dense",
            "--ffile", data_dir / "dev.features.dat", "--scfile", data_dir / "dev.scores.dat",
            "--random-seed", str(seed), "--iters", str(options.mira_iterations), "-o", run_dir / "weights.txt"]
    log_path = run_dir / "kbmira.log"
    run_logged(args, log_path, cwd=run_dir)
    weights = [0.0] * size
    out = run_dir / "weights.txt"
    if not out.exists():
        raise PhraseScorerError("kbmira wrote no weights (no epoch improved on BLEU 0)", path=log_path)
    for line in out.read_text(encoding="utf-8").splitlines():
        match = _MIRA_WEIGHT.match(line)
        if match and int(match.group(1)) < size:
            weights[int(match.group(1))] = float(match.group(2))
    norm = sum(abs(w) for w in weights)
    if norm < 1e-9:
        raise PhraseScorerError("kbmira's weights are all zero", path=out)
    reported = None
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _MIRA_BLEU.match(line)
        if match:
            reported = 100 * float(match.group(1))
    return [w / norm for w in weights], reported  # L1-normalised, as mert-moses.pl does


# --- learning and applying ----------------------------------------------------------------------


@dataclass
class Learned:
    weights: Weights
    start: Weights
    start_from: str
    start_dev_bleu: float
    best: OptimiserRun
    runs: List[OptimiserRun]
    dev: Optional[DevList] = None


def mert_programs(moses: Optional[MosesInstallation], options: RerankOptions) -> Tuple[Path, Path]:
    """The extractor and the optimiser, checked to be there."""
    if options.method not in ("mert", "mira"):
        raise PhraseScorerError("--method takes mert or mira")
    if options.mertdir:
        folder = Path(options.mertdir).resolve()
    elif moses is not None:
        folder = moses.bin
    else:
        raise PhraseScorerError("no Moses installation given",
                                hint="pass --moses-home DIR or set MOSES_HOME (or --mertdir to mert's programs)")
    hint = "build Moses' mert programs, or point --mertdir or --moses-home elsewhere"
    optimiser = "mert" if options.method == "mert" else "kbmira"
    return (require_program(folder / "extractor", "mert program extractor", hint),
            require_program(folder / optimiser, f"mert program {optimiser}", hint))


def learn_weights(dev_nbest: PathLike, dev_reference: PathLike, work: Path, *, moses: Optional[MosesInstallation],
                  options: RerankOptions = RerankOptions(), start_ini: Optional[PathLike] = None) -> Learned:
    """Weights for every dense feature of ``dev_nbest``, tuned on it against ``dev_reference``."""
    extractor, optimiser = mert_programs(moses, options)
    work = Path(work).resolve()  # the programs run inside it and get absolute paths
    if not options.seeds:
        raise PhraseScorerError("no optimiser seed given", hint="pass --seed at least once")
    dev = copy_checked(dev_nbest, work / "dev.nbest", options.ignore_features)
    references = read_lines(dev_reference)
    if len(references) != dev.sentences:
        raise PhraseScorerError(
            f"the reference has {len(references)} lines, but the n-best list's sentence ids go up to {dev.sentences - 1}",
            path=dev_reference, hint="give the references of the sentences the n-best list was decoded from")
    write_lines(work / "dev.ref", references)
    run_logged([extractor, "--sctype", "BLEU", "--scfile", work / "dev.scores.dat", "--ffile", work / "dev.features.dat",
                "-r", work / "dev.ref", "-n", work / "dev.nbest"], work / "extractor.log", cwd=work)
    size = sum(n for _, n in dev.layout)
    data = read_mert_data(work / "dev.features.dat", work / "dev.scores.dat", size)
    (work / "dev.nbest").unlink()  # a plain copy of the whole list; the extractor's files hold what is needed

    if start_ini is not None:
        start, start_from = weights_from_ini(start_ini, dev.layout), os.path.abspath(start_ini)
    else:
        start, rms = weights_from_totals(dev)
        start_from = "n-best totals"
        log.info("starting weights fitted to the dev list's totals (root-mean-square difference %.3g)", rms)
    start_bleu = reranked_bleu(data, start.values)
    log.info("dev BLEU with the starting weights: %.2f", start_bleu)

    runs = []
    for seed in options.seeds:
        run_dir = work / f"seed{seed}"
        run_dir.mkdir()
        run = run_mert if options.method == "mert" else run_kbmira
        weights, reported = run(optimiser, work, run_dir, start, seed, options)
        bleu = reranked_bleu(data, weights)
        runs.append(OptimiserRun(seed, weights, bleu, reported))
        log.info("%s seed %d: dev BLEU %.2f", options.method, seed, bleu)
    best = max(runs, key=lambda r: r.dev_bleu)  # the first of equals
    return Learned(Weights(dev.layout, best.weights), start, start_from, start_bleu, best, runs, dev)


def apply_weights(nbest: PathLike, weights: Weights, output: PathLike, ignore: Sequence[str] = ()) -> int:
    """Write the best hypothesis of each sentence of ``nbest`` under ``weights`` (the features in
    ``ignore`` left out); returns the number of lines written (largest sentence id + 1). Each
    sentence's best is chosen by :func:`weighted_sum` and :func:`better`: never none."""
    w = np.asarray(weights.values, np.float64)
    if not np.isfinite(w).all():
        name = weights.value_names()[int(np.argmax(~np.isfinite(w)))]
        raise PhraseScorerError(f"the weight of {name} is {w[~np.isfinite(w)][0]}, not a finite number",
                                hint="tune the weights again")
    written = 0

    def best_lines() -> Iterator[bytes]:
        nonlocal written
        last_id, best, best_score = -1, None, None
        for entry in read_nbest(nbest):
            found = dense_layout(without_features(entry, ignore))
            if found != weights.layout:
                raise PhraseScorerError(
                    f"the dense features are {describe_layout(found)}, but the weights are for "
                    f"{describe_layout(weights.layout)}", path=nbest, line=entry.line_number,
                    hint="rerank lists made by the same decoder and rescored with the same models")
            check_sentence_order(entry, last_id, nbest)
            if entry.sentence_id != last_id:
                if best is not None:
                    yield best
                    written += 1
                for _ in range(written, entry.sentence_id):  # a sentence with no hypotheses
                    yield b"\n"
                    written += 1
                last_id, best, best_score = entry.sentence_id, None, None
            score = weighted_sum(checked_dense_values(without_features(entry, ignore), nbest), w)
            if better(score, best_score):
                best, best_score = (entry.hypothesis.strip(" ") + "\n").encode("utf-8"), score
        if best is not None:
            yield best
            written += 1

    with AtomicOutput(output) as out:
        chunk: List[bytes] = []
        for line in best_lines():
            chunk.append(line)
            if len(chunk) == 4096:
                out.write(b"".join(chunk))
                chunk = []
        out.write(b"".join(chunk))
        if written == 0:
            raise PhraseScorerError("the n-best list is empty", path=nbest)
        out.commit()
    return written


# --- the reranker file: what rerank tuned, applied to new lists ---------------------------------------


RERANKER_FORMAT = "phrase-scorer-reranker"
RERANKER_VERSION = 1


def rescore_signature(nbest: PathLike) -> Optional[dict]:
    """The signature ``rescore`` wrote beside ``nbest`` (``NBEST.json``), checked to describe the
    list as it is now (:func:`~phrase_scorer.runtime.resumable.signature_describes`: its size, then its
    SHA-256); None when the list has no rescore signature (a list made otherwise). A signature
    of other bytes (the list was rewritten since, by another command or another rescore) is
    refused: its models are not those of this list's features."""
    signature = Path(os.fspath(nbest) + ".json")
    try:
        data = json.loads(signature.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("tool") != "phrase-scorer rescore":
        return None
    current = signature_describes(nbest, data)
    if current is False:
        raise PhraseScorerError(f"{signature} does not describe this list any more: the list was rewritten since "
                                "rescore signed it, so the models behind its features are unknown", path=nbest,
                                hint="rescore the list again with the models the reranker was tuned with")
    if current is None:
        # Written before signatures recorded the list's size and SHA-256: accepted, as a list
        # without any signature is (refusing it would only teach deleting NBEST.json), with a
        # warning that it cannot be checked against the list.
        log.warning("%s predates signatures that record their list's size and SHA-256: cannot check that it still "
                    "describes %s (rescore the list again to make it checkable)", signature, os.fspath(nbest))
    return data


def rescored_models(nbest: PathLike) -> Dict[str, dict]:
    """The models behind the features ``rescore`` added to ``nbest``, read from its signature
    (:func:`rescore_signature`): feature name -> directory, weights_sha256, reverse, normalize (for an
    ensemble, directory and weights_sha256 list its models). Empty when the list has no such
    signature (a list made otherwise)."""
    data = rescore_signature(nbest)
    if data is None:
        return {}
    try:
        normalize = bool(data.get("options", {}).get("normalize", False))
        found: Dict[str, dict] = {}
        for m in data["models"]:
            if m["name"] in found:  # another model of an ensemble
                for key in ("directory", "weights_sha256"):
                    before = found[m["name"]][key]
                    found[m["name"]][key] = (before if isinstance(before, list) else [before]) + [m[key]]
            else:
                found[m["name"]] = {"directory": m["directory"], "weights_sha256": m["weights_sha256"],
                                    "reverse": bool(m["reverse"]), "normalize": normalize}
        return found
    except (AttributeError, KeyError, TypeError):
        return {}


def reranker_record(weights: Weights, ignore_features: Sequence[str], models: Dict[str, dict], *,
                    nbest_size: Optional[int] = None, decoder_flags: Optional[str] = None) -> dict:
    """What a reranker file holds (``rerank`` adds its runs and dev BLEU): the weights by feature
    in the lists' order, the features left out, the models behind the added features, and the
    n-best size (most hypotheses of a dev sentence) and decoder options the lists were made with."""
    return {"format": RERANKER_FORMAT, "version": RERANKER_VERSION,
            "layout": [[name, count] for name, count in weights.layout], "weights": weights.by_name(),
            "ignore_features": list(ignore_features), "models": models,
            "decoder": {"nbest_size": nbest_size, "decoder_flags": decoder_flags}}


@dataclass
class Reranker:
    """A tuned reranker, as ``rerank`` wrote it: weights by feature, the features left out, and
    the models behind the features that ``rescore`` added."""

    path: str
    weights: Weights
    ignore_features: Tuple[str, ...]
    models: Dict[str, dict]
    decoder: Dict[str, Any] = field(default_factory=dict)  # nbest_size, decoder_flags of the tuned lists


class _NotFinite(str):
    """A JSON number that is not a finite float (NaN, Infinity, 1e400), kept as its text for the message."""


def _parse_float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


class RerankerFile:
    """The typed reader of a reranker file: each method returns the value at ``key`` (a JSON path
    such as ``weights.LM0[0]``) checked to be of its type, or raises a one-line error naming the
    file and the key."""

    HINT = "tune it again with 'phrase-scorer rerank --dev ...', or give the OUTPUT.json it wrote unchanged"

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
            return float(value)
        except OverflowError:  # an integer too large for a float
            raise self.error(key, f"is {self.describe(value)}, not a finite number") from None

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
        return {"nbest_size": None if size is None else self.count(size, "decoder.nbest_size"),
                "decoder_flags": None if flags is None else self.string(flags, "decoder.decoder_flags")}

    def read(self) -> Reranker:
        try:
            data = json.loads(Path(self.path).read_text(encoding="utf-8"), parse_float=_parse_float,
                              parse_constant=_NotFinite)
        except OSError as exc:
            raise PhraseScorerError(f"cannot read the reranker ({exc.strerror})", path=self.path) from None
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or data.get("format") != RERANKER_FORMAT:
            raise PhraseScorerError(
                "not a reranker file", path=self.path,
                hint="give the OUTPUT.json that 'phrase-scorer rerank --dev ...' wrote beside its output")
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
        return Reranker(self.path, weights, ignore, models, decoder)


def read_reranker(path: PathLike) -> Reranker:
    """The reranker file ``path``, read through its one schema (:class:`RerankerFile`): the format
    and version, a non-empty layout of dense features, one list of finite numbers per feature as
    long as the layout says, the features left out, the models (directory, weights' SHA-256,
    direction, normalisation) and the decoder's n-best size and flags. Keys it does not know
    (the runs and BLEU ``rerank`` records) are left alone."""
    return RerankerFile(os.fspath(path)).read()


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


def apply_reranker(reranker: PathLike, nbest: PathLike, output: PathLike) -> int:
    """Write the best hypothesis of each sentence of ``nbest`` under the weights of the reranker
    file ``reranker``: the lines ``rerank`` wrote for the list when it tuned them. Returns the
    number of lines written."""
    loaded = read_reranker(reranker)
    check_rescored_with_same_models(loaded, nbest)
    return apply_weights(nbest, loaded.weights, output, loaded.ignore_features)


def rerank(dev_nbest: PathLike, dev_reference: PathLike, test_nbest: PathLike, output: PathLike, *,
           moses: Optional[MosesInstallation], options: RerankOptions = RerankOptions(),
           start_ini: Optional[PathLike] = None, working_dir: Optional[PathLike] = None,
           decoder_flags: Optional[str] = None) -> RerankResult:
    """Tune the weights on the dev list, then write the test list's 1-best to ``output`` and the
    reranker (weights, the models behind the features, runs and dev BLEU) to ``output.json``;
    ``decoder_flags`` (the decoder options the lists were made with) is recorded there."""
    output = os.fspath(output)
    if output == STDIO:
        raise PhraseScorerError("rerank needs a named output file (its weights go beside it, in OUTPUT.json)")
    for path in (dev_nbest, test_nbest):
        if os.fspath(path) == STDIO:
            raise PhraseScorerError("rerank reads its n-best lists twice; give them as files, not '-'")
    mert_programs(moses, options)  # before any work
    dev_models = rescored_models(dev_nbest)  # a stale signature is refused before the optimisers run
    work = fresh_directory(Path(working_dir or output + ".work").resolve(), verb="rerank")
    learned = learn_weights(dev_nbest, dev_reference, work, moses=moses, options=options, start_ini=start_ini)
    sentences = apply_weights(test_nbest, learned.weights, output, options.ignore_features)
    result = RerankResult(
        output=output, sentences=sentences, weights=learned.weights.by_name(), start_weights=learned.start.by_name(),
        start_from=learned.start_from, start_dev_bleu=learned.start_dev_bleu, dev_bleu=learned.best.dev_bleu,
        best_seed=learned.best.seed, runs=learned.runs, working_dir=os.fspath(work),
    )
    write_signature(output, make_signature(
        "phrase-scorer rerank",
        reranker_record(learned.weights, options.ignore_features, dev_models,
                        nbest_size=learned.dev.largest_list if learned.dev else None, decoder_flags=decoder_flags),
        dev={"nbest": os.path.abspath(dev_nbest), "reference": os.path.abspath(dev_reference)},
        test={"nbest": os.path.abspath(test_nbest)}, options=asdict(options),
        bleu="Moses' BleuScorer on the dev list (x 100)", **result.to_dict()))
    log.info("test 1-best: %s (%d sentences); weights of seed %d, dev BLEU %.2f (start %.2f), in %s.json",
             output, sentences, result.best_seed, result.dev_bleu, result.start_dev_bleu, output)
    return result
