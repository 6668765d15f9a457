"""``train``."""

from __future__ import annotations

import logging
import sys

import click

from phrase_scorer.runtime import progress
from phrase_scorer.cli.group import UserError, cli, log, shown
from phrase_scorer.cli.options import (
    PROCESSES, Count, PathName, make_training_settings, threads_option, training_options,
)
from phrase_scorer.runtime.threads import set_threads


@cli.command()
@click.argument("table", type=PathName(dir_okay=False), required=False)
@click.option("--corpus", nargs=2, type=PathName(exists=True, dir_okay=False), default=None, metavar="SRC TGT",
              help="Train on the sentence pairs of two aligned files (plain or gzip, tokenised) instead of a TABLE.")
@click.option("--dev", nargs=2, type=PathName(exists=True, dir_okay=False), default=None, metavar="SRC TGT",
              help="With --corpus: validate on these sentence pairs "
                   "[default: hold out about --valid-pairs training pairs].")
@click.option("--max-length", type=Count(min=1), default=None,
              help="With --corpus: leave out training pairs with a side longer than this many words (paper: 30 or 50) "
                   "[default: no limit].")
@click.option("--right-to-left", is_flag=True, default=False,
              help="Read the target side last word first (a right-to-left model, a second opinion for rescoring). "
                   "The model keeps it: score, rescore, annotate and translate reverse the words for it by themselves.")
@click.option("-o", "--output", required=True, type=PathName(file_okay=False), help="Model directory to create.")
@training_options
@threads_option
@click.option("--processes", type=PROCESSES, default=1,
              help="Train in this many processes on this machine, each on its part of every batch (as under "
                   "torchrun --standalone; the batch stays --batch-size pairs). On an idle 2-core CPU, 2 processes "
                   "train RNNsearch small on sentence pairs 1.36 times as fast as the default single process.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace a model already in the output folder.")
@click.pass_context
def train(ctx, table, corpus, dev, output, threads, processes, resume, overwrite, **settings):
    """Train a model (--arch) on the unique phrase pairs of TABLE (plain or gzip), or on the
    sentence pairs of --corpus SRC TGT."""
    if (table is None) == (not corpus):
        raise UserError("give either a phrase TABLE or --corpus SRC TGT (not both)" if table else
                        "give a phrase TABLE or --corpus SRC TGT to train on")
    if dev and not corpus:
        raise UserError("--dev goes with --corpus (a phrase table's validation pairs are held out from it)")
    from phrase_scorer.runtime import distributed

    data_args = f"--corpus {' '.join(corpus)}" + (f" --dev {' '.join(dev)}" if dev else "") if corpus else table
    resume_command = (f"phrase-scorer train {data_args} -o {output}"
                      f"{f' --processes {processes}' if processes > 1 else ''} --resume")
    current = distributed.world()
    if processes > 1 and not current.is_distributed:  # start the job; its ranks run this command again
        ctx.exit(distributed.launch_local(processes, sys.argv[1:], threads, resume_command=resume_command))
    if processes > 1 and processes != current.local_size:
        raise UserError(f"--processes {processes}, but torchrun started {current.local_size} processes on this "
                        "machine; give --processes or run under torchrun, not both")
    set_threads(threads)
    from phrase_scorer.data.sentence_pairs import SentenceCorpus

    if not current.is_main:  # under torchrun, rank 0 alone reports progress
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
        progress.show_bars = False
    from phrase_scorer.training.run import train as run_training
    from phrase_scorer.training.stopping import TrainingInterrupted

    config, model_config, explicit = make_training_settings(ctx, settings, resume)
    data = table
    if corpus:
        data = SentenceCorpus(*corpus, *(dev or (None, None)))
    try:
        with distributed.failures_to_launcher():
            state = run_training(data, output, config, resume=resume, overwrite=overwrite,
                                 model_config=model_config, explicit=explicit)
    except TrainingInterrupted as stop:
        status = 128 + stop.number  # 130 for Ctrl-C, 143 for SIGTERM: how a scheduler sees the run end
        if not current.is_main:  # rank 0 says where the job stopped, once
            raise SystemExit(status) from None
        raise UserError(f"stopped at step {stop.step}, checkpoint saved; resume with: {resume_command}",
                        exit_code=status) from None
    except KeyboardInterrupt:
        if not current.is_main:
            raise SystemExit(130) from None
        from phrase_scorer.training.run import interrupted_checkpoint

        if interrupted_checkpoint(output):
            message = f"interrupted; resume from the last checkpoint with: {resume_command}"
        else:
            message = "interrupted before the first checkpoint; run the same command again to start over"
        raise UserError(message, exit_code=130) from None
    if current.is_main:
        from phrase_scorer.training.validation import best_summary

        click.echo(f"model in {output}: {state.step} steps, {best_summary(state)} ({shown(state.stop_reason)})",
                   err=True)
