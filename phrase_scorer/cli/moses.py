"""``moses-ini``, ``tune`` and ``evaluate``: the user's Moses."""

from __future__ import annotations

import click

from phrase_scorer.config import EvaluateOptions, MosesIniOptions, TuneOptions
from phrase_scorer.cli.group import cli
from phrase_scorer.cli.options import (
    PARALLEL, SEED, Count, PathName, make_tune_options, moses_home_option, overwrite_option, parse_weights,
    decoder_flags_value, tune_options,
)


@cli.command("moses-ini")
@click.argument("moses_ini", type=PathName(exists=True, dir_okay=False))
@click.option("--phrase-table", required=True, type=PathName(),
              help="The new table, written into the feature's path= (the binary table with --binarize-from).")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="The patched moses.ini to write ('-' for stdout).")
@click.option("--add-features", type=Count(min=0), default=MosesIniOptions.add_features,
              help="Score columns added to the table.")
@click.option("--initial-weights", "--initial-weight", "initial_weights", callback=parse_weights, default=None,
              help="Start weights of the new columns until tuning, comma-separated, or one for all "
                   "[default: annotate's columns in order, prob 0.2, unk -0.2: the unknown-word count is a penalty].")
@click.option("--feature-name", default=None,
              help="The phrase-table feature's name= (e.g. TranslationModel0) [default: the first phrase table].")
@click.option("--absolute-paths/--no-absolute-paths", default=MosesIniOptions.absolute_paths,
              help="Also make every relative path= absolute (against the ini's folder), so Moses runs from anywhere.")
@click.option("--check-table/--no-check-table", default=MosesIniOptions.check_table,
              help="Check that the text table's score count on its first lines matches the new num-features.")
@click.option("--binarize-from", type=PathName(exists=True, dir_okay=False), default=None,
              help="Build the binary table (Compact, ProbingPT, OnDisk) at --phrase-table from this text table.")
@click.option("--moses-home", type=PathName(file_okay=False), envvar="MOSES_HOME", default=None,
              help="Moses folder whose bin/ holds the binarisers [default: $MOSES_HOME].")
@overwrite_option
def moses_ini_command(moses_ini, phrase_table, output, add_features, initial_weights, feature_name,
                      absolute_paths, check_table, binarize_from, moses_home, overwrite):
    """Patch MOSES_INI for a phrase table with more score columns; then re-tune.

    Points the phrase-table feature at the new table, raises its num-features and appends the
    new columns' weights. Every other line is copied unchanged.
    """
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    options = MosesIniOptions(add_features=add_features, initial_weights=initial_weights, feature_name=feature_name,
                              absolute_paths=absolute_paths, check_table=check_table)
    result = patch_moses_ini(moses_ini, output, phrase_table=phrase_table, options=options,
                             binarize_from=binarize_from, moses_home=moses_home, overwrite=overwrite)
    if result.binarize_command:
        click.echo(f"binarised: {' '.join(result.binarize_command)}", err=True)
    click.echo(f"{result.feature_name} ({result.feature_type}): num-features {result.old_num_features} -> "
               f"{result.new_num_features}; {len(result.changes)} line(s) changed:", err=True)
    for change in result.changes:
        click.echo(f"  line {change.number}:\n    - {change.before}\n    + {change.after}", err=True)
    if output != "-":
        click.echo(f"wrote {output}; re-tune it with a fresh mert-moses.pl --working-dir", err=True)


@cli.command()
@click.argument("moses_ini", type=PathName(dir_okay=False, exists=True))
@click.option("--dev", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Dev source and reference (tokenised as the system's training data; plain or gzip).")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False),
              help="Where to write the tuned moses.ini.")
@click.option("--working-dir", type=PathName(file_okay=False), default=None,
              help="mert-moses.pl's working directory, made fresh [default: OUTPUT.work].")
@click.option("--seed", type=SEED, default=TuneOptions.seed, help="Seed of the optimiser's random restarts.")
@overwrite_option
@tune_options
@moses_home_option
def tune(moses_ini, dev, output, working_dir, seed, overwrite, moses_home, **options):
    """Re-tune MOSES_INI's weights with the user's mert-moses.pl."""
    from phrase_scorer.moses.tune import tune as run_tune

    result = run_tune(moses_ini, dev[0], dev[1], output, moses=moses_home,
                      options=make_tune_options(options, seed=seed), working_dir=working_dir, overwrite=overwrite)
    history = ", ".join(f"{it}: {bleu:.2f}" for it, bleu in result.iterations)
    click.echo(f"tuned config: {output} (dev BLEU by iteration: {history}; "
               f"kept: {'?' if result.dev_bleu is None else f'{result.dev_bleu:.2f}'})", err=True)


@cli.command()
@click.argument("moses_ini", type=PathName(dir_okay=False, exists=True))
@click.option("--test", nargs=2, required=True, type=PathName(dir_okay=False, exists=True),
              help="Test source (tokenised as for the system) and reference (tokenised or raw).")
@click.option("-o", "--output", type=PathName(dir_okay=False), default=None,
              help="Where to keep the decoder output [default: MOSES_INI's name + .test.hyp].")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]), default=EvaluateOptions.references,
              help="Tokenised references are compared as they are (--tokenize none); raw ones after detokenising "
                   "the output with sacremoses. auto: tokenised if they carry Moses escapes.")
@click.option("--lang", default=EvaluateOptions.lang, help="Target language (for detokenising).")
@click.option("--threads", type=PARALLEL, default=EvaluateOptions.threads, help="Decoder threads [default: all cores].")
@click.option("--decoder-flags", default=EvaluateOptions.decoder_flags, callback=decoder_flags_value,
              help="More decoder options.")
@click.option("--decoder", default=EvaluateOptions.decoder, help="Decoder program in MOSES_HOME/bin.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@overwrite_option
@moses_home_option
def evaluate(moses_ini, test, output, references, lang, threads, decoder_flags, decoder, as_json, overwrite,
             moses_home):
    """Decode a test set with MOSES_INI and report sacrebleu BLEU and chrF with their signatures."""
    import json

    from phrase_scorer.moses.evaluate import evaluate as run_evaluate

    output = output or f"{moses_ini}.test.hyp"
    options = EvaluateOptions(references=references, lang=lang, threads=threads, decoder_flags=decoder_flags,
                              decoder=decoder)
    result = run_evaluate(moses_ini, test[0], test[1], output, moses=moses_home, options=options, overwrite=overwrite)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        click.echo(f"BLEU {result.bleu:.2f}  ({result.bleu_signature})")
        click.echo(f"chrF {result.chrf:.2f}  ({result.chrf_signature})")
        click.echo(f"{result.sentences} sentences, {result.references} references; output in {result.hypotheses_path}")
