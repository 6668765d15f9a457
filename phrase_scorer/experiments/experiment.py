"""The paper's Table 1 on the user's own Moses system.

Three systems share everything but their phrase table:

    Baseline   the table as it is                          (num-features=4)
    RNN        + log p(y|x) from the model                 (num-features=5)
    RNN + WP   + log p(y|x) and the unknown-word count     (num-features=6)

Each is tuned ``runs`` times with different optimiser seeds (MERT is noisy: one run proves
little), each tuned config decodes the test set, and the report gives the mean and standard
deviation of dev and test BLEU per system, test chrF, and paired bootstrap tests (sacrebleu)
of each run against the baseline run with the same seed. Every finished tuning run is recorded
in its own folder, so an interrupted experiment resumes without redoing it.

Nothing stale is reused. Each artefact records what made it, and is made again when that changed
(with a log line naming what changed):

* ``phrase-table.rnn+wp.gz``: its annotate signature (``.json``) names the model's weights
  (sha256), the input table (its bytes: size, then SHA-256) and the annotate options; it is
  annotated again when the model given now, the system's phrase table or the options differ.
* ``phrase-table.rnn.gz``: ``.json`` beside it names the two-column table it was cut from (its
  bytes: size, then SHA-256); it is cut again when that table changed.
* ``<system>/run-<seed>/``: ``inputs.json`` records the system's config (sha256 of
  ``system.ini``), its phrase table and the dev and test files (path, size, sha256: a table
  annotated or cut again into the same bytes keeps its runs) and the tuning and scoring options;
  a run whose record differs (or has none) is deleted and redone.

Layout of the working directory::

    tables/phrase-table.rnn+wp.gz     the annotated table (both columns)
    tables/phrase-table.rnn.gz        the same without the unknown-word column
    <system>/system.ini               the system's untuned config (absolute paths)
    <system>/run-<seed>/              mert-moses.pl's work, tuned.ini, test.hyp, result.json
    results.json, report.md
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from phrase_scorer.config import (
    COLUMNS, SYSTEMS, ExperimentOptions, MosesIniOptions, RunOptions, System, TuneOptions, start_weights,
)
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import AtomicOutput, write_text_atomically
from phrase_scorer.io.file_identity import file_identity, file_sha256
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.moses.ini_patch import patch_moses_ini
from phrase_scorer.io.nbest import group_by_sentence, read_nbest
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.moses.evaluate import Decoding, decode, score
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation, read_lines
from phrase_scorer.moses.tune import tune, with_absolute_paths
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.experiments.report import (
    ExperimentOutputs, closing_lines, finish_report, mean_sd, p_values, report_job, table, two_decimals, write_report,
)
from phrase_scorer.experiments.statistics import paired_bootstrap_p
from phrase_scorer.records import Signature, Step, as_recorded, changed, read_record

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    system: str
    seed: int
    dev_bleu: Optional[float]
    test_bleu: float
    test_chrf: float
    iterations: int
    tuned_ini: str
    hypotheses: str
    bleu_signature: str
    chrf_signature: str


@dataclass
class ExperimentReport:
    runs: List[RunResult] = field(default_factory=list)
    significance: Dict[str, List[float]] = field(default_factory=dict)  # system -> p per seed
    markdown: str = ""


def drop_last_columns(table: PathLike, output: PathLike, count: int) -> int:
    """Copy an annotated table without its last ``count`` scores (gzip output, atomic)."""
    from phrase_scorer.io.compression import gzip_member

    reader = PhraseTableReader(table)
    lines = 0
    with AtomicOutput(output) as out, progress_bar("dropping columns", reader) as bar:
        chunk: List[bytes] = []
        for line in reader:
            chunk.append(line.without_last_scores(count))
            bar.advance()
            if len(chunk) == 20000:
                out.write(gzip_member(b"".join(chunk)))
                lines += len(chunk)
                chunk = []
        if chunk:
            out.write(gzip_member(b"".join(chunk)))
            lines += len(chunk)
        out.commit()
    return lines


def stale_annotation(table: Path, original: str, model_dir: PathLike) -> List[str]:
    """Why the annotated ``table`` does not come from ``original`` and this model (empty: it does)."""
    from phrase_scorer.config import AnnotateOptions

    try:
        signature = Signature.read(table) if table.exists() else None
        model = signature.model() if signature is not None else None
    except PhraseScorerError:  # a damaged signature: annotated again
        signature = None
    if signature is None or model is None:
        return ["no finished annotated table"]
    weights = Path(model_dir) / "model.pt"
    current = {"model weights": file_sha256(weights) if weights.exists() else None,
               "input table": file_identity(original), "annotate options": as_recorded(asdict(AnnotateOptions()))}
    recorded = {"model weights": model.weights_sha256, "input table": signature.get("input"),
                "annotate options": signature.get("options")}
    return changed(recorded, current)


def prepare_tables(moses_ini: PathLike, work: Path, *, model_dir: Optional[PathLike],
                   annotated: Optional[PathLike]) -> Dict[str, str]:
    """The phrase table of each system: the original, and the annotated table with 1 or 2 columns.

    Tables made by an earlier run are reused only when they come from the same inputs (see the
    module's docstring); otherwise they are made again."""
    ini = MosesIni.read(moses_ini)
    original = ini.table_path(ini.find_phrase_table())
    tables = work / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    both = tables / "phrase-table.rnn+wp.gz"
    if annotated is not None:
        both = Path(annotated).resolve()
    else:
        if model_dir is None:
            raise PhraseScorerError(Text("give a model (", setting("model_dir", "DIR"), ") or an annotated table (",
                                         setting("annotated", "TABLE"), ")"))
        stale = stale_annotation(both, original, model_dir)
        if stale:
            from phrase_scorer.scoring.annotate import annotate
            from phrase_scorer.model_dir import load_model

            if both.exists():
                log.info("%s is out of date (%s changed): annotating again", both, ", ".join(stale))
            log.info("annotating %s with the model in %s", original, model_dir)
            # an interrupted annotation resumes; annotate itself refuses a resume whose inputs changed
            resume = Path(str(both) + ".part.json").exists()
            try:
                annotate(original, both, load_model(model_dir), run=RunOptions(resume=resume, overwrite=True))
            except PhraseScorerError as exc:
                if not resume or "changed since the interrupted run" not in exc.message:
                    raise
                log.info("the interrupted annotation was made with other inputs: starting it again")
                annotate(original, both, load_model(model_dir), run=RunOptions(overwrite=True))
    prob_only = tables / "phrase-table.rnn.gz"
    step = Step(str(prob_only) + ".json", {"two-column table": file_identity(both)}, [prob_only])
    if not step.done:
        log.info("writing the table without the unknown-word column")
        with step:
            drop_last_columns(both, prob_only, 1)
    return {"baseline": original, "rnn": os.fspath(prob_only), "rnn+wp": os.fspath(both)}


def system_ini(moses_ini: PathLike, system: System, table: str, out: Path) -> Path:
    path = out / "system.ini"
    if system.added_columns == 0:
        with_absolute_paths(moses_ini, path)
    else:
        patch = MosesIniOptions(add_features=system.added_columns,
                                initial_weights=start_weights(COLUMNS[: system.added_columns]), absolute_paths=True,
                                check_table=True)
        patch_moses_ini(moses_ini, path, phrase_table=table, options=patch, overwrite=True)
    return path


def run_experiment(moses_ini: PathLike, dev: Sequence[PathLike], test: Sequence[PathLike],
                   outputs: ExperimentOutputs, *, moses: MosesGiven = None, model_dir: Optional[PathLike] = None,
                   annotated: Optional[PathLike] = None,
                   options: ExperimentOptions = ExperimentOptions()) -> ExperimentReport:
    """Run (or resume) the comparison in ``outputs.work_dir``; returns the results and a Markdown
    report, also written to ``outputs.report`` when given. The report is checked before anything
    runs (never one of the inputs, an existing one replaced only with ``outputs.overwrite``);
    Moses is ``moses``, an installation or the folder of one (None: ``MOSES_HOME``)."""
    check_decoder_flags(options.tune.decoder_flags)  # before anything is made
    inputs = [("the moses.ini", moses_ini), ("the annotated table", annotated), ("the dev source", dev[0]),
              ("the dev reference", dev[1]), ("the test source", test[0]), ("the test reference", test[1])]
    with report_job(outputs, inputs) as job:
        result = _run_experiment(moses_ini, dev, test, outputs.work_dir, moses=MosesInstallation.given(moses),
                                 model_dir=model_dir, annotated=annotated, options=options)
        finish_report(job, result.markdown)
    return result


def preflight(moses_ini: PathLike, dev: Sequence[PathLike], test: Sequence[PathLike], moses: MosesInstallation,
              model_dir: Optional[PathLike], options: ExperimentOptions) -> None:
    """Everything the comparison will use, checked before its first step, as every run checks it
    again before it continues (:mod:`~phrase_scorer.experiments.preflight`): the options, the
    moses.ini (with its phrase table) and the files it names, the dev and test sets, the model
    against the dev set (it reads the system's source and predicts its target:
    :func:`~phrase_scorer.model_dir.check_model_reads`), Moses and its tuning script. Logs one
    line."""
    from phrase_scorer.config import check_whole_number
    from phrase_scorer.experiments.preflight import check_ini, check_moses, check_text_pair, log_checked
    from phrase_scorer.model_dir import check_model_reads

    tune_options = options.tune
    for name, value, least in (("runs", options.runs, 1), ("bootstrap_samples", options.bootstrap_samples, 1),
                               ("max_iterations", tune_options.max_iterations, 1), ("nbest", tune_options.nbest, 1)):
        check_whole_number(name, value, least, 1 << 31)
    check_ini(moses_ini).find_phrase_table()
    sentences = [check_text_pair((pair[0], pair[1]), what) for pair, what in ((dev, "the dev set"),
                                                                              (test, "the test set"))]
    if model_dir is not None:
        check_model_reads(model_dir, "the phrase table's model", reverse=False, texts=(dev[0], dev[1]))
    check_moses(moses, tune_options.decoder, tune_options.mertdir)
    moses.script("training/mert-moses.pl")
    log_checked(["the options", "the moses.ini", f"the dev set ({sentences[0]:,} sentences)",
                 f"the test set ({sentences[1]:,} sentences)", *(["the model"] if model_dir is not None else []),
                 "Moses"])


def _run_experiment(moses_ini: PathLike, dev: Sequence[PathLike], test: Sequence[PathLike], work_dir: PathLike, *,
                    moses: MosesInstallation, model_dir: Optional[PathLike], annotated: Optional[PathLike],
                    options: ExperimentOptions) -> ExperimentReport:
    work = Path(work_dir).resolve()
    tune_options = options.tune
    preflight(moses_ini, dev, test, moses, model_dir, options)
    work.mkdir(parents=True, exist_ok=True)
    tables = prepare_tables(moses_ini, work, model_dir=model_dir, annotated=annotated)
    test_references = read_lines(test[1])
    report = ExperimentReport()
    from dataclasses import replace

    for system in options.systems:
        folder = work / system.folder
        folder.mkdir(exist_ok=True)
        ini = system_ini(moses_ini, system, tables[system.folder], folder)
        inputs_of_system = system_inputs(ini, tables[system.folder], dev, test, options)
        for seed in range(1, options.runs + 1):
            run_dir = folder / f"run-{seed}"
            inputs = run_inputs(inputs_of_system, replace(tune_options, seed=seed))
            step = run_step(run_dir, inputs)
            finished = result_of(step)
            if finished is not None:
                report.runs.append(finished)
                log.info("%s, seed %d: already done (test BLEU %.2f)", system.name, seed, finished.test_bleu)
                continue
            log.info("%s, seed %d: tuning", system.name, seed)
            with step:
                tuned = run_dir / "tuned.ini"
                result = tune(ini, dev[0], dev[1], tuned, moses=moses, options=replace(tune_options, seed=seed),
                              working_dir=run_dir / "tune", overwrite=True)
                # the test set is decoded as the tuning decoded the dev set: with the same decoder flags
                decoding = Decoding(tune_options.threads, tune_options.decoder_flags, tune_options.decoder)
                hypotheses = decode(tuned, test[0], run_dir / "test.hyp", moses=moses, decoding=decoding,
                                    overwrite=True)
                evaluation = score(hypotheses, test_references, kind=options.references, lang=options.lang,
                                   hypotheses_path=os.fspath(run_dir / "test.hyp"))
                run = RunResult(system=system.name, seed=seed, dev_bleu=result.dev_bleu, test_bleu=evaluation.bleu,
                                test_chrf=evaluation.chrf, iterations=len(result.iterations),
                                tuned_ini=os.fspath(tuned), hypotheses=os.fspath(run_dir / "test.hyp"),
                                bleu_signature=evaluation.bleu_signature, chrf_signature=evaluation.chrf_signature)
                write_text_atomically(step.outputs[0], json.dumps(asdict(run), indent=1) + "\n")
            report.runs.append(run)
            log.info("%s, seed %d: dev BLEU %s, test BLEU %.2f", system.name, seed,
                     "?" if run.dev_bleu is None else f"{run.dev_bleu:.2f}", run.test_bleu)

    report.significance = significance(report.runs, test_references, options)
    report.markdown = markdown(report, moses_ini, dev, test, tables, model_dir, options)
    write_report(work, report.markdown, {"runs": [asdict(r) for r in report.runs], "significance": report.significance})
    return report


RUN_INPUTS = "inputs.json"


def system_inputs(system_ini_path: PathLike, table: PathLike, dev: Sequence[PathLike], test: Sequence[PathLike],
                  options: ExperimentOptions) -> Dict[str, object]:
    """What every tuning run of a system depends on: its files, read (and hashed) once per system."""
    return as_recorded({
        "system ini sha256": file_sha256(system_ini_path),
        "phrase table": file_identity(table),  # a table annotated again into the same bytes keeps the runs
        "dev": [file_identity(p) for p in dev],
        "test": [file_identity(p) for p in test],
        "test decoded with": "the tuning's decoder flags",
        "scoring options": {"references": options.references, "lang": options.lang},
    })


def run_inputs(system: Dict[str, object], tune_options: TuneOptions) -> Dict[str, object]:
    """What a tuning run's results depend on, as recorded in ``run-<seed>/inputs.json``: its
    system's inputs (:func:`system_inputs`) and its tuning options."""
    return {**system, "tuning options": as_recorded(asdict(tune_options))}


def run_step(run_dir: Path, inputs: Dict[str, object]) -> Step:
    """A tuning run as an experiment step: done when ``run_dir`` holds its finished result made from
    ``inputs``; a run (finished or not) made from other inputs, or from inputs nobody recorded, is
    deleted so that it is redone from scratch; an interrupted run is kept for tuning again."""
    return Step(run_dir / RUN_INPUTS, inputs, [run_dir / "result.json"], folder=run_dir)


def result_of(step: Step) -> Optional[RunResult]:
    """The finished run of a :func:`run_step`, or None."""
    if not step.done:
        return None
    record = read_record(step.outputs[0])
    assert record is not None  # a done step's outputs are whole (the step checked them)
    return RunResult(**record)


def significance(runs: Sequence[RunResult], references: Sequence[str],
                 options: ExperimentOptions) -> Dict[str, List[float]]:
    """Paired bootstrap p-values of each system's run against the baseline run with the same seed."""
    baseline = {r.seed: r for r in runs if r.system == SYSTEMS[0].name}
    out: Dict[str, List[float]] = {}
    for run in runs:
        if run.system == SYSTEMS[0].name or run.seed not in baseline:
            continue
        out.setdefault(run.system, []).append(paired_bootstrap_p(
            read_lines(baseline[run.seed].hypotheses), read_lines(run.hypotheses), references,
            kind=options.references, lang=options.lang, samples=options.bootstrap_samples))
    return out


_BEST_ITERATION = re.compile(r"copying weights from best iteration \((\d+),")


def _run_number(path: Path) -> int:
    """The iteration of mert-moses.pl's ``runN.best*.out.gz``."""
    match = re.match(r"run(\d+)", path.name)
    assert match is not None  # mert-moses.pl numbers its runs
    return int(match.group(1))


def chosen_nbest(run_dir: Path) -> Optional[Path]:
    """The dev n-best list decoded with the weights the tuning run kept."""
    mert = run_dir / "tune" / "mert"
    log_text = ((run_dir / "tune" / "tune.log").read_text(errors="replace")
                if (run_dir / "tune" / "tune.log").exists() else "")
    match = _BEST_ITERATION.search(log_text)
    lists = sorted(mert.glob("run*.best*.out.gz"), key=_run_number)
    if match:
        lists = [p for p in lists if p.name.startswith(f"run{match.group(1)}.")] or lists
    return lists[-1] if lists else None


def new_column_usage(run: RunResult, added: int) -> Optional[Dict[str, float]]:
    """From the kept dev n-best list: per 1-best hypothesis, the mean of the model's columns as
    Moses summed them (log p over the phrases used; unknown words), and their tuned weights."""
    if added == 0:
        return None
    run_dir = Path(run.tuned_ini).parent
    nbest = chosen_nbest(run_dir)
    if nbest is None:
        return None
    sums = [0.0] * added
    sentences = 0
    for _, entries in group_by_sentence(read_nbest(nbest)):
        values = entries[0].feature("TranslationModel0")
        for k in range(added):
            sums[k] += values[4 + k]
        sentences += 1
    weights = MosesIni.read(run.tuned_ini).weight_line("TranslationModel0").weights
    usage = {"log_p": sums[0] / max(sentences, 1), "weight_log_p": weights[4]}
    if added > 1:
        usage.update({"unknown": sums[1] / max(sentences, 1), "weight_unknown": weights[5]})
    return usage


def markdown(report: ExperimentReport, moses_ini, dev, test, tables, model_dir, options: ExperimentOptions) -> str:
    tune_options = options.tune
    by_system: Dict[str, List[RunResult]] = {}
    for run in report.runs:
        by_system.setdefault(run.system, []).append(run)
    systems = table(["Models", "BLEU dev", "BLEU test", "chrF test", "p vs baseline (test, per seed)"],
                    [(name, mean_sd([r.dev_bleu for r in runs if r.dev_bleu is not None]),
                      mean_sd([r.test_bleu for r in runs]), mean_sd([r.test_chrf for r in runs]),
                      p_values(report.significance.get(name))) for name, runs in by_system.items()])
    per_run = table(["System", "seed", "iterations", "BLEU dev", "BLEU test", "chrF test"],
                    [(r.system, r.seed, r.iterations, two_decimals(r.dev_bleu), two_decimals(r.test_bleu),
                      two_decimals(r.test_chrf)) for r in report.runs])
    usage_rows = []
    for system in SYSTEMS[1:]:
        usages = [u for u in (new_column_usage(r, system.added_columns) for r in by_system.get(system.name, [])) if u]
        if not usages:
            continue
        cell = lambda key: mean_sd([u[key] for u in usages]) if key in usages[0] else "–"  # noqa: E731
        usage_rows.append((system.name, cell("weight_log_p"), cell("log_p"), cell("weight_unknown"), cell("unknown")))
    usage = ""
    if usage_rows:
        usage = (
            "What tuning made of the new columns (mean ± sd over runs): their tuned weights, and per dev 1-best "
            "hypothesis of the kept iteration's n-best list, the sum over its phrases of log p(y|x) and of unknown "
            "words, as Moses computed them:\n\n"
            + table(["System", "weight of log p(y\\|x)", "log p(y\\|x) per sentence", "weight of unknown words",
                     "unknown words per sentence"], usage_rows) + "\n\n"
        )
    signatures = {"BLEU": next((r.bleu_signature for r in report.runs), ""),
                  "chrF": next((r.chrf_signature for r in report.runs), "")}
    annotate_signature = Signature.read(tables["rnn+wp"])
    model_line = ""
    if annotate_signature is not None:
        model = annotate_signature.model()
        model_line = (f"- model: `{model.directory}`, weights sha256 `{model.weights_sha256[:16]}…`, "
                      f"network {json.dumps(model.config)}\n")
    return (
        systems + "\n\n"
        f"Mean ± standard deviation over {options.runs} tuning runs per system (optimiser seeds 1–{options.runs}). "
        "Dev BLEU is mert-moses.pl's own score of the chosen iteration; test BLEU and chrF are sacrebleu's. "
        "p: paired bootstrap resampling (sacrebleu, "
        f"{options.bootstrap_samples} samples) of each run against the baseline run with the same seed.\n\n"
        "Per run:\n\n" + per_run + "\n\n" + usage +
        "Settings:\n\n"
        f"- Moses config: `{moses_ini}`; dev: `{dev[0]}` / `{dev[1]}`; test: `{test[0]}` / `{test[1]}`\n"
        + model_line +
        f"- tuning: mert-moses.pl, {tune_options.method}, at most {tune_options.max_iterations} iterations, "
        f"{tune_options.nbest}-best, return-best-dev {tune_options.return_best_dev}, decoder flags "
        f"`-threads {tune_options.threads or os.cpu_count()} {tune_options.decoder_flags}`\n"
        + closing_lines(signatures)
    )
