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
import time
from dataclasses import fields
from typing import Optional, Sequence

import click

from phrase_scorer import __version__, progress
from phrase_scorer.config import (
    ARCH_PRESETS, COLUMNS, INITS, LOSSES, OPTIMIZERS, PRECISIONS, RECIPES, TRAIN_PRECISIONS, UNK_SIDES, VALID_METRICS,
    AnnotateOptions, ExperimentOptions, RerankOptions,
    SYSTEMS, RescoreExperimentOptions, RescoreOptions, SampleOptions, ScoringOptions, TrainConfig, TranslateOptions,
    TuneOptions,
)
from phrase_scorer.errors import PhraseScorerError

# PyTorch's OpenMP threads spin while they wait for work by default. Beside other busy processes
# a spinning thread holds a core that the thread it waits for needs: with sleeping threads a
# `small` model annotated 1.7 and 8.1 times faster (two measurements) on a 2-core machine kept
# busy by 2 other processes, and about 10% slower on the idle machine (docs/benchmarks.md,
# "Annotate on a busy machine").
# So waiting threads sleep, unless the user chose a policy (OMP_WAIT_POLICY=ACTIVE for a machine
# of its own). The OpenMP runtime reads this when torch loads, which is after this line.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
        except OSError as exc:  # an I/O failure the library did not anticipate: still one line
            from phrase_scorer.io.files import describe_os_error

            raise UserError(str(describe_os_error(exc, exc.filename or "output"))) from None


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


def interrupted_resumable(output: str) -> UserError:
    """Ctrl-C during a resumable run: say whether a finished part was kept for --resume."""
    from phrase_scorer.io.files import part_path

    if output != "-" and os.path.exists(f"{part_path(output)}.json"):
        message = "interrupted; the finished part is kept. Resume with the same command and --resume"
    else:
        message = "interrupted before the first chunk was finished; nothing kept, run the command again"
    return UserError(message, exit_code=130)


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("phrase_scorer")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def other_running_tasks(samples: int = 5, interval: float = 0.01) -> Optional[int]:
    """How many threads of other programs are running or waiting for a core right now.

    Read from the kernel's count of runnable tasks (``/proc/loadavg``, this process excluded),
    the least of a few samples; ``None`` where the kernel does not say. Unlike the one-minute
    load average, it does not count a command that has just finished.
    """
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(running - 1)
        if counts[-1] <= 0:
            break
        if i + 1 < samples:
            time.sleep(interval)
    return min(counts)


def set_threads(threads: Optional[int], models: Sequence = ()) -> None:
    """By default all the cores this process may use (its CPU affinity, shared with the job's
    other ranks on the machine under torchrun): the same count every run, so results repeat
    exactly; one thread for scoring with ``models`` too small to gain from more
    (:func:`phrase_scorer.scoring.default_threads`). On a busy machine PyTorch's threads wait on
    each other and run far slower: say so."""
    import torch

    from phrase_scorer.distributed import cores_per_process

    cores = cores_per_process()
    if threads is None:
        from phrase_scorer.scoring import default_threads

        threads = default_threads(models, cores)
        machine = os.cpu_count() or 1
        busy = other_running_tasks()
        if threads > 1 and busy is not None and busy > 0.75 * machine:
            log.warning("this machine is busy (%d other tasks running on %d cores); if this runs slowly, give it fewer "
                        "threads with --threads %d", busy, machine, max(1, min(cores, round(machine - busy))))
    torch.set_num_threads(threads)


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
                              help="CPU threads for the model [default: the cores this process may use, shared "
                                   "with the other ranks on the machine under torchrun; for score, annotate and "
                                   "rescore, one with a model of under a million parameters].")
batch_tokens_option = click.option("--batch-tokens", type=click.IntRange(min=1), default=ScoringOptions.batch_tokens,
                                   help="Target tokens per scoring batch.")
precision_option = click.option(
    "--precision", type=click.Choice(PRECISIONS), default=ScoringOptions.precision,
    help="fp32 on every device by default. bf16/fp16 (GPU only): autocast, so the decoder state and "
         "the output layer run in half precision and log p moves by 2.2-2.7e-3 (fp16) and 1.8-2.1e-2 (bf16) "
         "nats on average, up to 0.15 on one pair (docs/precision.md); only the log-softmax stays fp32. A CPU always scores in fp32.")
resume_option = click.option("--resume", is_flag=True,
                             help="Continue an interrupted run of the same command (starts afresh when there is nothing to resume).")
overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace OUTPUT if it exists (never when it is one of the inputs).")
moses_home_option = click.option("--moses-home", type=click.Path(file_okay=False), envvar="MOSES_HOME", default=None,
                                 help="Moses installation (bin/, scripts/) [default: $MOSES_HOME].")
model_option = click.option("-m", "--model", "model_dir", required=True, type=click.Path(file_okay=False),
                            help="Model directory made by 'phrase-scorer train'.")


# --- train ---------------------------------------------------------------------------------------


def training_options(function):
    """The options that say what model to train and how: shared by 'train' and 'ems-config'."""
    options = [
        click.option("--arch", type=click.Choice(list(ARCH_PRESETS)), default=TrainConfig.arch,
                     help="Architecture: the RNN Encoder-Decoder (Cho et al. 2014) or RNNsearch (Bahdanau et al. "
                          "2015). Resumed training keeps the saved one."),
        click.option("--preset", type=click.Choice(sorted({p for presets in ARCH_PRESETS.values() for p in presets})),
                     default=TrainConfig.preset,
                     help="Network size: the paper's, one that trains on a CPU in under an hour, or a toy for tests."),
        click.option("--source-shortlist", type=click.IntRange(min=1), default=None,
                     help="Source words kept [default: the preset's: 15000 for the encoder-decoder's paper preset, "
                          "30000 for RNNsearch's]."),
        click.option("--target-shortlist", type=click.IntRange(min=1), default=None,
                     help="Target words kept [default: the preset's: 15000 for the encoder-decoder's paper preset, "
                          "30000 for RNNsearch's]."),
        click.option("--recipe", type=click.Choice(list(RECIPES)), default=TrainConfig.recipe,
                     help="How to optimise: 'modern' (Adam, per-token label-smoothed loss, dropout, Glorot "
                          "initialisation, rate halved on validation plateaus) or 'paper' (the papers' Adadelta and "
                          "initialisations, for reproductions). The options below override single settings."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None, help="[default: the recipe's]"),
        click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Learning rate [default: the recipe's: 1e-3 for Adam, 1.0 for Adadelta]."),
        click.option("--lr-decay", type=click.FloatRange(min=0, max=1, min_open=True), default=None,
                     help="Rate times this after --lr-patience validations without improvement (1: never) [default: the recipe's]."),
        click.option("--lr-patience", type=click.IntRange(min=1), default=None, help="[default: the recipe's]"),
        click.option("--dropout", type=click.FloatRange(min=0, max=1, max_open=True), default=None,
                     help="Dropout on embeddings, encoder outputs and readout features, in training only [default: the recipe's]."),
        click.option("--label-smoothing", type=click.FloatRange(min=0, max=1, max_open=True), default=None,
                     help="[default: the recipe's]"),
        click.option("--loss", type=click.Choice(LOSSES), default=None,
                     help="Mean NLL per pair (the papers) or per target token [default: the recipe's]."),
        click.option("--init", type=click.Choice(INITS), default=None,
                     help="Initial weights: the papers' or Glorot-uniform [default: the recipe's]."),
        click.option("--batch-size", type=click.IntRange(min=1), default=TrainConfig.batch_size, help="Pairs per update."),
        click.option("--valid-pairs", type=click.IntRange(min=0), default=TrainConfig.valid_pairs,
                     help="About this many pairs are held out for validation, by source phrase."),
        click.option("--valid-every", type=click.IntRange(min=1), default=TrainConfig.valid_every,
                     help="Steps between validations and checkpoints."),
        click.option("--valid-metric", type=click.Choice(VALID_METRICS), default=None,
                     help="What picks the best weights, stops early and decays the rate: validation NLL per token, or "
                          "the BLEU of the validation translations (sentence pairs only) [default: bleu with --corpus, "
                          "else nll]."),
        click.option("--valid-beam", type=click.IntRange(min=1), default=TrainConfig.valid_beam,
                     help="Beam of the validation translations (1: greedy)."),
        click.option("--average-checkpoints", type=click.IntRange(min=0), default=TrainConfig.average_checkpoints,
                     metavar="K", help="When training stops, the mean of the weights of the last K validations "
                                       "becomes model.pt if it validates better than the best single weights (0: off)."),
        click.option("--patience", type=click.IntRange(min=1), default=TrainConfig.patience,
                     help="Stop after this many validations without improvement."),
        click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Stop after this many updates."),
        click.option("--max-epochs", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Stop after this many passes over the pairs."),
        click.option("--max-time", type=Duration(), default=None, help="Stop after this long (3600, 90m, 2h, ...)."),
        click.option("--clip-norm", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="Gradient-norm clipping threshold [default: the recipe's]."),
        click.option("--seed", type=int, default=TrainConfig.seed,
                     help="Random seed (initial weights, validation split, data order)."),
        device_option,
        click.option("--precision", type=click.Choice(TRAIN_PRECISIONS), default=TrainConfig.precision,
                     help="On a GPU: fp32, or bf16/fp16 autocast (products, GRU states and logits in half precision, "
                          "fp32 weights; auto: bf16 where supported, else fp16). A CPU always trains in fp32."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def make_training_settings(ctx: click.Context, settings: dict, resume: bool):
    """(TrainConfig, ModelConfig or None, the settings given explicitly) from training_options."""
    from dataclasses import replace

    names = [f.name for f in fields(TrainConfig)]
    explicit = set(explicit_options(ctx, names))
    config = TrainConfig(**{k: v for k, v in settings.items() if k in names})
    source_shortlist, target_shortlist = settings.get("source_shortlist"), settings.get("target_shortlist")
    model_config = None
    if source_shortlist or target_shortlist:  # on --resume, checked against the saved ones
        from phrase_scorer.train import preset_config

        base = preset_config(config)
        model_config = replace(base, source_shortlist=source_shortlist or base.source_shortlist,
                               target_shortlist=target_shortlist or base.target_shortlist)
    return config, model_config, explicit


@cli.command()
@click.argument("table", type=click.Path(dir_okay=False), required=False)
@click.option("--corpus", nargs=2, type=click.Path(exists=True, dir_okay=False), default=None, metavar="SRC TGT",
              help="Train on the sentence pairs of two aligned files (plain or gzip, tokenised) instead of a TABLE.")
@click.option("--dev", nargs=2, type=click.Path(exists=True, dir_okay=False), default=None, metavar="SRC TGT",
              help="With --corpus: validate on these sentence pairs [default: hold out about --valid-pairs training pairs].")
@click.option("--max-length", type=click.IntRange(min=1), default=None,
              help="With --corpus: leave out training pairs with a side longer than this many words (paper: 30 or 50) [default: no limit].")
@click.option("--right-to-left", is_flag=True, default=False,
              help="Read the target side last word first (a right-to-left model, a second opinion for rescoring). "
                   "The model keeps it: score, rescore, annotate and translate reverse the words for it by themselves.")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Model directory to create.")
@training_options
@threads_option
@click.option("--resume", is_flag=True, help="Continue an interrupted run from its last checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace a model already in the output folder.")
@click.pass_context
def train(ctx, table, corpus, dev, output, threads, resume, overwrite, **settings):
    """Train a model (--arch) on the unique phrase pairs of TABLE (plain or gzip), or on the
    sentence pairs of --corpus SRC TGT."""
    if (table is None) == (not corpus):
        raise UserError("give either a phrase TABLE or --corpus SRC TGT (not both)" if table else
                        "give a phrase TABLE or --corpus SRC TGT to train on")
    if dev and not corpus:
        raise UserError("--dev goes with --corpus (a phrase table's validation pairs are held out from it)")
    set_threads(threads)
    from phrase_scorer import distributed
    from phrase_scorer.data.sentence_pairs import SentenceCorpus

    if not distributed.world().is_main:  # under torchrun, rank 0 alone reports progress
        log.setLevel(max(log.getEffectiveLevel(), logging.WARNING))
        progress.show_bars = False
    from phrase_scorer.train import TrainingInterrupted, train as run_training

    config, model_config, explicit = make_training_settings(ctx, settings, resume)
    data = table
    data_args = table
    if corpus:
        data = SentenceCorpus(*corpus, *(dev or (None, None)))
        data_args = f"--corpus {' '.join(corpus)}" + (f" --dev {' '.join(dev)}" if dev else "")
    resume_command = f"phrase-scorer train {data_args} -o {output} --resume"
    try:
        state = run_training(data, output, config, resume=resume, overwrite=overwrite,
                             model_config=model_config, explicit=explicit)
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
@overwrite_option
@batch_tokens_option
@device_option
@threads_option
def score(model_dir, input, output, overwrite, batch_tokens, device, threads):
    """Print log p(target | source) (natural log) for each 'src ||| tgt' line of INPUT.

    INPUT may also be a whole phrase table; '-' reads stdin. One number per input line, in order.
    """
    from phrase_scorer.pair_scores import score_file
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    set_threads(threads, [loaded.model])
    score_file(input, output, loaded, ScoringOptions(batch_tokens=batch_tokens), overwrite=overwrite)


# --- annotate ------------------------------------------------------------------------------------


def parse_columns(ctx, param, value: str):
    return tuple(c.strip() for c in value.split(",") if c.strip())


def parse_weights(ctx, param, value):
    """``0.2,-0.2`` -> (0.2, -0.2); one number -> that number (for every new column)."""
    if value is None:
        return None
    try:
        weights = tuple(float(w) for w in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of numbers") from None
    return weights[0] if len(weights) == 1 else weights


def column_options(function):
    """The options that say which columns to append and how: shared by 'annotate' and 'ems-config'."""
    options = [
        click.option("--columns", default=",".join(COLUMNS), callback=parse_columns,
                     help="Columns to append: prob = p(y|x), unk = e^(number of unknown words)."),
        click.option("--unk-side", type=click.Choice(UNK_SIDES), default=AnnotateOptions.unk_side,
                     help="Whose words outside the model's shortlists the unk column counts."),
        click.option("--length-normalize/--no-length-normalize", default=AnnotateOptions.length_normalize,
                     help="Write exp(log p / (target words + 1)), p per target token, instead of p(y|x)."),
        click.option("--batch-tokens", type=click.IntRange(min=1), default=ScoringOptions.batch_tokens,
                     help="Target tokens per scoring batch."),
        click.option("--window-lines", type=click.IntRange(min=1), default=AnnotateOptions.window_lines,
                     help="Lines read, scored and written at a time (also the resume granularity)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@cli.command()
@click.argument("table", type=click.Path(dir_okay=False, allow_dash=True))
@model_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Annotated table ('.gz' for gzip, '-' for stdout).")
@column_options
@device_option
@precision_option
@threads_option
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Processes that read, check, format and compress the table beside the model "
                   "(0: none, all in one process) [default: the cores, at most 8].")
@resume_option
@overwrite_option
@click.option("--ini", "moses_ini", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Also write this moses.ini, patched for the new table, to --ini-output.")
@click.option("--ini-output", type=click.Path(dir_okay=False), default=None,
              help="Where --ini writes the patched moses.ini [default: OUTPUT's name + .moses.ini].")
def annotate(table, model_dir, output, columns, unk_side, length_normalize, batch_tokens, window_lines,
             device, precision, threads, workers, resume, overwrite, moses_ini, ini_output):
    """Append the model's p(y|x) and unknown-word columns to every line of TABLE.

    Under torchrun (torchrun --nproc-per-node N -m phrase_scorer annotate ...) every process
    annotates a part of TABLE and the parts are joined into OUTPUT, byte for byte what one
    process writes."""
    from phrase_scorer.annotate import annotate as run_annotate
    from phrase_scorer.device import resolve_device
    from phrase_scorer.distributed import device_for_rank, world
    from phrase_scorer.model_dir import load_model

    from phrase_scorer.io.outputs import check_output, writes_directly

    options = AnnotateOptions(columns=columns, unk_side=unk_side, length_normalize=length_normalize,
                              window_lines=window_lines)
    if moses_ini:  # checked before the long work, not after it
        if output == "-" and ini_output is None:
            raise PhraseScorerError("--ini needs --ini-output when the table goes to standard output")
        ini_output = ini_output or f"{output}.moses.ini"
        check_output(ini_output, [("the phrase table", table), ("the annotated table", output),
                                  ("the moses.ini", moses_ini)], overwrite=overwrite or resume,
                     what="the patched moses.ini")
        if not writes_directly(ini_output) and os.path.abspath(ini_output) == os.path.abspath(output):
            raise PhraseScorerError(f"--ini-output {ini_output} is the annotated table -o {output}",
                                    hint="write the patched moses.ini elsewhere")
    loaded = load_model(model_dir, device_for_rank(resolve_device(device)))
    set_threads(threads, [loaded.model])
    try:
        result = run_annotate(table, output, loaded, options,
                              ScoringOptions(batch_tokens=batch_tokens, precision=precision), resume=resume,
                              overwrite=overwrite, workers=workers)
    except KeyboardInterrupt:
        raise interrupted_resumable(output) from None
    if not world().is_main:  # under torchrun, rank 0 reports for the job
        return
    if result.already_finished:
        click.echo(f"{output} is already finished ({result.lines:,} lines, signature {output}.json): nothing to do",
                   err=True)
    else:
        click.echo(
            f"annotated {result.lines:,} lines in {result.seconds:.0f}s ({result.lines / max(result.seconds, 1e-9):,.0f} lines/s)"
            + ("" if writes_directly(output) else f": {output}, signature {output}.json"),
            err=True,
        )
    report_moses_change(result, output, moses_ini, ini_output)


def report_moses_change(result, output, moses_ini, ini_output) -> None:
    from phrase_scorer.config import COLUMNS, start_weights
    from phrase_scorer.io.moses_ini import format_weight

    before, after = result.num_scores_before, result.num_scores_after
    added = after - before
    columns = tuple(result.signature["columns"])
    weights = [format_weight(w) for w in start_weights(columns)]
    described = ", ".join(f"{c} {w}" for c, w in zip(columns, weights))
    if moses_ini:
        from phrase_scorer.io.moses_ini import patch_moses_ini

        target = ini_output or f"{output}.moses.ini"
        result = patch_moses_ini(moses_ini, target, phrase_table=os.path.abspath(output), add_features=added,
                                 initial_weights=start_weights(columns), absolute_paths=True, overwrite=True)
        click.echo(f"patched moses.ini written to {target}: {result.feature_name} num-features="
                   f"{result.new_num_features}, start weights of the new columns: {described}; re-tune before use",
                   err=True)
        return
    options = "" if columns == COLUMNS else f" --add-features {added} --initial-weights {','.join(weights)}"
    click.echo(
        "\nFor Moses, the phrase table now has {after} scores per line (was {before}). In moses.ini:\n"
        "  [feature]  PhraseDictionaryMemory ... num-features={after} path={path}\n"
        "  [weight]   TranslationModel0= <the {before} current weights> {extra}\n"
        "({described}: the unknown-word feature starts as a penalty), then re-tune.\n"
        "'phrase-scorer moses-ini MOSES_INI --phrase-table {path}{options} -o NEW_INI' makes this change.".format(
            after=after, before=before, path=os.path.abspath(output) if output != "-" else "TABLE",
            extra=" ".join(weights), described=described, options=options,
        ),
        err=True,
    )




# --- rescore ------------------------------------------------------------------------------------


@cli.command()
@click.argument("nbest", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--source", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="The sentences the n-best list was decoded from, one per line (plain or gzip).")
@click.option("-m", "--model", "models", multiple=True, type=click.Path(file_okay=False),
              help="Model scoring log p(hypothesis | source); repeatable, one feature each.")
@click.option("-r", "--reverse-model", "reverse_models", multiple=True, type=click.Path(file_okay=False),
              help="Model trained target->source, scoring log p(source | hypothesis); repeatable.")
@click.option("--name", "names", multiple=True,
              help="Feature name of each -m model, in order [default: RNN0, RNN1, ...].")
@click.option("--reverse-name", "reverse_names", multiple=True,
              help="Feature name of each --reverse-model, in order [default: RNNReverse0, ...].")
@click.option("--ensemble", default=None, metavar="NAME",
              help="Add the -m models as one feature NAME: the mean of their log p (one weight to tune).")
@click.option("--reverse-ensemble", default=None, metavar="NAME",
              help="Add the --reverse-model models as one feature NAME, the mean of their log p.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Rescored n-best list ('.gz' for gzip, '-' for stdout).")
@click.option("--normalize/--no-normalize", default=RescoreOptions.normalize,
              help="Write log p divided by the predicted tokens (words + 1) instead of log p.")
@batch_tokens_option
@click.option("--window-lines", type=click.IntRange(min=1), default=RescoreOptions.window_lines,
              help="About this many lines (whole sentences) read, scored and written at a time (also the resume granularity).")
@device_option
@precision_option
@threads_option
@resume_option
@overwrite_option
def rescore(nbest, source, models, reverse_models, names, reverse_names, ensemble, reverse_ensemble, output, normalize,
            batch_tokens, window_lines, device, precision, threads, resume, overwrite):
    """Append the models' log-probabilities to every line of a Moses n-best list NBEST.

    Each model adds one dense feature 'Name= value' (natural log, 6 significant digits), or
    each ensemble one, the mean of its models' log p; every other byte of the list is kept. '-'
    reads NBEST from stdin.
    """
    from phrase_scorer.rescore import feature_models, rescore as run_rescore
    from phrase_scorer.device import resolve_device

    loaded = feature_models(models, reverse_models, names, reverse_names, resolve_device(device), ensemble=ensemble,
                            reverse_ensemble=reverse_ensemble)
    set_threads(threads, [feature.loaded.model for feature in loaded])
    try:
        result = run_rescore(nbest, source, output, loaded, RescoreOptions(normalize=normalize, window_lines=window_lines),
                             ScoringOptions(batch_tokens=batch_tokens, precision=precision), resume=resume,
                             overwrite=overwrite)
    except KeyboardInterrupt:
        raise interrupted_resumable(output) from None
    click.echo(f"rescored {result.lines:,} lines in {result.seconds:.0f}s, features {', '.join(result.features)}"
               + ("" if output == "-" else f": {output}, signature {output}.json"), err=True)


# --- ems-config ----------------------------------------------------------------------------------


@cli.command("ems-config")
@click.argument("ini_in", metavar="IN", type=click.Path(dir_okay=False, exists=True))
@click.argument("ini_out", metavar="OUT", type=click.Path(dir_okay=False))
@click.option("-Binarizer", "binarizer", default=None, metavar="CMD",
              help="EMS's ttable-binarizer: '' or none for a text table, else processPhraseTableMin, "
                   "CreateProbingPT or CreateOnDiskPt with its path (its own arguments are replaced).")
@click.option("-m", "--model", "model_dir", type=click.Path(file_okay=False, exists=True), default=None,
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
    from phrase_scorer.experiments.ems import build_ems_config

    config, model_config, explicit = make_training_settings(ctx, settings, resume=False)
    training_given = sorted(set(explicit_options(ctx, settings)) - {"device", "precision"})
    if model_dir is not None and training_given:
        raise PhraseScorerError("--model takes a trained model: leave out the training options "
                                f"({', '.join('--' + n.replace('_', '-') for n in training_given)})")
    result = build_ems_config(
        ini_in, ini_out, binarizer=binarizer, model_dir=model_dir, train_config=config, model_config=model_config,
        explicit=explicit, feature_name=feature_name,
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


# --- moses-ini -----------------------------------------------------------------------------------


@cli.command("moses-ini")
@click.argument("moses_ini", type=click.Path(exists=True, dir_okay=False))
@click.option("--phrase-table", required=True, type=click.Path(),
              help="The new table, written into the feature's path= (the binary table with --binarize-from).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="The patched moses.ini to write ('-' for stdout).")
@click.option("--add-features", type=click.IntRange(min=0), default=2, help="Score columns added to the table.")
@click.option("--initial-weights", "--initial-weight", "initial_weights", callback=parse_weights, default=None,
              help="Start weights of the new columns until tuning, comma-separated, or one for all "
                   "[default: annotate's columns in order, prob 0.2, unk -0.2: the unknown-word count is a penalty].")
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
@overwrite_option
def moses_ini_command(moses_ini, phrase_table, output, add_features, initial_weights, feature_name,
                      absolute_paths, check_table, binarize_from, moses_home, overwrite):
    """Patch MOSES_INI for a phrase table with more score columns; then re-tune.

    Points the phrase-table feature at the new table, raises its num-features and appends the
    new columns' weights. Every other line is copied unchanged.
    """
    from phrase_scorer.io.moses_ini import patch_moses_ini

    result = patch_moses_ini(moses_ini, output, phrase_table=phrase_table, add_features=add_features,
                             initial_weights=initial_weights, feature_name=feature_name,
                             absolute_paths=absolute_paths, check_table=check_table,
                             binarize_from=binarize_from, moses_home=moses_home, overwrite=overwrite)
    if result.binarize_command:
        click.echo(f"binarised: {' '.join(result.binarize_command)}", err=True)
    click.echo(f"{result.feature_name} ({result.feature_type}): num-features {result.old_num_features} -> "
               f"{result.new_num_features}; {len(result.changes)} line(s) changed:", err=True)
    for change in result.changes:
        click.echo(f"  line {change.number}:\n    - {change.before}\n    + {change.after}", err=True)
    if output != "-":
        click.echo(f"wrote {output}; re-tune it with a fresh mert-moses.pl --working-dir", err=True)


# --- sample --------------------------------------------------------------------------------------


@cli.command()
@model_option
@click.argument("phrases", nargs=-1)
@click.option("-i", "--input", "input_file", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Read source phrases from this file, one per line ('-': stdin).")
@click.option("-n", "--samples", type=click.IntRange(min=1), default=SampleOptions.samples, help="Ancestral samples per source.")
@click.option("--top", type=click.IntRange(min=1), default=SampleOptions.top, help="Candidates shown per source.")
@click.option("--beam", type=click.IntRange(min=1), default=None, help="Beam search of this width instead of sampling.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=SampleOptions.temperature)
@click.option("--max-length", type=click.IntRange(min=1), default=SampleOptions.max_length, help="Most target words.")
@click.option("--seed", type=int, default=SampleOptions.seed)
@click.option("--lang", default="en", help="Language of the source phrases, for the tokenizer.")
@click.option("--tokenize/--no-tokenize", default=True,
              help="Tokenize and escape raw text as Moses does (--no-tokenize: phrases are already in table form).")
@click.option("--lowercase/--no-lowercase", default=None,
              help="Lowercase the input [default: when the model's source words have no capitals].")
@click.option("--allow-unk/--no-allow-unk", default=SampleOptions.allow_unk, help="May <unk> be generated?")
@click.option("--lm", "lm_path", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Target language model (ARPA or KenLM binary): adds its log-probability.")
@click.option("--rank-by", type=click.Choice(["model", "model+lm"]), default=SampleOptions.rank_by)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@device_option
@threads_option
def sample(model_dir, phrases, input_file, samples, top, beam, temperature, max_length, seed, lang, tokenize, lowercase,
           allow_unk, lm_path, rank_by, as_json, device, threads):
    """Propose target phrases for source PHRASES (raw text), ranked by log p(y|x) (paper, Table 3)."""
    set_threads(threads)
    import json

    from phrase_scorer.model_dir import load_model
    from phrase_scorer.sampling import SourcePreparer, TargetLanguageModel, display, propose
    from phrase_scorer.device import resolve_device

    sources = list(phrases)
    if input_file:
        sources += read_source_phrases(input_file)
    if not sources:
        raise PhraseScorerError("no source phrase given", hint='e.g. phrase-scorer sample -m MODEL "a man in a blue shirt"')
    loaded = load_model(model_dir, resolve_device(device))
    options = SampleOptions(samples=samples, top=top, beam=beam, temperature=temperature, max_length=max_length,
                            seed=seed, allow_unk=allow_unk, rank_by=rank_by)
    lm = TargetLanguageModel(lm_path) if lm_path else None
    preparer = SourcePreparer(loaded.source_vocab, lang=lang, tokenize=tokenize, lowercase=lowercase)
    results = propose(loaded, sources, options, preparer=preparer, language_model=lm)
    if as_json:
        click.echo(json.dumps([{
            "source": r.source, "words": r.words, "unknown_words": r.unknown_words,
            "candidates": [{"target": c.text, "display": display(c.words), "log_prob": c.log_prob, "count": c.count,
                            "complete": c.complete, **({"lm_log_prob": c.lm_log_prob} if lm else {})}
                           for c in r.candidates],
        } for r in results], ensure_ascii=False, indent=1))
        return
    for r in results:
        how = f"beam {beam}" if beam else f"{samples} samples"
        click.echo(f"{display(r.words)}    [{how}" + (f"; unknown: {' '.join(r.unknown_words)}" if r.unknown_words else "") + "]")
        for c in r.candidates:
            extra = f"  lm {c.lm_log_prob:8.3f}" if lm else ""
            seen = "" if beam else f"  x{c.count}"
            cut = "" if c.complete else "  (length limit)"
            click.echo(f"  {c.log_prob:8.3f}{extra}  {display(c.words)}{seen}{cut}")
        click.echo("")


def read_source_phrases(path: str) -> list:
    """The non-blank lines of ``path`` (``-``: stdin), as UTF-8 text."""
    from phrase_scorer.io.files import text_lines

    return [text for _, text in text_lines(path, hint="give the source phrases as UTF-8 text") if text.strip()]


# --- translate -----------------------------------------------------------------------------------


@cli.command()
@click.option("-m", "--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="Model directory made by 'phrase-scorer train': translate with it alone, by beam search.")
@click.argument("input", type=click.Path(dir_okay=False, allow_dash=True), default="-")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              help="Where to write the translations (a name ending in .gz is gzipped).")
@click.option("--beam", type=click.IntRange(min=1), default=TranslateOptions.beam, help="Beam width (1: greedy search).")
@click.option("--length-normalize/--no-length-normalize", default=TranslateOptions.length_normalize,
              help="Rank the ended hypotheses by log p per token (</s> included) instead of log p.")
@click.option("--max-length-ratio", type=click.FloatRange(min=0, min_open=True), default=TranslateOptions.max_length_ratio,
              help="A translation has at most ceil(RATIO * source words) words.")
@click.option("--batch-sentences", type=click.IntRange(min=1), default=TranslateOptions.batch_sentences,
              help="Sentences searched together.")
@click.option("--moses", "moses_ini", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Or: translate with this (tuned) moses.ini and --reranker: Moses' n-best lists, rescored by the "
                   "reranker's models and reranked by its weights.")
@click.option("--reranker", type=click.Path(dir_okay=False, exists=True), default=None,
              help="With --moses: the reranker 'rerank --dev ...' wrote (its OUTPUT.json).")
@click.option("--chunk-sentences", type=click.IntRange(min=1), default=TranslateOptions.chunk_sentences,
              help="With --moses: sentences decoded, rescored and reranked at a time (also the resume granularity).")
@click.option("--decoder-threads", type=click.IntRange(min=1), default=None,
              help="With --moses: the decoder's threads [default: all cores].")
@click.option("--working-dir", type=click.Path(file_okay=False), default=None,
              help="With --moses: for the chunk being translated, made fresh [default: OUTPUT.work].")
@resume_option
@overwrite_option
@device_option
@threads_option
@moses_home_option
def translate(model_dir, input, output, beam, length_normalize, max_length_ratio, batch_sentences, moses_ini, reranker,
              chunk_sentences, decoder_threads, working_dir, resume, overwrite, device, threads, moses_home):
    """Translate the tokenised sentences of INPUT (plain or gzip; '-': stdin) by beam search with
    a model (-m), or with the whole tuned system (--moses INI --reranker RERANKER).

    One output line per input line, in order: the words joined by single spaces, tokenised as the
    model's target vocabulary holds them (like Moses' output). <unk> is never generated; source
    words outside the model's shortlist are read as <unk>. An empty line gives an empty line.
    """
    set_threads(threads)
    from phrase_scorer.device import resolve_device

    if (model_dir is None) == (moses_ini is None):
        raise UserError("give -m MODEL (the model alone) or --moses INI --reranker RERANKER (the whole system)")
    if moses_ini is not None:
        if reranker is None:
            raise UserError("--moses needs --reranker (the OUTPUT.json of 'rerank --dev ...')")
        if output == "-" or input == "-":
            raise UserError("--moses translates a named INPUT into a named -o OUTPUT (resumable, with a signature)")
        from phrase_scorer.moses.installation import MosesInstallation
        from phrase_scorer.reranked_translation import translate_reranked

        try:
            result = translate_reranked(input, output, ini=moses_ini, reranker=reranker,
                                        moses=MosesInstallation.find(moses_home), device=resolve_device(device),
                                        chunk_sentences=chunk_sentences, threads=decoder_threads,
                                        working_dir=working_dir, resume=resume, overwrite=overwrite)
        except KeyboardInterrupt:
            raise interrupted_resumable(output) from None
        click.echo(f"translated {result.sentences:,} sentences in {result.seconds:.0f}s: {output}, signature "
                   f"{output}.json", err=True)
        return
    if reranker is not None or resume:
        raise UserError("--reranker and --resume go with --moses")
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.translate import translate_file

    loaded = load_model(model_dir, resolve_device(device))
    options = TranslateOptions(beam=beam, length_normalize=length_normalize, max_length_ratio=max_length_ratio,
                               batch_sentences=batch_sentences)
    translate_file(input, output, loaded, options, overwrite=overwrite)


# --- compare and plot ----------------------------------------------------------------------------


@cli.command()
@model_option
@click.argument("table", type=click.Path(dir_okay=False, exists=True))
@click.option("--frequent", type=click.IntRange(min=0), default=5, help="Long sources with the largest counts.")
@click.option("--rare", type=click.IntRange(min=0), default=5, help="Long sources with the smallest counts.")
@click.option("--source", "sources", multiple=True, help="Show this source phrase (as the table writes it); repeatable.")
@click.option("--top", type=click.IntRange(min=1), default=3, help="Targets shown per source and side.")
@click.option("--min-words", type=click.IntRange(min=1), default=4, help="Shortest source considered.")
@click.option("--min-targets", type=click.IntRange(min=1), default=3, help="Fewest targets a source must have.")
@click.option("--table-column", type=click.IntRange(min=0), default=2,
              help="Score column of the table to rank by (2: p(e|f), the direct translation probability).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of Markdown.")
@device_option
@threads_option
def compare(model_dir, table, frequent, rare, sources, top, min_words, min_targets, table_column, as_json, device, threads):
    """Top targets of long source phrases by the table and by the model (paper, Table 2)."""
    set_threads(threads)
    from phrase_scorer.analysis.compare import CompareOptions, compare as run_compare, to_json, to_markdown
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.sampling import display
    from phrase_scorer.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    options = CompareOptions(min_words=min_words, min_targets=min_targets, top=top, frequent=frequent, rare=rare,
                             table_column=table_column)
    result = run_compare(table, loaded, options, sources)
    click.echo(to_json(result) if as_json else to_markdown(result, display=lambda s: display(s.split())))


@cli.group()
def plot():
    """Figures: model against table scores (Fig. 3), maps of representations (Figs. 4-5), and
    RNNsearch's soft alignments."""


@plot.command("scores")
@click.argument("table", type=click.Path(dir_okay=False, exists=True))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
@click.option("--table-column", type=click.IntRange(min=0), default=0, help="Table score on the x axis (0: p(f|e)).")
@click.option("--model-column", type=click.IntRange(min=0), default=None,
              help="The model's p(y|x) column [default: from the table's signature, else the second last].")
@click.option("--max-points", type=click.IntRange(min=2), default=2_000_000, help="Plot a uniform sample of this many pairs.")
@click.option("--seed", type=int, default=1)
@overwrite_option
def plot_scores(table, output, table_column, model_column, max_points, seed, overwrite):
    """Density of model log p(y|x) against a table score for an annotated TABLE."""
    from phrase_scorer.analysis.plots import plot_scores as run
    from phrase_scorer.io.outputs import check_output

    check_output(output, [("the table", table)], overwrite=overwrite, what="the figure")

    names = {0: "log p(f|e)", 1: "log lex(f|e)", 2: "log p(e|f)", 3: "log lex(e|f)"}
    stats = run(table, output, table_column=table_column, model_column=model_column, max_points=max_points, seed=seed,
                table_label=f"{names.get(table_column, f'log column {table_column}')}, phrase table")
    click.echo(f"{output}: {stats.points:,} of {stats.lines:,} pairs; correlation of model and table scores: "
               f"Pearson {stats.pearson:.3f}, Spearman {stats.spearman:.3f}")


@plot.command("embeddings")
@model_option
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG file to write.")
@click.option("--html", "html_output", type=click.Path(dir_okay=False), default=None,
              help="Also write an interactive page (hover to read labels).")
@click.option("--kind", type=click.Choice(["words", "phrases"]), default="words",
              help="Word embeddings e(x) (Fig. 4) or phrase representations c (Fig. 5).")
@click.option("--table", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Phrase table to take source phrases from (for --kind phrases).")
@click.option("--words", type=click.IntRange(min=5), default=1000, help="Most frequent source words to map.")
@click.option("--phrases", type=click.IntRange(min=5), default=2000, help="Source phrases to map.")
@click.option("--min-words", type=click.IntRange(min=1), default=4, help="Shortest phrase mapped.")
@click.option("--method", type=click.Choice(["auto", "tsne", "umap"]), default="auto",
              help="auto: UMAP where installed, else t-SNE.")
@click.option("--labels", type=click.IntRange(min=0), default=60, help="Points labelled in the PNG.")
@click.option("--seed", type=int, default=1)
@overwrite_option
@device_option
def plot_embeddings(model_dir, output, html_output, kind, table, words, phrases, min_words, method, labels, seed,
                    overwrite, device):
    """A 2-D map of the model's word or phrase representations."""
    from phrase_scorer.analysis.plots import plot_embeddings as run
    from phrase_scorer.io.outputs import check_output, model_files, same_file
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.device import resolve_device

    inputs = [("the table", table), *model_files(model_dir)]
    check_output(output, inputs, overwrite=overwrite, what="the figure")
    if html_output is not None:
        if os.path.abspath(html_output) == os.path.abspath(output) or same_file(html_output, output):
            raise UserError(f"--html {html_output} is the figure -o {output}: give it another name")
        check_output(html_output, inputs, overwrite=overwrite, what="the page")

    loaded = load_model(model_dir, resolve_device(device))
    result = run(loaded, output, kind=kind, table=table, words=words, phrases=phrases, min_words=min_words,
                 method=method, seed=seed, labels=labels, html_output=html_output)
    click.echo(f"{output}: {result.method} map of {result.points:,} {kind}" + (f"; {html_output}" if html_output else ""))


@plot.command("alignments")
@model_option
@click.option("--source", "source", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Tokenised source sentences (plain or gzip), one per line.")
@click.option("--target", "target", required=True, type=click.Path(dir_okay=False, exists=True),
              help="Their translations, line n translating line n: references or 'translate' output.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="OUT.png: each pair is drawn into OUT-LINE.png.")
@click.option("--lines", default=None, help="Plot these lines (numbers from 1, comma-separated), e.g. 1,5,9.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Without --lines: plot this many pairs drawn at random (fixed by --seed) [default: 4].")
@click.option("--seed", type=int, default=1)
@click.option("--max-words", type=click.IntRange(min=1), default=30,
              help="Longest side plotted; --count draws among the pairs within it.")
@overwrite_option
@device_option
def plot_alignments(model_dir, source, target, output, lines, count, seed, max_words, overwrite, device):
    """Heat maps of an RNNsearch model's soft alignments (Bahdanau et al. 2015, Fig. 3).

    For each chosen pair of SOURCE and TARGET, one PNG: the weight alpha_ij of source word j
    (along the top) when the model predicts target word i (down the left, then </s>), fed the
    TARGET words, in grey scale from black (0) to white (1). An encoder-decoder model has no
    alignment and is refused.
    """
    from phrase_scorer.analysis.alignments import DEFAULT_COUNT, parse_line_numbers, plot_alignments as run
    from phrase_scorer.device import resolve_device
    from phrase_scorer.io.outputs import model_files
    from phrase_scorer.model_dir import load_model

    if lines is not None and count is not None:
        raise UserError("give --lines or --count, not both")
    numbers = parse_line_numbers(lines) if lines is not None else None
    loaded = load_model(model_dir, resolve_device(device))
    plots = run(loaded, source, target, output, lines=numbers, count=count or DEFAULT_COUNT, seed=seed,
                max_words=max_words, overwrite=overwrite, inputs=[("the source", source), ("the target", target),
                                                                  *model_files(model_dir)])
    for p in plots:
        click.echo(f"{p.png}: line {p.pair.line}, {len(p.pair.source)} source and {len(p.pair.target)} target words")


# --- Moses: tune, evaluate, experiment -------------------------------------------------------------


def tune_options(function):
    """The mert-moses.pl options shared by 'tune' and 'experiment'."""
    options = [
        click.option("--method", type=click.Choice(["mert", "mira"]), default=TuneOptions.method,
                     help="MERT or batch MIRA (PRO is left out: mert-moses.pl downloads it at run time)."),
        click.option("--max-iterations", type=click.IntRange(min=1), default=TuneOptions.max_iterations),
        click.option("--return-best-dev/--return-last", default=TuneOptions.return_best_dev,
                     help="Keep the iteration with the best dev BLEU, or the last one."),
        click.option("--threads", type=click.IntRange(min=1), default=None, help="Decoder threads [default: all cores]."),
        click.option("--decoder-flags", default=TuneOptions.decoder_flags,
                     help="More decoder options, e.g. '-v 0 -search-algorithm 1 -s 400'."),
        click.option("--nbest", type=click.IntRange(min=1), default=TuneOptions.nbest),
        click.option("--decoder", default=TuneOptions.decoder, help="Decoder program in MOSES_HOME/bin."),
        click.option("--mertdir", type=click.Path(file_okay=False, exists=True), default=None,
                     help="Folder of mert's programs (extractor, mert, kbmira, pro, evaluator) [default: MOSES_HOME/bin]."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def make_tune_options(method, max_iterations, return_best_dev, threads, decoder_flags, nbest, decoder, mertdir,
                      seed=1):
    return TuneOptions(method=method, max_iterations=max_iterations, return_best_dev=return_best_dev, seed=seed,
                       threads=threads, decoder_flags=decoder_flags, nbest=nbest, decoder=decoder, mertdir=mertdir)


@cli.command()
@click.argument("moses_ini", type=click.Path(dir_okay=False, exists=True))
@click.option("--dev", nargs=2, required=True, type=click.Path(dir_okay=False, exists=True),
              help="Dev source and reference (tokenised as the system's training data; plain or gzip).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the tuned moses.ini.")
@click.option("--working-dir", type=click.Path(file_okay=False), default=None,
              help="mert-moses.pl's working directory, made fresh [default: OUTPUT.work].")
@click.option("--seed", type=int, default=TuneOptions.seed, help="Seed of the optimiser's random restarts.")
@overwrite_option
@tune_options
@moses_home_option
def tune(moses_ini, dev, output, working_dir, seed, overwrite, moses_home, **options):
    """Re-tune MOSES_INI's weights with the user's mert-moses.pl."""
    from phrase_scorer.io.outputs import check_output
    from phrase_scorer.moses.installation import MosesInstallation
    from phrase_scorer.moses.tune import tune as run_tune

    check_output(output, [("the moses.ini", moses_ini), ("the dev source", dev[0]), ("the dev reference", dev[1])],
                 overwrite=overwrite, what="the tuned moses.ini", regular_only=True)
    result = run_tune(moses_ini, dev[0], dev[1], output, moses=MosesInstallation.find(moses_home),
                      options=make_tune_options(seed=seed, **options), working_dir=working_dir)
    history = ", ".join(f"{it}: {bleu:.2f}" for it, bleu in result.iterations)
    click.echo(f"tuned config: {output} (dev BLEU by iteration: {history}; "
               f"kept: {'?' if result.dev_bleu is None else f'{result.dev_bleu:.2f}'})", err=True)


@cli.command()
@click.option("--dev", nargs=2, default=None, type=click.Path(dir_okay=False, exists=True),
              help="Dev n-best list (rescored; plain or gzip) and its references (tokenised like the output): "
                   "tune the weights on it.")
@click.option("--weights", "reranker", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Or: apply a reranker tuned before (the OUTPUT.json of a 'rerank --dev' run), without Moses.")
@click.option("--test", "test_nbest", required=True, type=click.Path(dir_okay=False, exists=True, allow_dash=True),
              help="Test n-best list with the same features, to rerank.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="Where to write the test set's new 1-best, one line per sentence; when tuning, the reranker "
                   "(weights and models) goes to OUTPUT.json.")
@click.option("--ini", "start_ini", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The decoder's moses.ini: its [weight] section gives the starting weights "
                   "[default: fitted to the dev list's totals].")
@click.option("--method", type=click.Choice(["mert", "mira"]), default=RerankOptions.method,
              help="Moses' mert or kbmira (batch MIRA).")
@click.option("--seed", "seeds", type=int, multiple=True, default=RerankOptions.seeds,
              help="One optimiser run per seed (repeatable); the run best on dev is kept.")
@click.option("--restarts", type=click.IntRange(min=0), default=RerankOptions.restarts,
              help="mert's random starting points per run.")
@click.option("--iterations", "mira_iterations", type=click.IntRange(min=1), default=RerankOptions.mira_iterations,
              help="kbmira's epochs per run.")
@click.option("--threads", type=click.IntRange(min=1), default=RerankOptions.threads, help="mert's threads.")
@click.option("--working-dir", type=click.Path(file_okay=False), default=None,
              help="For the extractor's files and the optimiser runs, made fresh [default: OUTPUT.work].")
@click.option("--mertdir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder of extractor, mert and kbmira [default: MOSES_HOME/bin].")
@click.option("--ignore-feature", "ignore_features", multiple=True,
              help="A dense feature of the lists to leave out, neither tuned nor used (repeatable).")
@click.option("--decoder-flags", default=None,
              help="The decoder options the n-best lists were made with, recorded in the reranker.")
@overwrite_option
@moses_home_option
def rerank(dev, reranker, test_nbest, output, start_ini, method, seeds, restarts, mira_iterations, threads, working_dir,
           mertdir, ignore_features, decoder_flags, overwrite, moses_home):
    """Tune the weights of every feature of a rescored dev n-best list with Moses' optimisers,
    then write the best hypothesis of each sentence of the test n-best list; or, with --weights,
    apply weights tuned before to a new list."""
    from phrase_scorer.io.outputs import check_output, refuse_existing
    from phrase_scorer.moses.installation import MosesInstallation
    from phrase_scorer.moses.rerank import apply_reranker, rerank as run_rerank

    if (dev is None) == (reranker is None):
        raise UserError("give --dev NBEST REFERENCES (to tune) or --weights RERANKER (to apply one), not both")
    if reranker is not None:
        tuning_only = {"--ini": start_ini, "--working-dir": working_dir, "--mertdir": mertdir,
                       "--decoder-flags": decoder_flags, "--ignore-feature": ignore_features or None}
        given = [name for name, value in tuning_only.items() if value is not None]
        if given:
            raise UserError(f"{', '.join(given)} only apply when tuning (--dev); the reranker holds what it was tuned with")
        check_output(output, [("the test n-best list", test_nbest), ("the reranker", reranker)], overwrite=overwrite)
        sentences = apply_reranker(reranker, test_nbest, output)
        click.echo(f"test 1-best: {output} ({sentences} sentences), weights from {reranker}", err=True)
        return
    inputs = [("the dev n-best list", dev[0]), ("the dev references", dev[1]), ("the test n-best list", test_nbest),
              ("the moses.ini", start_ini)]
    check_output(output, inputs, overwrite=overwrite, companions=(".part", ".json"), what="the reranked output",
                 regular_only=True)
    if os.path.exists(output + ".json") and not overwrite:
        refuse_existing(output + ".json", what="the reranker written beside the output")

    moses = MosesInstallation.find(moses_home) if moses_home or not mertdir else None
    options = RerankOptions(method=method, seeds=tuple(seeds), restarts=restarts, mira_iterations=mira_iterations,
                            threads=threads, mertdir=mertdir, ignore_features=tuple(ignore_features))
    result = run_rerank(dev[0], dev[1], test_nbest, output, moses=moses, options=options, start_ini=start_ini,
                        working_dir=working_dir, decoder_flags=decoder_flags)
    runs = ", ".join(f"seed {r.seed}: {r.dev_bleu:.2f}" for r in result.runs)
    click.echo(f"dev BLEU {result.start_dev_bleu:.2f} with the starting weights; after {method}: {runs}; "
               f"kept seed {result.best_seed}", err=True)
    click.echo(f"test 1-best: {output} ({result.sentences} sentences); reranker in {output}.json "
               f"(rerank --weights {output}.json --test NBEST -o OUT applies it to another list)", err=True)


@cli.command()
@click.argument("moses_ini", type=click.Path(dir_okay=False, exists=True))
@click.option("--test", nargs=2, required=True, type=click.Path(dir_okay=False, exists=True),
              help="Test source (tokenised as for the system) and reference (tokenised or raw).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Where to keep the decoder output [default: MOSES_INI's name + .test.hyp].")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]), default=ExperimentOptions.references,
              help="Tokenised references are compared as they are (--tokenize none); raw ones after detokenising "
                   "the output with sacremoses. auto: tokenised if they carry Moses escapes.")
@click.option("--lang", default=ExperimentOptions.lang, help="Target language (for detokenising).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Decoder threads [default: all cores].")
@click.option("--decoder-flags", default="", help="More decoder options.")
@click.option("--decoder", default=TuneOptions.decoder, help="Decoder program in MOSES_HOME/bin.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@overwrite_option
@moses_home_option
def evaluate(moses_ini, test, output, references, lang, threads, decoder_flags, decoder, as_json, overwrite, moses_home):
    """Decode a test set with MOSES_INI and report sacrebleu BLEU and chrF with their signatures."""
    import json

    from phrase_scorer.io.outputs import check_output
    from phrase_scorer.moses.evaluate import evaluate as run_evaluate
    from phrase_scorer.moses.installation import MosesInstallation

    output = output or f"{moses_ini}.test.hyp"
    check_output(output, [("the moses.ini", moses_ini), ("the test source", test[0]), ("the test reference", test[1])],
                 overwrite=overwrite, companions=(".part", ".input", ".log"), what="the decoder output", regular_only=True)
    result = run_evaluate(moses_ini, test[0], test[1], output,
                          moses=MosesInstallation.find(moses_home), threads=threads, decoder_flags=decoder_flags,
                          decoder=decoder, kind=references, lang=lang)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=1))
    else:
        click.echo(f"BLEU {result.bleu:.2f}  ({result.bleu_signature})")
        click.echo(f"chrF {result.chrf:.2f}  ({result.chrf_signature})")
        click.echo(f"{result.sentences} sentences, {result.references} references; output in {result.hypotheses_path}")


def check_report(report: Optional[str], overwrite: bool, inputs) -> None:
    """An experiment's --report is checked before hours of tuning, not when it is written."""
    if report is not None:
        from phrase_scorer.io.outputs import check_output

        check_output(report, inputs, overwrite=overwrite, what="the report")


@cli.command()
@click.argument("moses_ini", type=click.Path(dir_okay=False, exists=True))
@click.option("-m", "--model", "model_dir", type=click.Path(file_okay=False), default=None,
              help="Model to annotate the system's phrase table with.")
@click.option("--annotated", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Or: the system's phrase table already annotated (both columns).")
@click.option("--dev", nargs=2, required=True, type=click.Path(dir_okay=False, exists=True), help="Dev source and reference.")
@click.option("--test", nargs=2, required=True, type=click.Path(dir_okay=False, exists=True), help="Test source and reference.")
@click.option("-o", "--output", "work_dir", required=True, type=click.Path(file_okay=False),
              help="Working directory (resumable: finished tuning runs are kept).")
@click.option("--runs", type=click.IntRange(min=1), default=ExperimentOptions.runs, help="Tuning runs per system.")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]), default=ExperimentOptions.references)
@click.option("--lang", default=ExperimentOptions.lang, help="Target language.")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Also write the Markdown report here.")
@click.option("--system", "systems", multiple=True, type=click.Choice([s.name for s in SYSTEMS]),
              help="Tune and report only this system (repeatable) [default: all three].")
@click.option("--overwrite", is_flag=True, help="Replace an existing --report file.")
@tune_options
@moses_home_option
def experiment(moses_ini, model_dir, annotated, dev, test, work_dir, runs, references, lang, report, systems, overwrite,
               moses_home, **options):
    """The paper's Table 1: baseline, + p(y|x), + p(y|x) + unknown words, each tuned --runs times."""
    from phrase_scorer.experiments.table1 import run_experiment
    from phrase_scorer.moses.installation import MosesInstallation

    if (model_dir is None) == (annotated is None):
        raise PhraseScorerError("give exactly one of --model and --annotated")
    check_report(report, overwrite, [("the moses.ini", moses_ini), ("the annotated table", annotated),
                                     ("the dev source", dev[0]), ("the dev reference", dev[1]),
                                     ("the test source", test[0]), ("the test reference", test[1])])
    result = run_experiment(moses_ini, dev, test, work_dir, moses=MosesInstallation.find(moses_home),
                            model_dir=model_dir, annotated=annotated, tune_options=make_tune_options(**options),
                            options=ExperimentOptions(runs=runs, references=references, lang=lang),
                            systems=[s for s in SYSTEMS if not systems or s.name in systems])
    if report:
        from phrase_scorer.io.files import write_text_atomically

        write_text_atomically(report, result.markdown)
    click.echo(result.markdown)


@cli.command("rescore-experiment")
@click.argument("moses_ini", type=click.Path(dir_okay=False, exists=True))
@click.option("--dev", nargs=2, required=True, type=click.Path(dir_okay=False, exists=True),
              help="Dev source and reference: the optimiser tunes on its n-best list.")
@click.option("--test", "tests", nargs=2, multiple=True, required=True, type=click.Path(dir_okay=False, exists=True),
              help="A test source and reference (repeatable).")
@click.option("--dev-nbest", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The dev n-best list, already decoded with MOSES_INI [default: decode it].")
@click.option("--test-nbest", "test_nbests", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="The n-best list of each --test, in their order, already decoded with MOSES_INI.")
@click.option("-m", "--model", "models", multiple=True, metavar="NAME=DIR",
              help="A model scoring the hypothesis given the source, as feature NAME (repeatable; models given "
                   "the same NAME are an ensemble: one feature, the mean of their log p).")
@click.option("-r", "--reverse-model", "reverse_models", multiple=True, metavar="NAME=DIR",
              help="A target-to-source model scoring the source given the hypothesis, as feature NAME (repeatable).")
@click.option("--row", "rows", multiple=True, metavar="LABEL=NAME[,NAME...]",
              help="A system of the report: the decoder's features plus these (repeatable) "
                   "[default: one row per model and one with all].")
@click.option("--system", "systems", multiple=True, metavar="LABEL=MOSES_INI[,MOSES_INI...]",
              help="Another decoder system in the report (e.g. Moses with the phrase columns, as `experiment` "
                   "tunes it): the tuned moses.ini of each of its tuning runs, each decoded and scored as a run "
                   "(repeatable).")
@click.option("-o", "--output", "work_dir", required=True, type=click.Path(file_okay=False),
              help="Working directory (the lists, the runs, report.md and results.json); resumable.")
@click.option("--nbest-size", type=click.IntRange(min=1), default=RescoreExperimentOptions.nbest_size,
              help="Distinct hypotheses per sentence.")
@click.option("--runs", type=click.IntRange(min=1), default=RescoreExperimentOptions.runs,
              help="Optimiser runs per row (seeds 1..RUNS).")
@click.option("--method", type=click.Choice(["mert", "mira"]), default=RescoreExperimentOptions.method,
              help="Moses' mert or kbmira (batch MIRA).")
@click.option("--restarts", type=click.IntRange(min=0), default=RescoreExperimentOptions.restarts,
              help="mert's random starting points per run.")
@click.option("--normalize/--no-normalize", default=RescoreExperimentOptions.normalize,
              help="Features are log p per predicted token (words + </s>) instead of log p.")
@click.option("--references", type=click.Choice(["auto", "tokenized", "raw"]), default=RescoreExperimentOptions.references)
@click.option("--lang", default=RescoreExperimentOptions.lang, help="Target language.")
@click.option("--decoder-threads", type=click.IntRange(min=1), default=None,
              help="Threads of the decoder and of mert [default: all cores].")
@click.option("--decoder-flags", default=RescoreExperimentOptions.decoder_flags, help="More decoder options.")
@click.option("--decoder", default=RescoreExperimentOptions.decoder, help="Decoder program in MOSES_HOME/bin.")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Also write the Markdown report here.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --report file.")
@batch_tokens_option
@device_option
@precision_option
@threads_option
@moses_home_option
def rescore_experiment(moses_ini, dev, tests, dev_nbest, test_nbests, models, reverse_models, rows, systems, work_dir, nbest_size,
                       runs, method, restarts, normalize, references, lang, decoder_threads, decoder_flags, decoder,
                       report, overwrite, batch_tokens, device, precision, threads, moses_home):
    """What rescoring MOSES_INI's n-best lists with sentence models buys: decode dev and test
    n-best lists, rescore them, re-tune and rerank each row --runs times, and report BLEU, chrF
    and paired bootstrap tests against Moses' 1-best."""
    set_threads(threads)
    from phrase_scorer.device import resolve_device
    from phrase_scorer.moses.installation import MosesInstallation
    from phrase_scorer.rescore import ensembles_by_name, feature_models
    from phrase_scorer.experiments.rescoring import EvalSet, parse_row, parse_system, run_rescore_experiment, set_name

    if test_nbests and len(test_nbests) != len(tests):
        raise PhraseScorerError(f"{len(test_nbests)} --test-nbest for {len(tests)} --test",
                                hint="give one --test-nbest per --test, in the same order, or none")
    check_report(report, overwrite, [("the moses.ini", moses_ini), ("the dev source", dev[0]),
                                     ("the dev reference", dev[1]), ("the dev n-best list", dev_nbest),
                                     *[("a test file", path) for pair in tests for path in pair],
                                     *[("a test n-best list", path) for path in test_nbests]])
    sets = [EvalSet(set_name(dev[0]), dev[0], dev[1], dev_nbest)]
    sets += [EvalSet(set_name(src), src, ref, test_nbests[i] if test_nbests else None) for i, (src, ref) in enumerate(tests)]

    def named(values, option):
        pairs = []
        for value in values:
            name, sep, directory = value.partition("=")
            if not sep or not name or not directory:
                raise PhraseScorerError(f"{option} {value!r} is not NAME=DIR", hint=f"e.g. {option} RNNsearch=models/rnnsearch")
            pairs.append((name, directory))
        return pairs

    forward, reverse = named(models, "--model"), named(reverse_models, "--reverse-model")
    if not forward and not reverse:
        raise PhraseScorerError("no model given", hint="pass --model NAME=DIR (and/or --reverse-model NAME=DIR)")
    loaded = feature_models([d for _, d in forward], [d for _, d in reverse], [n for n, _ in forward],
                            [n for n, _ in reverse], resolve_device(device))
    loaded = ensembles_by_name(loaded)
    options = RescoreExperimentOptions(
        nbest_size=nbest_size, decoder=decoder, decoder_flags=decoder_flags, threads=decoder_threads,
        normalize=normalize, runs=runs, method=method, restarts=restarts, references=references, lang=lang)
    result = run_rescore_experiment(moses_ini, sets, work_dir, moses=MosesInstallation.find(moses_home), models=loaded,
                                    rows=[parse_row(r) for r in rows], systems=[parse_system(d) for d in systems],
                                    options=options,
                                    scoring_options=ScoringOptions(batch_tokens=batch_tokens, precision=precision))
    if report:
        from phrase_scorer.io.files import write_text_atomically

        write_text_atomically(report, result.markdown)
    click.echo(result.markdown)


def main() -> None:
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `phrase-scorer score ... | head` ends quietly
    cli(prog_name="phrase-scorer")


if __name__ == "__main__":
    main()
