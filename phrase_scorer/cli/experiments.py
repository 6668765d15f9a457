"""``experiment``, ``rescore-experiment`` and ``ems-config``: the whole system."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict

import click

from phrase_scorer.config import (
    ARCH_PRESETS,
    MAX_TIE_MARGIN, MAX_TRAINING_HOURS, SYSTEMS, AnnotateOptions, BuildRerankerOptions, ExperimentOptions,
    RescoreExperimentOptions, ScoringOptions,
)
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.cli.group import cli, explicit_options
from phrase_scorer.cli.options import (
    PARALLEL, Count, FiniteFloat, batch_tokens_option, column_options, device_option, make_training_settings,
    make_tune_options,
    NamedDirectory, PathName, RowType, SystemType, moses_home_option, precision_option, threads_option,
    decoder_flags_value, distinct_names, training_options, tune_options,
)
from phrase_scorer.runtime.threads import set_threads


@cli.command()
@click.argument("moses_ini", type=PathName(dir_okay=False, exists=True))
@click.option("-m", "--model", "model_dir", type=PathName(file_okay=False), default=None,
              help="Model to annotate the system's phrase table with.")
@click.option("--annotated", type=PathName(dir_okay=False, exists=True), default=None,
              help="Or: the system's phrase table already annotated (both columns).")
@click.option("--dev", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Dev source and reference.")
@click.option("--test", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Test source and reference.")
@click.option("-o", "--output", "work_dir", required=True, type=PathName(file_okay=False),
              help="Working directory (resumable: finished tuning runs are kept).")
@click.option("--runs", type=Count(min=1), default=ExperimentOptions.runs, help="Tuning runs per system.")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]), default=ExperimentOptions.references)
@click.option("--lang", default=ExperimentOptions.lang, help="Target language.")
@click.option("--report", type=PathName(dir_okay=False), default=None, help="Also write the Markdown report here.")
@click.option("--system", "systems", multiple=True, type=click.Choice([s.name for s in SYSTEMS]),
              help="Tune and report only this system (repeatable) [default: all three].")
@click.option("--overwrite", is_flag=True, help="Replace an existing --report file.")
@tune_options
@moses_home_option
def experiment(moses_ini, model_dir, annotated, dev, test, work_dir, runs, references, lang, report, systems, overwrite,
               moses_home, **options):
    """The paper's Table 1: baseline, + p(y|x), + p(y|x) + unknown words, each tuned --runs times."""
    from phrase_scorer.experiments.experiment import run_experiment
    from phrase_scorer.experiments.report import ExperimentOutputs

    if (model_dir is None) == (annotated is None):
        raise PhraseScorerError("give exactly one of --model and --annotated")
    settings = ExperimentOptions(runs=runs, references=references, lang=lang, tune=make_tune_options(options),
                                 systems=tuple(s for s in SYSTEMS if not systems or s.name in systems))
    result = run_experiment(moses_ini, dev, test, ExperimentOutputs(work_dir, report, overwrite), moses=moses_home,
                            model_dir=model_dir, annotated=annotated, options=settings)
    click.echo(result.markdown)


# The n-best lists' options that rescore-experiment and build-reranker (and ems-decoder) share
nbest_size_option = click.option("--nbest-size", type=Count(min=1),
                                 default=RescoreExperimentOptions.nbest_size, show_default=True,
                                 help="Distinct hypotheses per sentence.")
nbest_factor_option = click.option(
    "--nbest-factor", type=Count(min=1), default=RescoreExperimentOptions.nbest_factor, show_default=True,
    help="Moses' -n-best-factor: it extracts at most FACTOR x N paths to find the N distinct hypotheses "
         "(Moses' own default, 20, finds fewer: 74 of 100 on English-French, 0.36 BLEU less).")
target_lang_option = click.option("--lang", default=RescoreExperimentOptions.lang, help="Target language.")
decoder_threads_option = click.option("--decoder-threads", type=PARALLEL, default=None,
                                      help="Threads of the decoder and of mert [default: all cores].")


@cli.command("rescore-experiment")
@click.argument("moses_ini", type=PathName(dir_okay=False, exists=True))
@click.option("--dev", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Dev source and reference: the optimiser tunes on its n-best list.")
@click.option("--test", "tests", nargs=2, multiple=True, required=True, type=PathName(dir_okay=False, exists=True),
              help="A test source and reference (repeatable).")
@click.option("--dev-nbest", type=PathName(dir_okay=False, exists=True), default=None,
              help="The dev n-best list, already decoded with MOSES_INI [default: decode it].")
@click.option("--test-nbest", "test_nbests", multiple=True, type=PathName(dir_okay=False, exists=True),
              help="The n-best list of each --test, in their order, already decoded with MOSES_INI.")
@click.option("-m", "--model", "models", multiple=True, type=NamedDirectory(), metavar="NAME=DIR",
              help="A model scoring the hypothesis given the source, as feature NAME (repeatable; models given "
                   "the same NAME are an ensemble: one feature, the mean of their log p).")
@click.option("-r", "--reverse-model", "reverse_models", multiple=True, type=NamedDirectory(), metavar="NAME=DIR",
              help="A target-to-source model scoring the source given the hypothesis, as feature NAME (repeatable).")
@click.option("--row", "rows", multiple=True, type=RowType(), metavar="LABEL=NAME[,NAME...]",
              help="A system of the report: the decoder's features plus these (repeatable) "
                   "[default: one row per model and one with all].")
@click.option("--system", "systems", multiple=True, type=SystemType(), metavar="LABEL=MOSES_INI[,MOSES_INI...]",
              help="Another decoder system in the report (e.g. Moses with the phrase columns, as `experiment` "
                   "tunes it): the tuned moses.ini of each of its tuning runs, each decoded and scored as a run "
                   "(repeatable).")
@click.option("-o", "--output", "work_dir", required=True, type=PathName(file_okay=False),
              help="Working directory (the lists, the runs, report.md and results.json); resumable.")
@nbest_size_option
@nbest_factor_option
@click.option("--runs", type=Count(min=1), default=RescoreExperimentOptions.runs,
              help="Optimiser runs per row (seeds 1..RUNS).")
@click.option("--method", type=click.Choice(["mert", "mira"]), default=RescoreExperimentOptions.method,
              help="Moses' mert or kbmira (batch MIRA).")
@click.option("--restarts", type=Count(min=0), default=RescoreExperimentOptions.restarts,
              help="mert's random starting points per run.")
@click.option("--normalize/--no-normalize", default=RescoreExperimentOptions.normalize,
              help="Features are log p per predicted token (words + </s>) instead of log p.")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]),
              default=RescoreExperimentOptions.references)
@target_lang_option
@decoder_threads_option
@click.option("--decoder-flags", default=RescoreExperimentOptions.decoder_flags, callback=decoder_flags_value,
              help="More decoder options.")
@click.option("--decoder", default=RescoreExperimentOptions.decoder, help="Decoder program in MOSES_HOME/bin.")
@click.option("--report", type=PathName(dir_okay=False), default=None, help="Also write the Markdown report here.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --report file.")
@batch_tokens_option
@device_option
@precision_option
@threads_option
@moses_home_option
def rescore_experiment(moses_ini, dev, tests, dev_nbest, test_nbests, models, reverse_models, rows, systems, work_dir,
                       report, overwrite, batch_tokens, device, precision, threads, moses_home, decoder_threads,
                       **settings):
    """What rescoring MOSES_INI's n-best lists with sentence models buys: decode dev and test
    n-best lists, rescore them, re-tune and rerank each row --runs times, and report BLEU, chrF
    and paired bootstrap tests against Moses' 1-best."""
    set_threads(threads)
    from phrase_scorer.runtime.device import resolve_device
    from phrase_scorer.rescoring.rescore import ensembles_by_name, feature_models
    from phrase_scorer.experiments.report import ExperimentOutputs
    from phrase_scorer.experiments.rescore_experiment import Comparison, run_rescore_experiment
    from phrase_scorer.experiments.system_steps import EvalSet, set_name

    if test_nbests and len(test_nbests) != len(tests):
        raise PhraseScorerError(f"{len(test_nbests)} --test-nbest for {len(tests)} --test",
                                hint="give one --test-nbest per --test, in the same order, or none")
    sets = [EvalSet(set_name(dev[0]), dev[0], dev[1], dev_nbest)]
    sets += [EvalSet(set_name(src), src, ref, test_nbests[i] if test_nbests else None)
             for i, (src, ref) in enumerate(tests)]

    forward, reverse = models, reverse_models
    if not forward and not reverse:
        raise PhraseScorerError("no model given", hint="pass --model NAME=DIR (and/or --reverse-model NAME=DIR)")
    loaded = feature_models([d for _, d in forward], [d for _, d in reverse], [n for n, _ in forward],
                            [n for n, _ in reverse], resolve_device(device))
    loaded = ensembles_by_name(loaded)
    options = RescoreExperimentOptions(threads=decoder_threads, **settings)  # the other options are its fields
    result = run_rescore_experiment(moses_ini, sets, ExperimentOutputs(work_dir, report, overwrite),
                                    comparison=Comparison(loaded, list(rows), list(systems)), moses=moses_home,
                                    options=options,
                                    scoring_options=ScoringOptions(batch_tokens=batch_tokens, precision=precision))
    click.echo(result.markdown)


def archs_value(ctx, param, value: str) -> str:
    """``--archs``: known architectures, each once."""
    archs = [a.strip() for a in value.split(",") if a.strip()]
    unknown = [a for a in archs if a not in ARCH_PRESETS]
    if not archs or unknown:
        raise click.BadParameter(f"{unknown[0] if unknown else value!r} is not an architecture; "
                                 f"choose among {', '.join(ARCH_PRESETS)}")
    if len(set(archs)) != len(archs):
        raise click.BadParameter(f"{value!r} names an architecture twice")
    return value


def build_options(command):
    """The options of ``build-reranker`` that ``ems-decoder`` shares: the models, their training,
    the lists and the choice of the row (:func:`make_build_options` makes them one object)."""
    for option in reversed([
        click.option("--models", "model_kinds", default=",".join(BuildRerankerOptions.model_kinds), show_default=True,
                     help="The models to train, comma-separated: forward, right-to-left, reverse (forward is "
                          "needed)."),
        click.option("--members", type=Count(min=1), default=BuildRerankerOptions.members,
                     show_default=True,
                     help="Forward and right-to-left models of each kind, trained with seeds 1..N: the Ensemble "
                          "feature is the mean of all of them (2 x N models)."),
        click.option("--average-checkpoints", type=Count(min=0),
                     default=BuildRerankerOptions.average_checkpoints, show_default=True, metavar="K",
                     help="Each model's weights of its last K validations averaged when it stops, kept when the "
                          "mean validates better (0: the best single weights)."),
        click.option("-m", "--model", "given", multiple=True, type=NamedDirectory(), metavar="NAME=DIR",
                     callback=distinct_names,
                     help="A model trained before, used instead of training it (repeatable): forward=MODELS/en-fr; "
                          "further members are named forward-2, right-to-left-2 and so on."),
        click.option("--vocabulary", type=click.Choice(["words", "bpe", "unigram"]), default=None,
                     help="Words or subword pieces for every model [default: chosen from the tuning set's "
                          "shortlist coverage: pieces when a word shortlist leaves more than 5% of its tokens out]."),
        click.option("--archs", default=",".join(BuildRerankerOptions.archs), show_default=True, callback=archs_value,
                     help="The architectures of the forward and right-to-left models, comma-separated (rnnsearch, "
                          "transformer, encdec): each trains --members models of each kind, all in the Ensemble; "
                          "the first's are named forward, forward-2, ..., another's carry its name "
                          "(forward-rnnsearch, ...)"),
        click.option("--reverse-arch", type=click.Choice(list(ARCH_PRESETS)), default=BuildRerankerOptions.reverse_arch,
                     show_default=True, help="The reverse model's architecture."),
        click.option("--preset", default=BuildRerankerOptions.preset, show_default=True,
                     help="The models' preset (each architecture's of this name)."),
        click.option("--max-steps", type=Count(min=1), default=BuildRerankerOptions.max_steps,
                     show_default=True, help="Updates per model (80 sentence pairs each)."),
        click.option("--valid-every", type=Count(min=1), default=BuildRerankerOptions.valid_every,
                     show_default=True, help="Updates between validations on the tuning set (and checkpoints)."),
        click.option("--budget", "training_hours", type=FiniteFloat(min=0, max=MAX_TRAINING_HOURS, min_open=True),
                     default=None,
                     help="Hours of training: each model's own when they train side by side, else shared equally "
                          "among the models (each also stops at --max-steps)."),
        click.option("--side-by-side/--one-at-a-time", "side_by_side", default=None,
                     help="Train the models at the same time, each on its share of --threads, or one after "
                          "another [default: side by side on a CPU with 2 threads or more]."),
        nbest_size_option, nbest_factor_option,
        click.option("--runs", type=Count(min=1), default=RescoreExperimentOptions.runs, show_default=True,
                     help="Optimiser runs per candidate row (seeds 1..RUNS)."),
        click.option("--tie-margin", type=FiniteFloat(min=0, max=MAX_TIE_MARGIN),
                     default=BuildRerankerOptions.tie_margin,
                     show_default=True,
                     help="A row with fewer models is kept when its tuning BLEU is within this much of the best."),
        target_lang_option, decoder_threads_option,
        click.option("--decoder-flags", default=RescoreExperimentOptions.decoder_flags, callback=decoder_flags_value,
                     help="More decoder options for the tuning set's n-best list."),
        batch_tokens_option, device_option, threads_option, moses_home_option,
    ]):
        command = option(command)
    return command


def make_build_options(settings: Dict[str, Any]) -> BuildRerankerOptions:
    """The values of :func:`build_options` (parameter name -> value) as one object: each names a
    field of BuildRerankerOptions or of its ``experiment`` (RescoreExperimentOptions, whose
    ``threads`` the option ``--decoder-threads`` sets); ``--models`` is split at its commas."""
    values = dict(settings, model_kinds=tuple(m.strip() for m in settings["model_kinds"].split(",") if m.strip()),
                  archs=tuple(a.strip() for a in settings["archs"].split(",") if a.strip()))
    values["threads"] = values.pop("decoder_threads")
    build = {f.name for f in fields(BuildRerankerOptions)}
    experiment = {f.name for f in fields(RescoreExperimentOptions)}
    unknown = sorted(set(values) - build - experiment)
    if unknown:  # an option of build_options' with no field to hold it
        raise TypeError(f"no field of BuildRerankerOptions takes {', '.join(unknown)}")
    return BuildRerankerOptions(**{k: v for k, v in values.items() if k in build},
                                experiment=RescoreExperimentOptions(**{k: v for k, v in values.items()
                                                                       if k in experiment}))


@cli.command("build-reranker")
@click.argument("moses_ini", type=PathName(dir_okay=False, exists=True))
@click.option("--corpus", nargs=2, required=True, type=PathName(dir_okay=False, exists=True), metavar="SRC TGT",
              help="The system's tokenised training corpus, both sides (plain or gzip): the models train on it.")
@click.option("--tuning-set", "tuning", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              metavar="SRC REF", help="The tuning set, tokenised alike: the models validate on it, its n-best "
                                      "list tunes every row, and its BLEU chooses the row.")
@click.option("-o", "--output", "work_dir", required=True, type=PathName(file_okay=False),
              help="Working folder, new or empty (or one an earlier run made): the models, the lists, the runs, "
                   "reranker.json and report.md. Give the same command again to continue an interrupted run.")
@build_options
def build_reranker(moses_ini, corpus, tuning, work_dir, given, batch_tokens, threads, moses_home, **settings):
    """From a tuned MOSES_INI to its best reranker: train the sentence models, decode and rescore the
    tuning set's n-best list, tune every candidate row with --runs optimiser seeds, keep the best
    (near-ties: fewer models) and write OUTPUT/reranker.json for translate-system --moses --reranker."""
    set_threads(threads)
    from phrase_scorer.experiments.build_reranker import build_reranker as build

    result = build(moses_ini, corpus, tuning, work_dir, options=make_build_options(settings),
                   scoring_options=ScoringOptions(batch_tokens=batch_tokens), given_models=dict(given),
                   moses=moses_home)
    click.echo(result.markdown)


@cli.command("ems-decoder")
@click.argument("decoder_args", nargs=-1, type=click.UNPROCESSED, metavar="-- MOSES [EMS'S OPTIONS]")
@click.option("--corpus", nargs=2, type=PathName(dir_okay=False, exists=True), default=None, metavar="SRC TGT",
              help="The training corpus [default: the one EMS's training steps read].")
@click.option("--work", "work_dir", type=PathName(file_okay=False), default=None,
              help="Where the reranker is built [default: rescoring/ in EMS's working folder].")
@build_options
def ems_decoder(decoder_args, corpus, work_dir, given, batch_tokens, threads, moses_home, **settings):
    """The decoder EMS's evaluation runs: the tuned system's n-best lists reranked.

    \b
    In the EMS config:
      [EVALUATION]
      decoder = "phrase-scorer ems-decoder --preset small -- $moses-bin-dir/moses"

    It finds EMS's tuning and training corpus in EMS's step scripts, builds the reranker as
    build-reranker does (steps reused while their inputs are the same), then translates standard
    input with EMS's -f CONFIG and the reranker to standard output."""
    set_threads(threads)
    from phrase_scorer.experiments.ems_decoder import ems_decode

    ems_decode(decoder_args, options=make_build_options(settings),
               scoring_options=ScoringOptions(batch_tokens=batch_tokens), corpus=corpus, work_dir=work_dir,
               given_models=dict(given), moses_home=moses_home)


@cli.command("ems-config")
@click.argument("ini_in", metavar="IN", type=PathName(dir_okay=False, exists=True))
@click.argument("ini_out", metavar="OUT", type=PathName(dir_okay=False))
@click.option("-Binarizer", "binarizer", default=None, metavar="CMD",
              help="EMS's ttable-binarizer: '' or none for a text table, else processPhraseTableMin, "
                   "CreateProbingPT or CreateOnDiskPt with its path (its own arguments are replaced).")
@click.option("-m", "--model", "model_dir", type=PathName(file_okay=False, exists=True), default=None,
              help="Use this trained model instead of training one on IN's phrase table.")
@click.option("--feature-name", default=None,
              help="The phrase-table feature's name= [default: the first phrase table].")
@training_options
@column_options
@threads_option
@click.pass_context
def ems_config(ctx, ini_in, ini_out, binarizer, model_dir, feature_name, columns, unk_side, length_normalize,
               batch_tokens, window_lines, threads, **settings):
    """The step Moses' EMS runs as binarize-all: IN (its moses.ini) -> OUT, with the model's columns.

    \b
    In the EMS config:
      [TRAINING]
      binarize-all = "phrase-scorer ems-config --preset small"
      ttable-binarizer = ""
    EMS then runs 'phrase-scorer ems-config --preset small IN OUT -Binarizer ""'. This trains a
    model on IN's phrase table (into OUT.rnn-model, unless --model), annotates the table (into
    OUT.phrase-table.gz), binarises it if -Binarizer names a binariser, and writes OUT for the new
    table with the new columns' start weights; EMS's tuning then tunes them.
    """
    set_threads(threads)
    from phrase_scorer.experiments.ems_config import ModelTraining, build_ems_config

    config, model_config, explicit = make_training_settings(ctx, settings, resume=False)
    training_given = sorted(set(explicit_options(ctx, settings)) - {"device", "precision"})
    if model_dir is not None and training_given:
        raise PhraseScorerError("--model takes a trained model: leave out the training options "
                                f"({', '.join('--' + n.replace('_', '-') for n in training_given)})")
    result = build_ems_config(
        ini_in, ini_out, binarizer=binarizer, model_dir=model_dir,
        training=ModelTraining(config, model_config, explicit), feature_name=feature_name,
        annotate_options=AnnotateOptions(columns=columns, unk_side=unk_side, length_normalize=length_normalize,
                                         window_lines=window_lines),
        scoring_options=ScoringOptions(batch_tokens=batch_tokens),
    )
    if result.ignored_binarizer_arguments:
        click.echo(f"the binariser's own arguments were replaced: {' '.join(result.ignored_binarizer_arguments)}",
                   err=True)
    click.echo(f"model {result.model_dir} ({result.training}); table {result.annotated} ({result.annotation})"
               + (f"; binary table {result.phrase_table} ({result.binarized})" if result.binarized else "")
               + f"; {result.config}: {result.feature_name} num-features={result.num_features}", err=True)
