"""What n-best rescoring buys on the user's own Moses system, in one resumable command: ``rescore-experiment``.

::

    tuned moses.ini --moses, N distinct--> dev and test n-best lists       nbest/<set>.nbest
        --rescore, every model at once--> rescored lists                   rescored/<set>.nbest.gz
        --rerank, per row and optimiser seed--> the 1-best of every set    rows/<row>/seed<k>/<set>.hyp
        --sacrebleu--> BLEU, chrF, paired bootstrap against Moses' 1-best  report.md, results.json

Rows. *Moses* is the decoder's own 1-best (the first hypothesis of each sentence of its n-best
list), untouched. A decoder system given beside it (``--system LABEL=INI[,INI...]``: for example
Moses with the phrase-table columns, as ``experiment`` tunes it) is decoded with each of its tuned
moses.ini files, one run each, and scored and tested against Moses' 1-best like every row.
*Moses, re-tuned on the lists* reranks the lists with the decoder's features only, tuned on the
dev list like every other row: what re-tuning on a fixed list does by itself.
Every other row adds the rescoring features it names (``--row LABEL=FEATURE,...``) to the
decoder's; the features of the other models are left out (neither tuned nor used). Each tuned row
runs ``runs`` times, with optimiser seeds 1..runs, starting from the tuned moses.ini's weights
(new features from 0).

What limits the gain is measured beside it: the number of distinct hypotheses per sentence, and
the oracle BLEU of the lists cut to their first 1, 10, 100, ... hypotheses (per sentence, the
hypothesis with the best smoothed sentence BLEU; then the corpus BLEU of those, scored as every
other figure).

Every step records what made it (``<file>.inputs.json`` / ``inputs.json``: files by path, size
and SHA-256, so a copy with a new modification time is the same input) and is redone, with a
log line naming what changed, when that differs; an interrupted experiment resumes at the step it
was in (rescoring resumes inside the list). The steps it shares with ``build-reranker`` (the sets,
the rows, decoding, rescoring, tuning a row, writing its reranker):
:mod:`~phrase_scorer.experiments.system_steps`.
"""


from __future__ import annotations

import logging
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from phrase_scorer.config import RescoreExperimentOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_identity, file_sha256
from phrase_scorer.io.outputs import Input
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import group_by_sentence, read_nbest
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.moses.system import system_record
from phrase_scorer.moses.evaluate import Decoding, decode
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation, read_lines
from phrase_scorer.experiments.report import (
    NONE, ExperimentOutputs, closing_lines, finish_report, mean_sd, p_values, report_job, table, two_decimals,
    write_report,
)
from phrase_scorer.experiments.statistics import ngram_stats, paired_bootstrap_p, smoothed_sentence_bleu
from phrase_scorer.experiments.system_steps import (
    RETUNED_ROW, EvalSet, Row, RowRun, RowTuning, decoded_nbest, first_hypotheses, folder_name, nbest_flags,
    rescored_nbest,
    scores_of, tuned_row_run, write_rerankers,
)
from phrase_scorer.records import Step

log = logging.getLogger(__name__)

MOSES_ROW = "Moses"
ORACLE_SIZES = (1, 10, 100, 1000)  # and the whole list


@dataclass(frozen=True)
class DecodedSystem:
    """Another decoder system in the report, decoded with the tuned moses.ini of each of its runs."""

    label: str
    inis: Tuple[str, ...]

    @property
    def folder(self) -> str:
        return folder_name(self.label)


@dataclass(frozen=True)
class Comparison:
    """What the report compares with Moses' 1-best: the models whose features rescore the lists
    (:class:`~phrase_scorer.rescoring.rescore.FeatureModel`), the rows tuned on them (each the
    decoder's features plus some of theirs; none: :func:`default_rows`), and other decoder systems
    reported beside Moses."""

    models: Sequence
    rows: Sequence[Row] = ()
    systems: Sequence[DecodedSystem] = ()


def default_rows(features: Sequence[str]) -> List[Row]:
    """One row per rescoring feature, and one with all of them."""
    rows = [Row(f"+ {name}", (name,)) for name in features]
    if len(features) > 1:
        rows.append(Row("+ all", tuple(features)))
    return rows


@dataclass
class RescoreExperimentReport:
    runs: List[RowRun]
    significance: Dict[str, Dict[str, List[float]]]  # set -> row -> p per seed
    oracle: Dict[str, Dict[str, float]]  # set -> {"hypotheses per sentence", "1", "10", ..., "all"}
    signatures: Dict[str, str]
    rerankers: Dict[str, str] = field(default_factory=dict)  # row label -> its reranker file (write_rerankers)
    markdown: str = ""


def decoded_system_run(system: DecodedSystem, run: int, sets: Sequence[EvalSet], work: Path, moses: MosesInstallation,
                       options: RescoreExperimentOptions) -> RowRun:
    """Run ``run`` (1-based) of a decoder system: every set decoded with its ``run``-th tuned
    moses.ini (the same decoder and flags as the n-best lists), the words as Moses prints them."""
    ini = Path(system.inis[run - 1]).resolve()
    ini_sha256 = file_sha256(ini)
    folder = work / "rows" / system.folder / f"run{run}"
    folder.mkdir(parents=True, exist_ok=True)
    result = RowRun(row=system.label, seed=run, scores={}, hypotheses={})
    for s in sets:
        hyp = folder / f"{s.name}.hyp"
        step = Step(folder / f"{s.name}.inputs.json",
                    {"moses.ini sha256": ini_sha256, "source": file_identity(s.source),
                     "decoder": options.decoder, "decoder flags": options.decoder_flags},
                    [hyp])
        if step.done:
            log.info("%s, run %d, %s: already decoded", system.label, run, s.name)
        else:
            with step:
                decoded = decode(ini, s.source, folder / f"{s.name}.1best", moses=moses,
                                 decoding=Decoding(options.threads, options.decoder_flags, options.decoder),
                                 overwrite=True)
                write_text_atomically(hyp, "".join(line.strip(" ") + "\n" for line in decoded))
        result.add(s, hyp, options)
    log.info("%s, run %d: %s", system.label, run,
             ", ".join(f"{name} BLEU {v['bleu']:.2f}" for name, v in result.scores.items()))
    return result


# --- what limits the gain ---------------------------------------------------------------------------


def oracle_figures(nbest: PathLike, references: Sequence[str], options: RescoreExperimentOptions) -> Dict[str, float]:
    """Distinct hypotheses per sentence, and the oracle BLEU of the list cut to its first k
    hypotheses, k in ORACLE_SIZES below the list's size, and of the whole list."""
    sizes = oracle_sizes(options)
    picks: Dict[int, List[str]] = {k: [""] * len(references) for k in sizes}
    hypotheses = 0
    sentences = 0
    for sentence_id, entries in group_by_sentence(read_nbest(nbest)):
        reference = references[sentence_id].split()
        counts = [Counter(tuple(reference[i:i + n]) for i in range(len(reference) - n + 1)) for n in range(1, 5)]
        values = [smoothed_sentence_bleu(ngram_stats(e.text.split(), counts, len(reference))) for e in entries]
        for k in sizes:
            best = max(range(min(k, len(entries))), key=values.__getitem__)  # the first of equals
            picks[k][sentence_id] = entries[best].hypothesis.strip(" ")
        hypotheses += len(entries)
        sentences += 1
    figures: Dict[str, float] = {"hypotheses per sentence": hypotheses / max(sentences, 1)}
    for k in sizes:
        figures[str(k)] = scores_of(picks[k], references, options).bleu
    return figures


def oracle_sizes(options: RescoreExperimentOptions) -> List[int]:
    return [k for k in ORACLE_SIZES if k < options.nbest_size] + [options.nbest_size]


def significance(runs: Sequence[RowRun], sets: Sequence[EvalSet],
                 options: RescoreExperimentOptions) -> Dict[str, Dict[str, List[float]]]:
    """Paired bootstrap p of every tuned run against the decoder's 1-best, per test set."""
    out: Dict[str, Dict[str, List[float]]] = {}
    baseline = next(r for r in runs if r.seed is None)
    for eval_set in sets[1:]:
        references = read_lines(eval_set.reference)
        base = read_lines(baseline.hypotheses[eval_set.name])
        for run in runs:
            if run.seed is None:
                continue
            p = paired_bootstrap_p(base, read_lines(run.hypotheses[eval_set.name]), references,
                                   kind=options.references, lang=options.lang, samples=options.bootstrap_samples)
            out.setdefault(eval_set.name, {}).setdefault(run.row, []).append(p)
    return out


# --- the whole experiment ------------------------------------------------------------------------


def run_rescore_experiment(moses_ini: PathLike, sets: Sequence[EvalSet], outputs: ExperimentOutputs, *,
                           comparison: Comparison, moses: MosesGiven = None,
                           options: RescoreExperimentOptions = RescoreExperimentOptions(),
                           scoring_options: ScoringOptions = ScoringOptions()) -> RescoreExperimentReport:
    """Run (or resume) the experiment in ``outputs.work_dir``. ``sets[0]`` is the dev set (the
    optimiser tunes on it); ``comparison`` says what the report compares. The Markdown report is
    also written to ``outputs.report`` when given, which is checked before anything runs (never
    one of the inputs, an existing one replaced only with ``outputs.overwrite``); Moses is
    ``moses``, an installation or the folder of one (None: ``MOSES_HOME``)."""
    check_decoder_flags(options.decoder_flags)  # before anything is made
    inputs: List[Input] = [("the moses.ini", moses_ini)]
    for i, s in enumerate(sets):
        inputs += ([("the dev source", s.source), ("the dev reference", s.reference), ("the dev n-best list", s.nbest)]
                   if i == 0 else [("a test file", s.source), ("a test file", s.reference),
                                   ("a test n-best list", s.nbest)])
    with report_job(outputs, inputs) as job:
        result = _run_rescore_experiment(moses_ini, sets, outputs.work_dir, moses=moses, comparison=comparison,
                                         options=options, scoring_options=scoring_options)
        finish_report(job, result.markdown)
    return result


def preflight(ini: Path, sets: Sequence[EvalSet], models: Sequence, systems: Sequence[DecodedSystem],
              options: RescoreExperimentOptions, moses: MosesInstallation, work: Path) -> None:
    """Everything the experiment will use, checked before its first step, as every run checks it
    again before it continues (:mod:`~phrase_scorer.experiments.preflight`): the options, the
    moses.ini and each other system's, with the files they name; each set's source and reference;
    each model against the dev set (a forward model reads its source and predicts its reference,
    a reverse model the other way round: :func:`~phrase_scorer.model_dir.check_model_reads`);
    the disk the n-best lists need in ``work``; Moses. Logs one line."""
    from phrase_scorer.config import check_whole_number
    from phrase_scorer.experiments.preflight import (
        check_disk_holds, check_ini, check_moses, check_text_pair, log_checked,
    )
    from phrase_scorer.model_dir import check_model_reads

    for name in ("nbest_size", "nbest_factor", "runs", "bootstrap_samples"):
        check_whole_number(name, getattr(options, name), 1, 1 << 31)
    check_whole_number("restarts", options.restarts, 0, 1 << 31)
    inis: List[PathLike] = [ini, *(system_ini for system in systems for system_ini in system.inis)]
    for path in inis:
        check_ini(path)
    sentences = [check_text_pair((s.source, s.reference), f"the {'dev' if i == 0 else 'test'} set {s.name}")
                 for i, s in enumerate(sets)]
    dev = sets[0]
    for model in models:
        check_model_reads(model.loaded.directory, model.name, reverse=model.reverse,
                          texts=(dev.source, dev.reference), loaded=model.loaded)
    disk = check_disk_holds(work, options.nbest_size, sum(sentences))
    check_moses(moses, options.decoder, options.mertdir)
    log_checked(["the options", f"{len(systems) + 1} moses.ini", f"{len(sets)} sets ({sum(sentences):,} sentences)",
                 f"{len(models)} model{'s' if len(models) != 1 else ''} against the dev set", "Moses", disk])


def _run_rescore_experiment(moses_ini: PathLike, sets: Sequence[EvalSet], work_dir: PathLike, *,
                            moses: MosesGiven, comparison: Comparison, options: RescoreExperimentOptions,
                            scoring_options: ScoringOptions) -> RescoreExperimentReport:
    moses = MosesInstallation.given(moses)
    models, systems = comparison.models, comparison.systems
    if len(sets) < 2:
        raise PhraseScorerError("the experiment needs a dev set and at least one test set")
    names = [s.name for s in sets]
    if len(set(names)) != len(names):
        raise PhraseScorerError(f"two sets share the name {max(names, key=names.count)!r}",
                                hint="give sets whose file names differ before their first '.'")
    features = list(dict.fromkeys(m.name for m in models))  # an ensemble's models share one feature
    rows = list(comparison.rows) or default_rows(features)
    for row in rows:
        unknown = [f for f in row.features if f not in features]
        if unknown:
            raise PhraseScorerError(f"row {row.label!r} names {', '.join(unknown)}, which no model gives",
                                    hint=f"the models' features are {', '.join(features)}")
    labels = [MOSES_ROW, RETUNED_ROW, *(r.label for r in rows), *(d.label for d in systems)]
    if len(set(labels)) != len(labels):
        raise PhraseScorerError(f"two rows of the report are called {max(labels, key=labels.count)!r}")
    ini = Path(moses_ini).resolve()
    work = Path(work_dir).resolve()
    preflight(ini, sets, models, systems, options, moses, work)
    work.mkdir(parents=True, exist_ok=True)

    lists = {s.name: decoded_nbest(ini, s, work, moses, options) for s in sets}
    rescored = {s.name: rescored_nbest(lists[s.name], s, work, models, options, scoring_options) for s in sets}

    moses_dir = work / "rows" / "moses"
    moses_dir.mkdir(parents=True, exist_ok=True)
    baseline = RowRun(row=MOSES_ROW, seed=None, scores={}, hypotheses={})
    signatures: Dict[str, str] = {}
    oracle: Dict[str, Dict[str, float]] = {}
    for s in sets:
        hyp = moses_dir / f"{s.name}.hyp"
        write_text_atomically(hyp, "".join(line + "\n" for line in first_hypotheses(lists[s.name])))
        evaluation = baseline.add(s, hyp, options)
        signatures = {"BLEU": evaluation.bleu_signature, "chrF": evaluation.chrf_signature}
        oracle[s.name] = oracle_figures(lists[s.name], read_lines(s.reference), options)

    runs = [baseline]
    for system in systems:
        for run in range(1, len(system.inis) + 1):
            runs.append(decoded_system_run(system, run, sets, work, moses, options))
    tuning = RowTuning(rescored, sets, features, ini, work, moses, options)
    for row in [Row(RETUNED_ROW, ()), *rows]:
        for seed in range(1, options.runs + 1):
            runs.append(tuned_row_run(row, seed, tuning))

    flags = None if sets[0].nbest else nbest_flags(options)  # a list given by the user: its flags are unknown
    decoded_by = None if sets[0].nbest else system_record(ini)  # the system that decoded the dev list
    rerankers = write_rerankers(runs, rows, rescored[sets[0].name], work, flags, system=decoded_by)
    report = RescoreExperimentReport(runs, significance(runs, sets, options), oracle, signatures, rerankers)
    report.markdown = markdown(report, ini, sets, models, rows, systems, options)
    write_report(work, report.markdown, {"runs": [asdict(r) for r in runs], "significance": report.significance,
                                         "oracle": oracle, "signatures": signatures, "rerankers": rerankers})
    return report


def markdown(report: RescoreExperimentReport, ini: Path, sets: Sequence[EvalSet], models: Sequence,
             rows: Sequence[Row], systems: Sequence[DecodedSystem], options: RescoreExperimentOptions) -> str:
    dev = sets[0].name
    by_row: Dict[str, List[RowRun]] = {}
    for run in report.runs:
        by_row.setdefault(run.row, []).append(run)
    moses_scores = by_row[MOSES_ROW][0].scores
    added = {RETUNED_ROW: "–", MOSES_ROW: "–", **{r.label: ", ".join(r.features) for r in rows},
             **{d.label: "its own tuned moses.ini" for d in systems}}
    parts = []
    for eval_set in sets[1:]:
        name = eval_set.name
        cells = []
        for label, runs in by_row.items():
            bleu = [r.scores[name]["bleu"] for r in runs]
            delta = statistics.mean(bleu) - moses_scores[name]["bleu"]
            cells.append((label, added.get(label, ""), mean_sd([r.scores[dev]["bleu"] for r in runs]), mean_sd(bleu),
                          NONE if label == MOSES_ROW else f"{delta:+.2f}",
                          mean_sd([r.scores[name]["chrf"] for r in runs]),
                          p_values(report.significance.get(name, {}).get(label))))
        parts.append(f"**{name}** (dev: {dev})\n\n" + table(
            ["System", "features added", f"BLEU {dev}", f"BLEU {name}", "Δ BLEU", f"chrF {name}",
             "p vs Moses (per seed)"],
            cells))
    per_run = table(["System", "seed", *(f"BLEU {s.name}" for s in sets), "tuned dev BLEU (Moses' scorer)"],
                    [(run.row, NONE if run.seed is None else run.seed,
                      *(two_decimals(run.scores[s.name]["bleu"]) for s in sets), two_decimals(run.tuned_dev_bleu))
                     for run in report.runs])
    weight_rows = []
    for row in rows:
        runs = by_row.get(row.label, [])
        shares = []
        for feature in row.features:
            values = [r.weights[feature][0] / sum(abs(w) for ws in r.weights.values() for w in ws) for r in runs]
            shares.append(f"{feature} {mean_sd(values)}")
        weight_rows.append((row.label, "; ".join(shares)))
    sizes = oracle_sizes(options)
    oracle_rows = table(["set", "hypotheses per sentence", "Moses 1-best", *(f"oracle of {k}" for k in sizes)],
                        [(s.name, f"{report.oracle[s.name]['hypotheses per sentence']:.1f}",
                          two_decimals(moses_scores[s.name]["bleu"]),
                          *(two_decimals(report.oracle[s.name][str(k)]) for k in sizes)) for s in sets])
    model_lines = [f"- {m.name}: `{m.loaded.directory}` ({m.loaded.config.arch}, "
                   f"{'target→source' if m.reverse else 'source→target'}, "
                   f"weights sha256 `{m.loaded.weights_sha256[:16]}…`)"
                   for m in models]
    return (
        "\n\n".join(parts) + "\n\n"
        f"Mean ± standard deviation over {options.runs} optimiser runs per tuned row (seeds 1–{options.runs}); "
        f"*Moses* is the decoder's 1-best, one run"
        + (f"; {', '.join(f'*{d.label}*' for d in systems)}: the 1-best of that system, decoded with the tuned "
           "moses.ini of each of its tuning runs (one run each)" if systems else "")
        + f". BLEU {dev} is of the reranked dev set the weights were tuned on. "
        f"p: paired bootstrap resampling (sacrebleu, {options.bootstrap_samples} samples) of each run against "
        "Moses' 1-best (1 where a run's output is Moses' own).\n\n"
        "Per run:\n\n" + per_run + "\n\n"
        "Weights of the added features (each divided by the sum of the absolute values of all weights; "
        "mean ± sd over runs):\n\n" + table(["System", "weights"], weight_rows) + "\n\n"
        "The lists: distinct hypotheses per sentence, and BLEU of the oracle (per sentence the hypothesis with the "
        "best smoothed sentence BLEU) among the first k hypotheses:\n\n" + oracle_rows + "\n\n"
        "Settings:\n\n"
        f"- Moses config: `{ini}`; "
        + "".join(f"{d.label}: `" + "`, `".join(d.inis) + "`; " for d in systems)
        + ("; ".join(f"{s.name}: the n-best list `{s.nbest}`" for s in sets if s.nbest) + "; "
           if any(s.nbest for s in sets) else "")
        + (f"n-best lists decoded with {options.nbest_size} distinct hypotheses, decoder flags "
           f"`{nbest_flags(options)}`"
           if not all(s.nbest for s in sets) else f"oracle up to {options.nbest_size} hypotheses") + "\n"
        + "".join(f"- reranker of {label} (its run with the best dev BLEU), for the whole system "
                  f"(`phrase-scorer translate` with `{ini.name}`): `{path}`"
                  + ("" if not sets[0].nbest else " (the dev list was given: it records no decoder flags)") + "\n"
                  for label, path in report.rerankers.items())
        + "\n".join(model_lines) + "\n"
        f"- rescoring: {'log p per predicted token' if options.normalize else 'log p (natural log)'}; reranking: "
        f"{options.method}, {options.restarts} random restarts per run, starting from the moses.ini's weights\n"
        + closing_lines(report.signatures)
    )
