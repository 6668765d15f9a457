"""The ``phrase-scorer`` command line: parses options, calls one library function per verb.

Library errors (:class:`PhraseScorerError`) become one line on stderr and exit status 1; an
interrupted long job says how to resume and exits with 130. torch is imported only inside the
verbs that need it, so ``--help`` and the Moses-config verbs start at once.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
from dataclasses import fields
from typing import Optional

import click

from phrase_scorer import __version__, progress
from phrase_scorer.config import COLUMNS, PRESETS, UNK_SIDES, AnnotateOptions, ScoringOptions, TrainConfig
from phrase_scorer.errors import PhraseScorerError

log = logging.getLogger("phrase_scorer")


class UserError(click.ClickException):
    """A PhraseScorerError (or an interruption) as click reports it: one line, no traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"phrase-scorer: error: {self.format_message()}", err=True)


class Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PhraseScorerError as exc:
            raise UserError(str(exc)) from None
        except KeyboardInterrupt:
            raise UserError("interrupted", exit_code=130) from None


class Duration(click.ParamType):
    """Seconds, or a duration such as 90s, 30m, 2h, 1h30m."""

    name = "duration"
    _PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
    _UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        pos, total = 0, 0.0
        while pos < len(text):
            match = self._PART.match(text, pos)
            if not match:
                self.fail(f"{value!r} is not a duration (examples: 3600, 90s, 30m, 2h, 1h30m)", param, ctx)
            total += float(match.group(1)) * self._UNIT[match.group(2)]
            pos = match.end()
        if not text:
            self.fail("empty duration", param, ctx)
        return total


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("phrase_scorer")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def set_threads(threads: Optional[int]) -> None:
    import torch

    torch.set_num_threads(threads or os.cpu_count() or 1)


def explicit_options(ctx: click.Context, names) -> dict:
    """The options among ``names`` that the user gave on the command line."""
    return {
        name: ctx.params[name]
        for name in names
        if name in ctx.params and ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT
    }


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, "-V", "--version", prog_name="phrase-scorer")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors; no progress bars.")
@click.option("-v", "--verbose", is_flag=True, help="Debug messages.")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress bars (default: when stderr is a terminal).")
def cli(quiet: bool, verbose: bool, show_progress: Optional[bool]) -> None:
    """Score Moses phrase tables with the RNN Encoder-Decoder of Cho et al. (2014).

    \b
    Typical use:
      phrase-scorer train phrase-table.gz -o model/
      phrase-scorer annotate phrase-table.gz -m model/ -o phrase-table.rnn.gz
      phrase-scorer moses-ini moses.ini --phrase-table phrase-table.rnn.gz -o moses.rnn.ini
    """
    setup_logging(-1 if quiet else 1 if verbose else 0)
    progress.show_bars = False if quiet else show_progress
    log.debug("phrase-scorer %s: %s", __version__, " ".join(sys.argv))


device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=TrainConfig.device,
                             help="Where to run the model.")
threads_option = click.option("--threads", type=click.IntRange(min=1), default=None,
                              help="CPU threads for the model [default: all cores].")
model_option = click.option("-m", "--model", "model_dir", required=True, type=click.Path(file_okay=False),
                            help="Model directory made by 'phrase-scorer train'.")


# --- train ---------------------------------------------------------------------------------------


@cli.command()
@click.argument("table", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Model directory to create.")
@click.option("--preset", type=click.Choice(list(PRESETS)), default=TrainConfig.preset,
              help="Network size: the paper's, one that trains on a CPU in under an hour, or a toy for tests.")
@click.option("--source-shortlist", type=click.IntRange(min=1), default=None,
              help="Source words kept [default: the preset's, 15000 for paper].")
@click.option("--target-shortlist", type=click.IntRange(min=1), default=None,
              help="Target words kept [default: the preset's, 15000 for paper].")
@click.option("--batch-size", type=click.IntRange(min=1), default=TrainConfig.batch_size, help="Pairs per update.")
@click.option("--valid-pairs", type=click.IntRange(min=0), default=TrainConfig.valid_pairs,
              help="About this many pairs are held out for validation, by source phrase.")
@click.option("--valid-every", type=click.IntRange(min=1), default=TrainConfig.valid_every, help="Steps between validations and checkpoints.")
@click.option("--patience", type=click.IntRange(min=1), default=TrainConfig.patience, help="Stop after this many validations without improvement.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Stop after this many updates.")
@click.option("--max-epochs", type=click.FloatRange(min=0, min_open=True), default=None, help="Stop after this many passes over the pairs.")
@click.option("--max-time", type=Duration(), default=None, help="Stop after this long (3600, 90m, 2h, ...).")
@click.option("--clip-norm", type=click.FloatRange(min=0, min_open=True), default=TrainConfig.clip_norm, help="Gradient-norm clipping threshold.")
@click.option("--seed", type=int, default=TrainConfig.seed, help="Random seed (initial weights, validation split, data order).")
@device_option
@click.option("--precision", type=click.Choice(["auto", "bf16", "fp16", "fp32"]), default=TrainConfig.precision,
              help="Autocast on GPU (auto: bf16 where supported, else fp16). CPU always trains in fp32.")
@threads_option
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace a model already in the output folder.")
@click.pass_context
def train(ctx, table, output, source_shortlist, target_shortlist, threads, resume, overwrite, **settings):
    """Train the RNN Encoder-Decoder on the unique phrase pairs of TABLE (plain or gzip)."""
    set_threads(threads)
    from dataclasses import replace

    from phrase_scorer.train import train as run_training

    names = [f.name for f in fields(TrainConfig)]
    explicit = explicit_options(ctx, names)
    config = TrainConfig(**{k: v for k, v in settings.items() if k in names})
    model_config = None
    if source_shortlist or target_shortlist:
        if resume:
            raise PhraseScorerError("--source-shortlist/--target-shortlist cannot change when resuming")
        base = PRESETS[config.preset]
        model_config = replace(base, source_shortlist=source_shortlist or base.source_shortlist,
                               target_shortlist=target_shortlist or base.target_shortlist)
    from phrase_scorer.train import TrainingInterrupted

    resume_command = f"phrase-scorer train {table} -o {output} --resume"
    try:
        state = run_training(table, output, config, resume=resume, overwrite=overwrite,
                             model_config=model_config, explicit=set(explicit))
    except TrainingInterrupted as stop:
        raise UserError(f"stopped at step {stop.step}, checkpoint saved; resume with: {resume_command}",
                        exit_code=130) from None
    except KeyboardInterrupt:
        if os.path.exists(os.path.join(output, "checkpoint.pt")):
            message = f"interrupted; resume from the last checkpoint with: {resume_command}"
        else:
            message = "interrupted before the first checkpoint; run the same command again to start over"
        raise UserError(message, exit_code=130) from None
    click.echo(f"model in {output}: {state.step} steps, best validation NLL {state.best_valid_nll:.4f} per token "
               f"at step {state.best_step} ({state.stop_reason})", err=True)


# --- score ---------------------------------------------------------------------------------------


@cli.command()
@model_option
@click.argument("input", type=click.Path(dir_okay=False, allow_dash=True), default="-")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-", help="Where to write the scores.")
@click.option("--batch-tokens", type=click.IntRange(min=1), default=ScoringOptions.batch_tokens, help="Target tokens per scoring batch.")
@device_option
@threads_option
def score(model_dir, input, output, batch_tokens, device, threads):
    """Print log p(target | source) (natural log) for each 'src ||| tgt' line of INPUT.

    INPUT may also be a whole phrase table; '-' reads stdin. One number per input line, in order.
    """
    set_threads(threads)
    from phrase_scorer.annotate import score_file
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.train import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    score_file(input, output, loaded, ScoringOptions(batch_tokens=batch_tokens))


# --- annotate ------------------------------------------------------------------------------------


def parse_columns(ctx, param, value: str):
    return tuple(c.strip() for c in value.split(",") if c.strip())


@cli.command()
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@model_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Annotated table ('.gz' for gzip, '-' for stdout).")
@click.option("--columns", default=",".join(COLUMNS), callback=parse_columns,
              help="Columns to append: prob = p(y|x), unk = e^(number of unknown words).")
@click.option("--unk-side", type=click.Choice(UNK_SIDES), default=AnnotateOptions.unk_side,
              help="Whose words outside the model's shortlists the unk column counts.")
@click.option("--length-normalize/--no-length-normalize", default=AnnotateOptions.length_normalize,
              help="Write exp(log p / (target words + 1)), p per target token, instead of p(y|x).")
@click.option("--batch-tokens", type=click.IntRange(min=1), default=ScoringOptions.batch_tokens, help="Target tokens per scoring batch.")
@click.option("--window-lines", type=click.IntRange(min=1), default=AnnotateOptions.window_lines,
              help="Lines read, scored and written at a time (also the resume granularity).")
@device_option
@click.option("--precision", type=click.Choice(["auto", "bf16", "fp16", "fp32"]), default=ScoringOptions.precision,
              help="Autocast on GPU; log-softmax stays fp32. CPU scores in fp32.")
@threads_option
@click.option("--resume", is_flag=True, help="Continue an interrupted run of the same command.")
@click.option("--ini", "moses_ini", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Also write this moses.ini, patched for the new table, to --ini-output.")
@click.option("--ini-output", type=click.Path(dir_okay=False), default=None,
              help="Where --ini writes the patched moses.ini [default: OUTPUT's name + .moses.ini].")
def annotate(table, model_dir, output, columns, unk_side, length_normalize, batch_tokens, window_lines,
             device, precision, threads, resume, moses_ini, ini_output):
    """Append the model's p(y|x) and unknown-word columns to every line of TABLE."""
    set_threads(threads)
    from phrase_scorer.annotate import annotate as run_annotate
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.train import resolve_device

    options = AnnotateOptions(columns=columns, unk_side=unk_side, length_normalize=length_normalize,
                              window_lines=window_lines)
    loaded = load_model(model_dir, resolve_device(device))
    try:
        result = run_annotate(table, output, loaded, options,
                              ScoringOptions(batch_tokens=batch_tokens, precision=precision), resume=resume)
    except KeyboardInterrupt:
        raise UserError(
            f"interrupted; the finished part is kept. Resume with the same command and --resume", exit_code=130
        ) from None
    click.echo(
        f"annotated {result.lines:,} lines in {result.seconds:.0f}s ({result.lines / max(result.seconds, 1e-9):,.0f} lines/s)"
        + ("" if output == "-" else f": {output}, signature {output}.json"),
        err=True,
    )
    report_moses_change(result, output, moses_ini, ini_output)


def report_moses_change(result, output, moses_ini, ini_output) -> None:
    before, after = result.num_scores_before, result.num_scores_after
    added = after - before
    if moses_ini:
        from phrase_scorer.io.moses_ini import patch_moses_ini

        target = ini_output or f"{output}.moses.ini"
        patch_moses_ini(moses_ini, target, phrase_table=os.path.abspath(output), add_features=added)
        click.echo(f"patched moses.ini written to {target}", err=True)
        return
    click.echo(
        "\nFor Moses, the phrase table now has {after} scores per line (was {before}). In moses.ini:\n"
        "  [feature]  PhraseDictionaryMemory ... num-features={after} path={path}\n"
        "  [weight]   TranslationModel0= <the {before} current weights>{extra}\n"
        "then re-tune. 'phrase-scorer moses-ini MOSES_INI --phrase-table {path} -o NEW_INI' makes this change.".format(
            after=after, before=before, path=os.path.abspath(output) if output != "-" else "TABLE",
            extra=" 0.2" * added,
        ),
        err=True,
    )


# --- moses-ini -----------------------------------------------------------------------------------


@cli.command("moses-ini")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.option("--phrase-table", required=True, type=click.Path(),
              help="The new table, written into the feature's path= (the binary table with --binarize-from).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="The patched moses.ini to write ('-' for stdout).")
@click.option("--add-features", type=click.IntRange(min=0), default=2, help="Score columns added to the table.")
@click.option("--initial-weight", type=float, default=0.2, help="Weight of each new column until tuning.")
@click.option("--feature-name", default=None,
              help="The phrase-table feature's name= (e.g. TranslationModel0) [default: the first phrase table].")
@click.option("--absolute-paths/--no-absolute-paths", default=False,
              help="Also make every relative path= absolute (against the ini's folder), so Moses runs from anywhere.")
@click.option("--check-table/--no-check-table", default=True,
              help="Check that the text table's score count on its first lines matches the new num-features.")
@click.option("--binarize-from", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Build the binary table (Compact, ProbingPT, OnDisk) at --phrase-table from this text table.")
@click.option("--moses-home", type=click.Path(file_okay=False), envvar="MOSES_HOME", default=None,
              help="Moses folder whose bin/ holds the binarisers [default: $MOSES_HOME].")
def moses_ini_command(moses_ini, phrase_table, output, add_features, initial_weight, feature_name,
                      absolute_paths, check_table, binarize_from, moses_home):
    """Patch MOSES_INI for a phrase table with more score columns; then re-tune.

    Points the phrase-table feature at the new table, raises its num-features and appends the
    new columns' weights. Every other line is copied unchanged.
    """
    from phrase_scorer.io.moses_ini import patch_moses_ini

    result = patch_moses_ini(moses_ini, output, phrase_table=phrase_table, add_features=add_features,
                             initial_weight=initial_weight, feature_name=feature_name,
                             absolute_paths=absolute_paths, check_table=check_table,
                             binarize_from=binarize_from, moses_home=moses_home)
    if result.binarize_command:
        click.echo(f"binarised: {' '.join(result.binarize_command)}", err=True)
    click.echo(f"{result.feature_name} ({result.feature_type}): num-features {result.old_num_features} -> "
               f"{result.new_num_features}; {len(result.changes)} line(s) changed:", err=True)
    for change in result.changes:
        click.echo(f"  line {change.number}:\n    - {change.before}\n    + {change.after}", err=True)
    if output != "-":
        click.echo(f"wrote {output}; re-tune it with a fresh mert-moses.pl --working-dir", err=True)


def main() -> None:
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phrase-scorer score ... | head` ends quietly
    cli(prog_name="phrase-scorer")


if __name__ == "__main__":
    main()
