"""The steps both experiments run on a tuned Moses system (``rescore-experiment`` and
``build-reranker``), each resumable by its recorded inputs (:class:`~phrase_scorer.records.Step`).

::

    tuned moses.ini --moses, N distinct--> a set's n-best list                nbest/<set>.nbest
        --rescore, every model at once--> the rescored list                   rescored/<set>.nbest.gz
        --rerank, per row and optimiser seed--> weights, the 1-best of each set   rows/<row>/seed<k>/
        --the row's best seed--> its reranker                                 rerankers/<row>.json

A *set* (:class:`EvalSet`) is a source, its reference and optionally an n-best list given
already; a *row* (:class:`Row`) is the rescoring features added to the decoder's (none: the
decoder's features re-tuned on the lists, :data:`RETUNED_ROW`); a *row run* (:class:`RowRun`)
is one row tuned with one optimiser seed, or a decoder's 1-best, with its scores per set.
Rerankers are made and signed by :func:`~phrase_scorer.rescoring.reranker.tuned_reranker`, as
``rerank`` makes its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from phrase_scorer.config import RerankOptions, RescoreExperimentOptions, RescoreOptions, RunOptions, ScoringOptions
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_identity, file_sha256
from phrase_scorer.io.paths import PathLike, part_path
from phrase_scorer.io.nbest import group_by_sentence, read_nbest
from phrase_scorer.moses.evaluate import Decoding, Evaluation, decode, score
from phrase_scorer.moses.installation import MosesInstallation, read_lines
from phrase_scorer.rescoring.optimisers import learn_weights
from phrase_scorer.rescoring.reranker import most_hypotheses, rescored_models, tuned_reranker
from phrase_scorer.rescoring.weights import Weights, apply_weights
from phrase_scorer.runtime.programs import fresh_directory
from phrase_scorer.records import Step, read_record

log = logging.getLogger(__name__)

RETUNED_ROW = "Moses, re-tuned on the lists"


def folder_name(label: str) -> str:
    """A row's folder under ``rows/``: its label in lowercase letters, digits and dashes."""
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower() or "row"


@dataclass(frozen=True)
class Row:
    label: str
    features: Tuple[str, ...]  # the rescoring features added to the decoder's; () for the decoder's alone

    @property
    def folder(self) -> str:
        return folder_name(self.label)


@dataclass(frozen=True)
class EvalSet:
    """One set: its name in the report, its source and reference, and (optionally) an n-best list
    already decoded with the tuned system."""

    name: str
    source: str
    reference: str
    nbest: Optional[str] = None


def set_name(source: PathLike) -> str:
    """``val.tok.en.gz`` -> ``val``."""
    return os.path.basename(os.fspath(source)).split(".")[0] or "set"


@dataclass
class RowRun:
    row: str
    seed: Optional[int]  # None for the decoder's own 1-best
    scores: Dict[str, Dict[str, float]]  # set name -> {"bleu", "chrf"}
    hypotheses: Dict[str, str]  # set name -> file
    weights: Dict[str, List[float]] = field(default_factory=dict)
    tuned_dev_bleu: Optional[float] = None  # Moses' BLEU of the reranked dev list (the optimiser's)

    def add(self, eval_set: "EvalSet", hypotheses: Path, options: RescoreExperimentOptions) -> Evaluation:
        """Score the run's output ``hypotheses`` of ``eval_set`` into its row."""
        evaluation = scores_of(read_lines(hypotheses), read_lines(eval_set.reference), options)
        self.scores[eval_set.name] = {"bleu": evaluation.bleu, "chrf": evaluation.chrf}
        self.hypotheses[eval_set.name] = os.fspath(hypotheses)
        return evaluation


# --- the steps ------------------------------------------------------------------------------------


def nbest_flags(options: RescoreExperimentOptions) -> str:
    """The decoder options the n-best lists are made with, but the list itself: what ``rerank
    --decoder-flags`` records, so that ``translate-system --moses --reranker`` decodes lists alike."""
    return f"{options.decoder_flags} -n-best-factor {options.nbest_factor}".strip()


def decoded_nbest(ini: Path, eval_set: EvalSet, work: Path, moses: MosesInstallation,
                  options: RescoreExperimentOptions) -> Path:
    """The set's n-best list: the one given, or decoded with ``ini`` (``N distinct``)."""
    if eval_set.nbest is not None:
        return Path(eval_set.nbest)
    folder = work / "nbest"
    folder.mkdir(exist_ok=True)
    nbest = folder / f"{eval_set.name}.nbest"
    step = Step(folder / f"{eval_set.name}.inputs.json",
                {"moses.ini sha256": file_sha256(ini), "source": file_identity(eval_set.source),
                 "size": options.nbest_size, "factor": options.nbest_factor, "decoder": options.decoder,
                 "decoder flags": options.decoder_flags},
                [nbest])
    if step.done:
        log.info("%s: n-best list already decoded", eval_set.name)
        return nbest
    with step:
        # Moses writes the list into a folder made for this run (never through a file or link already there)
        building = Path(tempfile.mkdtemp(prefix=f"{eval_set.name}.nbest.", suffix=".part", dir=folder))
        try:
            part = building / nbest.name
            log.info("%s: decoding %d-best lists", eval_set.name, options.nbest_size)
            decode(ini, eval_set.source, folder / f"{eval_set.name}.1best", moses=moses,
                   decoding=Decoding(options.threads, nbest_flags(options), options.decoder,
                                     nbest_list=(part, options.nbest_size)), overwrite=True)
            os.replace(part, nbest)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return nbest


def rescored_nbest(nbest: Path, eval_set: EvalSet, work: Path, models: Sequence, options: RescoreExperimentOptions,
                   scoring_options: ScoringOptions) -> Path:
    """The set's list with every model's feature appended (``rescore``, resumed if interrupted)."""
    from phrase_scorer.rescoring.rescore import rescore
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    folder = work / "rescored"
    folder.mkdir(exist_ok=True)
    out = folder / f"{eval_set.name}.nbest.gz"
    rescore_options = RescoreOptions(normalize=options.normalize)
    step = Step(folder / f"{eval_set.name}.inputs.json",
                {"nbest": file_identity(nbest), "source": file_identity(eval_set.source),
                 "models": [m.describe() for m in models], "options": asdict(rescore_options),
                 "scoring": [BatchScorer(m.loaded.model, scoring_options).describe() for m in models]},
                [out])
    if step.done:
        log.info("%s: n-best list already rescored", eval_set.name)
        return out
    with step:
        rescore(nbest, eval_set.source, out, models, rescore_options, scoring_options,
                run=RunOptions(resume=part_path(out).exists(), overwrite=True))
    return out


def first_hypotheses(nbest: PathLike) -> List[str]:
    """The decoder's 1-best: each sentence's first hypothesis, the words Moses prints (without the
    space it ends its 1-best lines with)."""
    out: List[str] = []
    for sentence_id, entries in group_by_sentence(read_nbest(nbest)):
        out.extend([""] * (sentence_id - len(out)))
        out.append(entries[0].hypothesis.strip(" "))
    return out


def scores_of(hypotheses: Sequence[str], references: Sequence[str], options: RescoreExperimentOptions) -> Evaluation:
    return score(hypotheses, references, kind=options.references, lang=options.lang)


@dataclass(frozen=True)
class RowTuning:
    """What every tuned run of every row shares: each set's rescored list (set name -> path), the
    sets (the dev set first), every feature the models add, the moses.ini whose weights start the
    optimiser, the working folder, Moses and the options."""

    rescored: Dict[str, Path]
    sets: Sequence[EvalSet]
    features: Sequence[str]
    ini: Path
    work: Path
    moses: MosesInstallation
    options: RescoreExperimentOptions


def tuned_row_run(row: Row, seed: int, tuning: RowTuning) -> RowRun:
    """Tune ``row``'s features on the dev list with one optimiser seed and rerank every set."""
    rescored, sets, ini, options = tuning.rescored, tuning.sets, tuning.ini, tuning.options
    run_dir = tuning.work / "rows" / row.folder / f"seed{seed}"
    ignore = tuple(f for f in tuning.features if f not in row.features)
    rerank_options = RerankOptions(method=options.method, seeds=(seed,), restarts=options.restarts,
                                   threads=options.threads or os.cpu_count() or 1, ignore_features=ignore,
                                   mertdir=options.mertdir)
    result_path = run_dir / "result.json"
    step = Step(run_dir / "inputs.json",
                {"row": asdict(row), "lists": {s.name: file_identity(rescored[s.name]) for s in sets},
                 "references": {s.name: file_identity(s.reference) for s in sets},
                 "start ini sha256": file_sha256(ini), "rerank options": asdict(rerank_options),
                 "scoring": {"references": options.references, "lang": options.lang}},
                [result_path])
    if step.done:
        record = read_record(result_path)
        assert record is not None  # a finished step's outputs are there
        return RowRun(**record)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # what an interrupted run left: the optimiser starts again
    with step:
        dev = sets[0]
        learned = learn_weights(rescored[dev.name], dev.reference, fresh_directory(run_dir / "tune", verb="rerank"),
                                moses=tuning.moses, options=rerank_options, start_ini=ini)
        run = RowRun(row=row.label, seed=seed, scores={}, hypotheses={}, weights=learned.weights.by_name(),
                     tuned_dev_bleu=learned.best.dev_bleu)
        for eval_set in sets:
            hyp = run_dir / f"{eval_set.name}.hyp"
            apply_weights(rescored[eval_set.name], learned.weights, hyp, ignore)
            run.add(eval_set, hyp, options)
        write_text_atomically(result_path, json.dumps(asdict(run), indent=1) + "\n")
    log.info("%s, seed %d: %s", row.label, seed,
             ", ".join(f"{name} BLEU {s['bleu']:.2f}" for name, s in run.scores.items()))
    return run


def write_rerankers(runs: Sequence[RowRun], rows: Sequence[Row], dev_nbest: Path, work: Path,
                    decoder_flags: Optional[str],
                    command: str = "phrase-scorer rescore-experiment",
                    system: Optional[dict] = None) -> Dict[str, str]:
    """Per tuned row, the reranker of its run with the best tuned dev BLEU (the first such seed),
    made and signed as ``rerank`` makes one (:func:`~phrase_scorer.rescoring.reranker.tuned_reranker`:
    weights, the features the row leaves out, the models behind the rescored dev list's features,
    its n-best size, ``decoder_flags``, the ``system`` that decoded the dev list,
    :func:`~phrase_scorer.moses.system.system_record`), every feature of the row kept:
    ``work/rerankers/<row>.json``, what ``translate-system --moses INI --reranker`` takes. Row label -> path."""
    models = rescored_models(dev_nbest)
    largest = most_hypotheses(dev_nbest)
    written: Dict[str, str] = {}
    for row in rows:
        tuned_runs = [r for r in runs if r.row == row.label and r.tuned_dev_bleu is not None]
        if not tuned_runs:
            continue
        best = max(tuned_runs, key=lambda r: r.tuned_dev_bleu or 0.0)
        layout = tuple((name, len(values)) for name, values in best.weights.items())
        weights = Weights(layout, [v for values in best.weights.values() for v in values])
        tuned, _ = tuned_reranker(weights, dev_nbest, ignore_features=[name for name in models
                                                                       if name not in row.features],
                                  decoder_flags=decoder_flags, system=system, models=models, nbest_size=largest)
        path = work / "rerankers" / f"{row.folder}.json"
        path.parent.mkdir(exist_ok=True)
        record = tuned.signature(command, row=row.label, seed=best.seed, dev={"nbest": os.fspath(dev_nbest)},
                                 dev_bleu=best.tuned_dev_bleu, bleu="Moses' BleuScorer on the dev list (x 100)")
        write_text_atomically(path, json.dumps(record.to_json(), indent=1) + "\n")
        written[row.label] = os.fspath(path)
    return written
