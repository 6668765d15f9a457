"""The ``rerank`` verb: tune every feature's weight of a rescored dev n-best list, then rerank a test list.

::

    dev n-best list --extractor--> features.dat + scores.dat --mert or kbmira, one run per seed--> weights
    test n-best list --weights--> the best hypothesis of each sentence, one line per sentence

The lists are fixed: nothing is decoded again. Every dense feature of the lists is weighted, the
decoder's and those ``rescore`` appended. The extractor's files and Moses' BLEU:
:mod:`~phrase_scorer.rescoring.mert_files`; the optimisers and the starting weights:
:mod:`~phrase_scorer.rescoring.optimisers`; applying weights: :mod:`~phrase_scorer.rescoring.weights`;
the reranker and its file: :mod:`~phrase_scorer.rescoring.reranker`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple


from phrase_scorer.config import MOSES_NBEST_FACTOR, NBestOrigin, RerankOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.inputs import refuse_single_pass
from phrase_scorer.io.outputs import OutputKind
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import dense_layout, read_nbest
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation
from phrase_scorer.moses.system import decoded_with, system_record
from phrase_scorer.runtime.programs import fresh_directory
from phrase_scorer.rescoring.optimisers import OptimiserRun, learn_weights, mert_programs
from phrase_scorer.rescoring.reranker import FeatureDropping, rescored_models, tuned_reranker
from phrase_scorer.rescoring.weights import write_best_hypotheses
from phrase_scorer.runtime.job import OutputJob

log = logging.getLogger(__name__)





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
    # model features weighted 0 because they bought at most options.min_feature_gain dev BLEU:
    # name -> dev BLEU (x 100) once it was dropped; dev_bleu is that of the tuned weights
    dropped: Dict[str, float] = field(default_factory=dict)
    runs: List[OptimiserRun] = field(default_factory=list)
    working_dir: str = ""

    def to_dict(self) -> dict:
        return asdict(self)



RERANK_COMPANIONS = (".part", ".json")  # the reranker goes to OUTPUT.json


def rerank(dev: Tuple[PathLike, PathLike], test_nbest: PathLike, output: PathLike, *, moses: MosesGiven = None,
           options: RerankOptions = RerankOptions(), origin: NBestOrigin = NBestOrigin(),
           working_dir: Optional[PathLike] = None, overwrite: bool = False) -> RerankResult:
    """Tune the weights on the dev list (``dev``: the rescored n-best list and its references),
    then write the test list's 1-best to ``output`` and the reranker (weights, the models behind
    the features, runs and dev BLEU) to ``output.json``; ``origin.decoder_flags`` (the decoder
    options the lists were made with) is recorded there, and ``origin.start_ini`` starts the
    optimiser.

    ``output`` is checked before anything runs: a regular file, never one of the inputs (nor is
    ``output.json``), an existing one (or an ``output.json`` kept without it) replaced only with
    ``overwrite``. Moses' programs are those of ``options.mertdir``, else of ``moses`` (an
    installation, or the folder of one; None: ``MOSES_HOME``)."""
    dev_nbest, dev_reference = dev
    check_rerank_inputs(dev_nbest, test_nbest, options, origin.decoder_flags)  # before anything is made
    inputs = [("the dev n-best list", dev_nbest), ("the dev references", dev_reference),
              ("the test n-best list", test_nbest), ("the moses.ini", origin.start_ini)]
    with OutputJob(output, inputs, overwrite=overwrite, companions=RERANK_COMPANIONS,
                   kind=OutputKind("the reranked output", regular_only=True)) as job:
        installation = MosesInstallation.given(moses) if moses or not options.mertdir else None
        return _rerank(job, dev, test_nbest, moses=installation, options=options, origin=origin,
                       working_dir=working_dir)


def check_rerank_inputs(dev_nbest: PathLike, test_nbest: PathLike, options: RerankOptions,
                        decoder_flags: Optional[str]) -> None:
    """What ``rerank`` refuses before it makes anything: lists given as '-' (they are read twice),
    decoder flags Moses may not be given (:mod:`~phrase_scorer.moses.decoder_flags`), a seed given
    twice (its runs would share one folder and repeat each other), and a feature to leave out that
    the dev list does not have (a misspelt name would leave every feature in)."""
    for path, what in ((dev_nbest, "the dev n-best list"), (test_nbest, "the test n-best list")):
        refuse_single_pass(path, what, "rerank reads its n-best lists twice")
    check_decoder_flags(decoder_flags)
    repeated = sorted({seed for seed in options.seeds if options.seeds.count(seed) > 1})
    if repeated:
        raise PhraseScorerError(Text(setting("seeds", repeated[0]), " is given twice: each seed runs the "
                                     "optimiser once"), hint="give each seed once")
    if options.ignore_features:
        first = next(iter(read_nbest(dev_nbest)), None)
        have = [name for name, _ in dense_layout(first)] if first is not None else None
        for name in options.ignore_features:
            if first is not None and have is not None and name not in have:
                raise PhraseScorerError(Text(setting("ignore_features", name), ": the dev list has no dense "
                                             f"feature {name}"), path=dev_nbest, line=first.line_number,
                                        hint=f"its dense features are {', '.join(have)}")


def decoding_system(dev_nbest: PathLike, start_ini: Optional[PathLike], dev_models: Dict[str, dict]) -> Optional[dict]:
    """The system the reranker records (:func:`~phrase_scorer.moses.system.system_record`): the
    moses.ini given, when the dev list's totals show it was decoded with that ini's weights; else
    None, with a warning when an ini was given (its weights only start the optimiser)."""
    if start_ini is None:
        return None
    record = system_record(start_ini)
    if decoded_with(dev_nbest, record["weights"], list(dev_models)):
        return record
    log.warning("%s was not decoded with the weights of %s (or cannot be told so): the reranker records no system, "
                "and a reranked translation cannot tell another system from the one the lists came from",
                os.fspath(dev_nbest), os.fspath(start_ini))
    return None


def _rerank(job: OutputJob, dev: Tuple[PathLike, PathLike], test_nbest: PathLike, *,
            moses: Optional[MosesInstallation], options: RerankOptions, origin: NBestOrigin,
            working_dir: Optional[PathLike]) -> RerankResult:
    output = job.output  # a regular file: the job refuses '-', a device and a pipe
    dev_nbest, dev_reference = dev
    start_ini, decoder_flags = origin.start_ini, origin.decoder_flags
    mert_programs(moses, options)  # before any work
    if decoder_flags is None:
        log.warning("%s not given: the reranker records no decoder options, so the reranked system will decode "
                    "its n-best lists with Moses' own (an n-best factor of %d); give the options the lists were "
                    "decoded with (a rescoring report prints them)", setting("decoder_flags"),
                    MOSES_NBEST_FACTOR)
    dev_models = rescored_models(dev_nbest)  # a stale signature is refused before the optimisers run
    system = decoding_system(dev_nbest, start_ini, dev_models)
    work = fresh_directory(Path(working_dir or output + ".work").resolve(), verb="rerank")
    learned = learn_weights(dev_nbest, dev_reference, work, moses=moses, options=options, start_ini=start_ini)
    assert learned.data is not None
    tuned, dropped = tuned_reranker(learned.weights, dev_nbest, ignore_features=tuple(options.ignore_features),
                                    decoder_flags=decoder_flags, system=system, models=dev_models,
                                    nbest_size=learned.dev.largest_list if learned.dev else None,
                                    dropping=FeatureDropping(options.min_feature_gain, learned.data))
    weights = tuned.weights
    for name, bleu in dropped.items():
        log.info("feature %s buys at most %.2f dev BLEU (%.2f without it, %.2f with): weighted 0, its model "
                 "is not run", name, options.min_feature_gain, bleu, learned.best.dev_bleu)
    sentences = write_best_hypotheses(test_nbest, weights, lambda data: job.write_text(0, data),
                                      options.ignore_features)
    result = RerankResult(
        output=output, sentences=sentences, weights=weights.by_name(), start_weights=learned.start.by_name(),
        start_from=learned.start_from, start_dev_bleu=learned.start_dev_bleu, dev_bleu=learned.best.dev_bleu,
        best_seed=learned.best.seed, dropped=dropped, runs=learned.runs, working_dir=os.fspath(work),
    )
    run = {k: v for k, v in result.to_dict().items() if k != "output"}  # the signature names the output itself
    job.commit(tuned.signature("phrase-scorer rerank", output=output,
                               dev={"nbest": os.path.abspath(dev_nbest), "reference": os.path.abspath(dev_reference)},
                               test={"nbest": os.path.abspath(test_nbest)}, options=asdict(options),
                               bleu="Moses' BleuScorer on the dev list (x 100)", **run))
    log.info("test 1-best: %s (%d sentences); weights of seed %d, dev BLEU %.2f (start %.2f), in %s.json",
             output, sentences, result.best_seed, result.dev_bleu, result.start_dev_bleu, output)
    return result

