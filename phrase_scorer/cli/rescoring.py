"""``rescore`` and ``rerank``: n-best rescoring, the models' features appended to Moses' n-best
lists and the weights of every feature tuned on them (or a tuned reranker applied)."""

from __future__ import annotations

from typing import Optional

import click

from phrase_scorer.config import NBestOrigin, RerankOptions, RescoreOptions, RunOptions, ScoringOptions
from phrase_scorer.cli.group import UserError, cli, interrupted_resumable
from phrase_scorer.cli.options import (
    PARALLEL, SEED, Count, FiniteFloat, PathName, batch_tokens_option, device_option, distinct, moses_home_option,
    WINDOW, decoder_flags_value, overwrite_option, precision_option, resume_option, threads_option, workers_option,
)
from phrase_scorer.io.descriptors import writes_directly
from phrase_scorer.runtime.threads import set_threads


@cli.command()
@click.argument("nbest", type=PathName(dir_okay=False, allow_dash=True))
@click.option("--source", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="The sentences the n-best list was decoded from, one per line (plain or gzip).")
@click.option("-m", "--model", "models", multiple=True, type=PathName(file_okay=False),
              help="Model scoring log p(hypothesis | source); repeatable, one feature each.")
@click.option("-r", "--reverse-model", "reverse_models", multiple=True, type=PathName(file_okay=False),
              help="Model trained target->source, scoring log p(source | hypothesis); repeatable.")
@click.option("--name", "names", multiple=True,
              help="Feature name of each -m model, in order [default: RNN0, RNN1, ...].")
@click.option("--reverse-name", "reverse_names", multiple=True,
              help="Feature name of each --reverse-model, in order [default: RNNReverse0, ...].")
@click.option("--ensemble", default=None, metavar="NAME",
              help="Add the -m models as one feature NAME: the mean of their log p (one weight to tune).")
@click.option("--reverse-ensemble", default=None, metavar="NAME",
              help="Add the --reverse-model models as one feature NAME, the mean of their log p.")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="Rescored n-best list ('.gz' for gzip, '-' for stdout).")
@click.option("--normalize/--no-normalize", default=RescoreOptions.normalize,
              help="Write log p divided by the predicted tokens (words + 1) instead of log p.")
@batch_tokens_option
@click.option("--window-lines", type=WINDOW, default=RescoreOptions.window_lines,
              help="About this many lines (whole sentences) read, scored and written at a time (also the resume "
                   "granularity).")
@device_option
@precision_option
@threads_option
@workers_option("parse, check, plan, format and compress the list beside the models")
@resume_option
@overwrite_option
def rescore(nbest, source, models, reverse_models, names, reverse_names, ensemble, reverse_ensemble, output, normalize,
            batch_tokens, window_lines, device, precision, threads, workers, resume, overwrite):
    """Append the models' log-probabilities to every line of a Moses n-best list NBEST.

    Each model adds one dense feature 'Name= value' (natural log, 6 significant digits), or
    each ensemble one, the mean of its models' log p; every other byte of the list is kept. '-'
    reads NBEST from stdin.
    """
    from phrase_scorer.rescoring.rescore import feature_models, rescore as run_rescore
    from phrase_scorer.runtime.device import resolve_device

    loaded = feature_models(models, reverse_models, names, reverse_names, resolve_device(device), ensemble=ensemble,
                            reverse_ensemble=reverse_ensemble)
    set_threads(threads, [feature.loaded.model for feature in loaded])
    try:
        result = run_rescore(nbest, source, output, loaded,
                             RescoreOptions(normalize=normalize, window_lines=window_lines),
                             ScoringOptions(batch_tokens=batch_tokens, precision=precision),
                             run=RunOptions(resume=resume, overwrite=overwrite, workers=workers))
    except KeyboardInterrupt:
        raise interrupted_resumable(output) from None
    click.echo(f"rescored {result.lines:,} lines in {result.seconds:.0f}s, features {', '.join(result.features)}"
               + ("" if writes_directly(output) else f": {output}, signature {output}.json"), err=True)
    click.echo(f"signature: {result.signature_line()}", err=True)


def moved_to_apply_reranker(weights: Optional[str]) -> None:
    """``rerank --weights R``, the way a reranker was once applied: name the verb that applies one."""
    if weights is not None:
        raise UserError("rerank tunes a reranker; to apply one tuned before, run "
                        f"'phrase-scorer apply-reranker {weights} --test NBEST -o OUT'")


@cli.command()
@click.option("--dev", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Dev n-best list (rescored; plain or gzip) and its references (tokenised like the output): "
                   "tune the weights on it.")
@click.option("--weights", default=None, hidden=True, is_eager=True, expose_value=False,
              callback=lambda ctx, param, value: moved_to_apply_reranker(value))
@click.option("--test", "test_nbest", required=True, type=PathName(dir_okay=False, exists=True, allow_dash=True),
              help="Test n-best list with the same features, to rerank.")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="Where to write the test set's new 1-best, one line per sentence; when tuning, the reranker "
                   "(weights and models) goes to OUTPUT.json.")
@click.option("--ini", "start_ini", type=PathName(dir_okay=False, exists=True), default=None,
              help="The decoder's moses.ini: its [weight] section gives the starting weights "
                   "[default: fitted to the dev list's totals].")
@click.option("--method", type=click.Choice(["mert", "mira"]), default=RerankOptions.method,
              help="Moses' mert or kbmira (batch MIRA).")
@click.option("--seed", "seeds", type=SEED, multiple=True, default=RerankOptions.seeds, callback=distinct,
              help="One optimiser run per seed (repeatable); the run best on dev is kept.")
@click.option("--restarts", type=Count(min=0), default=RerankOptions.restarts,
              help="mert's random starting points per run.")
@click.option("--iterations", "mira_iterations", type=Count(min=1), default=RerankOptions.mira_iterations,
              help="kbmira's epochs per run.")
@click.option("--threads", type=PARALLEL, default=RerankOptions.threads, help="mert's threads.")
@click.option("--working-dir", type=PathName(file_okay=False), default=None,
              help="For the extractor's files and the optimiser runs, made fresh [default: OUTPUT.work].")
@click.option("--mertdir", type=PathName(file_okay=False, exists=True), default=None,
              help="Folder of extractor, mert and kbmira [default: MOSES_HOME/bin].")
@click.option("--ignore-feature", "ignore_features", multiple=True,
              help="A dense feature of the lists to leave out, neither tuned nor used (repeatable).")
@click.option("--decoder-flags", default=None, callback=decoder_flags_value,
              help="The decoder options the n-best lists were made with, recorded in the reranker.")
@click.option("--min-feature-gain", type=FiniteFloat(), default=RerankOptions.min_feature_gain, show_default=True,
              help="Dev BLEU points a model feature must buy to keep its tuned weight (measured by setting it "
                   "to 0): one that buys no more is weighted 0 and translate-system --moses does not run its model; "
                   "negative: keep every feature.")
@overwrite_option
@moses_home_option
def rerank(dev, test_nbest, output, start_ini, method, seeds, restarts, mira_iterations, threads,
           working_dir, mertdir, ignore_features, decoder_flags, min_feature_gain, overwrite, moses_home):
    """Tune a reranker: the weights of every feature of a rescored dev n-best list, with Moses'
    optimisers; then write the best hypothesis of each sentence of the test n-best list, and the
    reranker to OUTPUT.json (apply-reranker applies it to another list)."""
    from phrase_scorer.rescoring.rerank import rerank as run_rerank

    options = RerankOptions(method=method, seeds=tuple(seeds), restarts=restarts, mira_iterations=mira_iterations,
                            threads=threads, mertdir=mertdir, ignore_features=tuple(ignore_features),
                            min_feature_gain=min_feature_gain)
    # the reranker goes to OUTPUT.json: one the user keeps there without OUTPUT is replaced only with --overwrite
    result = run_rerank(dev, test_nbest, output, moses=moses_home, options=options,
                        origin=NBestOrigin(start_ini=start_ini, decoder_flags=decoder_flags), working_dir=working_dir,
                        overwrite=overwrite)
    runs = ", ".join(f"seed {r.seed}: {r.dev_bleu:.2f}" for r in result.runs)
    click.echo(f"dev BLEU {result.start_dev_bleu:.2f} with the starting weights; after {method}: {runs}; "
               f"kept seed {result.best_seed}", err=True)
    for name, bleu in result.dropped.items():
        click.echo(f"feature {name} weighted 0: it bought at most {min_feature_gain:g} dev BLEU "
                   f"({bleu:.2f} without it, {result.dev_bleu:.2f} with); translate-system will not run its model",
                   err=True)
    click.echo(f"test 1-best: {output} ({result.sentences} sentences); reranker in {output}.json "
               f"(apply-reranker {output}.json --test NBEST -o OUT applies it to another list)", err=True)


@cli.command("apply-reranker")
@click.argument("reranker", type=PathName(dir_okay=False, exists=True))
@click.option("--test", "test_nbest", required=True, type=PathName(dir_okay=False, exists=True, allow_dash=True),
              help="Rescored n-best list with the reranker's features, to rerank (plain or gzip; '-': stdin).")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="Where to write the list's new 1-best, one line per sentence.")
@overwrite_option
def apply_reranker(reranker, test_nbest, output, overwrite):
    """Apply a reranker tuned before (the OUTPUT.json of a 'rerank' run) to a rescored n-best
    list, without Moses: the best hypothesis of each sentence under its weights. A list whose
    features or models differ from the reranker's is refused."""
    from phrase_scorer.rescoring.reranker import apply_reranker as run_apply

    sentences = run_apply(reranker, test_nbest, output, overwrite=overwrite)
    click.echo(f"test 1-best: {output} ({sentences} sentences), weights from {reranker}", err=True)
