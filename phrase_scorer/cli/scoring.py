"""``score`` and ``annotate``: the model's scores of phrase pairs, appended to Moses' phrase tables."""

from __future__ import annotations

import os

import click

from phrase_scorer.config import AnnotateOptions, RunOptions, ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.cli.group import cli, interrupted_resumable, shown
from phrase_scorer.cli.options import (
    PathName, batch_tokens_option, column_options, device_option, model_option, overwrite_option, precision_option,
    resume_option, threads_option, workers_option,
)
from phrase_scorer.runtime.threads import set_threads


@cli.command()
@model_option
@click.argument("input", type=PathName(dir_okay=False, allow_dash=True), default="-")
@click.option("-o", "--output", type=PathName(dir_okay=False, allow_dash=True), default="-",
              help="Where to write the scores (a name ending in .gz is gzipped).")
@overwrite_option
@batch_tokens_option
@device_option
@threads_option
def score(model_dir, input, output, overwrite, batch_tokens, device, threads):
    """Print log p(target | source) (natural log) for each 'src ||| tgt' line of INPUT.

    INPUT may also be a whole phrase table; '-' reads stdin. One number per input line, in order.
    """
    from phrase_scorer.scoring.score import score_file
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.runtime.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    set_threads(threads, [loaded.model])
    score_file(input, output, loaded, ScoringOptions(batch_tokens=batch_tokens), overwrite=overwrite)


@cli.command()
@click.argument("table", type=PathName(dir_okay=False, allow_dash=True))
@model_option
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False, allow_dash=True),
              help="Annotated table ('.gz' for gzip, '-' for stdout).")
@column_options
@device_option
@precision_option
@threads_option
@workers_option("read, check, format and compress the table beside the model")
@resume_option
@overwrite_option
@click.option("--ini", "moses_ini", type=PathName(dir_okay=False, exists=True), default=None,
              help="Also write this moses.ini, patched for the new table, to --ini-output.")
@click.option("--ini-output", type=PathName(dir_okay=False), default=None,
              help="Where --ini writes the patched moses.ini [default: OUTPUT's name + .moses.ini].")
def annotate(table, model_dir, output, columns, unk_side, length_normalize, batch_tokens, window_lines,
             device, precision, threads, workers, resume, overwrite, moses_ini, ini_output):
    """Append the model's p(y|x) and unknown-word columns to every line of TABLE.

    Under torchrun (torchrun --nproc-per-node N -m phrase_scorer annotate ...) every process
    annotates a part of TABLE and the parts are joined into OUTPUT, byte for byte what one
    process writes."""
    from phrase_scorer.scoring.annotate import annotate as run_annotate
    from phrase_scorer.runtime.device import resolve_device
    from phrase_scorer.runtime.distributed import device_for_rank, world
    from phrase_scorer.model_dir import load_model

    from phrase_scorer.io.outputs import OutputKind, check_output, writes_directly

    options = AnnotateOptions(columns=columns, unk_side=unk_side, length_normalize=length_normalize,
                              window_lines=window_lines)
    if moses_ini:  # checked before the long work, not after it
        if output == "-" and ini_output is None:
            raise PhraseScorerError("--ini needs --ini-output when the table goes to standard output")
        ini_output = ini_output or f"{output}.moses.ini"
        check_output(ini_output, [("the phrase table", table), ("the annotated table", output),
                                  ("the moses.ini", moses_ini)], overwrite=overwrite,
                     kind=OutputKind("the patched moses.ini"), lock=world().is_main)
        if not writes_directly(ini_output) and os.path.abspath(ini_output) == os.path.abspath(output):
            raise PhraseScorerError(f"--ini-output {ini_output} is the annotated table -o {output}",
                                    hint="write the patched moses.ini elsewhere")
    loaded = load_model(model_dir, device_for_rank(resolve_device(device)))
    set_threads(threads, [loaded.model])
    try:
        result = run_annotate(table, output, loaded, options,
                              ScoringOptions(batch_tokens=batch_tokens, precision=precision),
                              run=RunOptions(resume=resume, overwrite=overwrite, workers=workers))
    except KeyboardInterrupt:
        raise interrupted_resumable(output) from None
    if not world().is_main:  # under torchrun, rank 0 reports for the job
        return
    if result.already_finished:
        click.echo(f"{output} is already finished ({result.lines:,} lines, signature {output}.json): nothing to do",
                   err=True)
    else:
        click.echo(
            f"annotated {result.lines:,} lines in {result.seconds:.0f}s "
            f"({result.lines / max(result.seconds, 1e-9):,.0f} lines/s)"
            + ("" if writes_directly(output) else f": {output}, signature {output}.json"),
            err=True,
        )
    from phrase_scorer.moses.ini_patch import moses_for_new_columns

    click.echo(shown(moses_for_new_columns(output, result.num_scores_before, result.num_scores_after,
                                           tuple(result.signature["columns"]), moses_ini=moses_ini,
                                           ini_output=ini_output, overwrite=overwrite)),
               err=True)
