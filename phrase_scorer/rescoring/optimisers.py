"""Moses' optimisers (mert, kbmira) run on a dev n-best list, from the decoder's weights.

The optimiser starts from the decoder's weights, read from the ``[weight]`` section of its
moses.ini (features it does not name start at 0), or, without a moses.ini, fitted by least
squares to the totals of the dev list (the total Moses prints is the weighted sum of the
features). ``mert`` runs with ``restarts`` random starting points (``-n``, drawn between 0 and 1
for every weight, as mert-moses.pl does) besides the decoder's; ``kbmira`` (batch MIRA) runs
``mira_iterations`` epochs. Each seed is one run of the optimiser (``mert -r`` /
``kbmira --random-seed``); the run whose weights give the best BLEU on the dev list is kept. Every
BLEU here is Moses' own (the optimisers' corpus BLEU, computed from the extractor's statistics), on
the dev list as reranked by the weights.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import RerankOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.io.nbest import (
    Layout,
)
from phrase_scorer.moses.installation import MosesInstallation, read_lines, require_program, write_lines
from phrase_scorer.runtime.programs import run_logged
from phrase_scorer.rescoring.mert_files import DevList, MertData, copy_checked, read_mert_data, reranked_bleu
from phrase_scorer.rescoring.weights import Weights

log = logging.getLogger(__name__)


MIN_WEIGHT, MAX_WEIGHT = 0.0, 1.0  # where mert draws its random starting points (mert-moses.pl's default range)



@dataclass
class OptimiserRun:
    seed: int
    weights: List[float]
    dev_bleu: float  # x 100, Moses' BLEU of the dev list reranked with these weights
    reported_bleu: Optional[float]  # x 100, what the optimiser printed as its best



def weights_from_ini(ini: PathLike, layout: Layout) -> Weights:
    """The decoder's weights for the lists' features; features the ini does not weight start at 0."""
    parsed = MosesIni.read(ini)
    named = set(parsed.weight_names())
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



_BEST_POINT = re.compile(r"^Best point:(.*)=>\s*(\S+)")



_MIRA_WEIGHT = re.compile(r"^F(\d+) (\S+)$", re.ASCII)



_MIRA_BLEU = re.compile(r"^Best BLEU = (\S+)")



def run_mert(mert: Path, data_dir: Path, run_dir: Path, start: Weights, seed: int,
             options: RerankOptions) -> Tuple[List[float], float]:
    size = len(start.values)
    with open(run_dir / "init.opt", "w", encoding="utf-8") as f:
        f.write(" ".join(repr(v) for v in start.values) + "\n")
        f.write(" ".join([repr(MIN_WEIGHT)] * size) + "\n")
        f.write(" ".join([repr(MAX_WEIGHT)] * size) + "\n")
    args: List[PathLike] = [mert, "-d", str(size), "--sctype", "BLEU", "--scfile", data_dir / "dev.scores.dat",
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



def run_kbmira(kbmira: Path, data_dir: Path, run_dir: Path, start: Weights, seed: int,
               options: RerankOptions) -> Tuple[List[float], Optional[float]]:
    size = len(start.values)
    write_lines(run_dir / "init.dense",
                [f"{name}= {value!r}" for name, value in zip(start.value_names(), start.values)])
    args: List[PathLike] = [kbmira, "--sctype", "BLEU", "--dense-init", run_dir / "init.dense",
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



@dataclass
class Learned:
    weights: Weights
    start: Weights
    start_from: str
    start_dev_bleu: float
    best: OptimiserRun
    runs: List[OptimiserRun]
    dev: Optional[DevList] = None
    data: Optional[MertData] = None  # the extractor's files, for the dev BLEU of other weights



def mert_programs(moses: Optional[MosesInstallation], options: RerankOptions) -> Tuple[Path, Path]:
    """The extractor and the optimiser, checked to be there."""
    if options.method not in ("mert", "mira"):
        raise PhraseScorerError(Text(setting("method"), " takes mert or mira"))
    if options.mertdir:
        folder = Path(options.mertdir).resolve()
    elif moses is not None:
        folder = moses.bin
    else:
        raise PhraseScorerError("no Moses installation given",
                                hint=Text("pass ", setting("moses_home", "DIR"), " or set MOSES_HOME (or ",
                                          setting("mertdir"), " to mert's programs)"))
    hint = Text("build Moses' mert programs, or point ", setting("mertdir"), " or ", setting("moses_home"),
                " elsewhere")
    optimiser = "mert" if options.method == "mert" else "kbmira"
    return (require_program(folder / "extractor", "mert program extractor", hint),
            require_program(folder / optimiser, f"mert program {optimiser}", hint))



def learn_weights(dev_nbest: PathLike, dev_reference: PathLike, work: Path, *, moses: Optional[MosesInstallation],
                  options: RerankOptions = RerankOptions(), start_ini: Optional[PathLike] = None) -> Learned:
    """Weights for every dense feature of ``dev_nbest``, tuned on it against ``dev_reference``."""
    extractor, optimiser = mert_programs(moses, options)
    work = Path(work).resolve()  # the programs run inside it and get absolute paths
    if not options.seeds:
        raise PhraseScorerError("no optimiser seed given", hint=Text("pass ", setting("seeds"), " at least once"))
    dev = copy_checked(dev_nbest, work / "dev.nbest", options.ignore_features)
    references = read_lines(dev_reference)
    if len(references) != dev.sentences:
        raise PhraseScorerError(
            f"the reference has {len(references)} lines, but the n-best list's sentence ids go up to "
            f"{dev.sentences - 1}",
            path=dev_reference, hint="give the references of the sentences the n-best list was decoded from")
    write_lines(work / "dev.ref", references)
    run_logged([extractor, "--sctype", "BLEU", "--scfile", work / "dev.scores.dat",
                "--ffile", work / "dev.features.dat", "-r", work / "dev.ref", "-n", work / "dev.nbest"],
               work / "extractor.log", cwd=work)
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
    return Learned(Weights(dev.layout, best.weights), start, start_from, start_bleu, best, runs, dev, data)


def drop_unhelpful(data: MertData, weights: Weights, candidates: Sequence[str],
                   min_gain: float) -> Tuple[Weights, Dict[str, float]]:
    """``weights`` with the features among ``candidates`` that buy at most ``min_gain`` dev BLEU
    weighted 0, and the dev BLEU (x 100) after each one dropped, in the order they were dropped.

    What a feature buys is measured without tuning again: the dev BLEU of the tuned weights less
    that of the same weights with the feature's set to 0. Greedily, the feature whose loss is
    smallest goes first, as long as the dev BLEU stays within ``min_gain`` of the tuned weights';
    a negative ``min_gain`` keeps every feature."""
    tuned = reranked_bleu(data, weights.values)
    current = list(weights.values)
    names = weights.value_names()  # each value's feature
    remaining = [name for name in candidates if any(v for n, v in zip(names, current) if n == name)]
    dropped: Dict[str, float] = {}

    def zeroed(values: List[float], name: str) -> List[float]:
        return [0.0 if n == name else v for n, v in zip(names, values)]

    while remaining and min_gain >= 0:
        bleu_without = {name: reranked_bleu(data, zeroed(current, name)) for name in remaining}
        name = max(remaining, key=lambda n: bleu_without[n])  # the first of equals
        if tuned - bleu_without[name] > min_gain:
            break
        current = zeroed(current, name)
        dropped[name] = bleu_without[name]
        remaining.remove(name)
    return Weights(weights.layout, current), dropped

