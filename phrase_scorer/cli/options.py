"""Options shared by several verbs, each with its one default (from phrase_scorer.config)."""

from __future__ import annotations

import math
from dataclasses import fields

import click

from phrase_scorer.config import (
    ARCH_PRESETS, COLUMNS, INITS, LOSSES, OPTIMIZERS, PRECISIONS, RECIPES, TRAIN_PRECISIONS, UNK_SIDES, VALID_METRICS,
    CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, MAX_SHORTLIST, AnnotateOptions, ScoringOptions, TrainConfig,
    TuneOptions, VOCABULARIES,
)
from phrase_scorer.cli.group import Duration, explicit_options
from phrase_scorer.errors import PhraseScorerError


def parameter_name(param: click.Parameter) -> str:
    """How the command line names a parameter: an option by its long flag, an argument by its metavar."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def refuse_empty(value, param: click.Parameter, what: str = "a file name") -> None:
    """An empty name given for a file or folder is an error naming the option: it is what an unset
    shell variable gives (``-o "$OUT"``), and would otherwise be read as the current folder or
    fail deep inside a verb."""
    if isinstance(value, (str, bytes)) and not value:
        raise PhraseScorerError(f"{parameter_name(param)} is empty", hint=f"an unset shell variable? give {what}")


#: The largest whole number an option takes where the option sets no smaller bound: what a C int
#: holds, the type of the counts and seeds that torch, numpy and Moses' programs take.
COUNT_LIMIT = 2**31 - 1
#: The most threads an option asks for: more than any machine this runs on has cores
#: (torch.set_num_threads overflows at 2^31; a million threads is a typo, not a setting).
PARALLEL_LIMIT = 1024
#: The most processes an option starts (worker processes, training ranks), each loading torch and
#: a model: 8 workers already read and write faster than a GPU scores
#: (runtime/workers.default_workers), and a thousand ranks hold a thousand copies of a model.
PROCESS_LIMIT = 64


class FiniteFloat(click.FloatRange):
    """The type of every option that takes a fraction: a finite float within the range's bounds.
    ``float()`` reads 'nan', 'inf', '1e400' and 400 nines (both infinity), and a range lets NaN
    through (it compares false with every bound): refused here, with the option's own flag."""

    name = "number"

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        """The range as the help and the errors write it, its ends short (3.40282e+38)."""
        low = "" if self.min is None else f"{self.min:g}{'<' if self.min_open else '<='}"
        high = "" if self.max is None else f"{'<' if self.max_open else '<='}{self.max:g}"
        if not low and not high:
            return "any finite number"
        if not low:
            return f"x{high}"
        if not high:
            return f"x{'>' if self.min_open else '>='}{self.min:g}"
        return f"{low}x{high}"


class Count(click.IntRange):
    """The type of every whole-number option: :class:`click.IntRange`, and never above ``limit``
    (:data:`COUNT_LIMIT` unless the option names a smaller one), so a number no program takes is
    refused with the option's flag rather than overflowing deep inside a verb."""

    def __init__(self, min=None, max=None, min_open=False, max_open=False, clamp=False, *,
                 limit: int = COUNT_LIMIT, what: str = "") -> None:
        super().__init__(min, max, min_open, max_open, clamp)
        self.limit, self.what = limit, what

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number > self.limit:
            self.fail(f"{number} is too large: at most {self.limit}{' ' + self.what if self.what else ''}",
                      param, ctx)
        return number


#: The most lines a window of ``annotate`` or ``rescore`` holds: its lines are in memory whole,
#: and 50 times the default window is still a small part of a table or a list, as the rule that
#: memory stays flat as inputs grow asks.
WINDOW_LIMIT = 1_000_000
#: Lines per window (:data:`WINDOW_LIMIT`).
WINDOW = Count(min=1, limit=WINDOW_LIMIT, what="lines (a window is held in memory whole)")
#: A random seed: what torch, numpy, ``mert -r`` and ``kbmira --random-seed`` all take.
SEED = Count(min=0)
#: Threads (:data:`PARALLEL_LIMIT`).
PARALLEL = Count(min=1, limit=PARALLEL_LIMIT, what="threads")
#: Processes (:data:`PROCESS_LIMIT`).
PROCESSES = Count(min=1, limit=PROCESS_LIMIT, what="processes")


def distinct(ctx, param, values):
    """The values of a repeated option, each given once: a value given twice is refused naming it
    (``--seed 1 --seed 1`` would run the same thing twice into the same folder)."""
    seen = set()
    for value in values or ():
        if value in seen:
            raise click.BadParameter(f"{value!r} is given twice; give each value once", ctx, param)
        seen.add(value)
    return values


def decoder_flags_value(ctx, param, value):
    """``--decoder-flags``, refused at the parser when Moses may not be given them
    (:mod:`phrase_scorer.moses.decoder_flags`: options that write or read files of their own)."""
    from phrase_scorer.moses.decoder_flags import check_decoder_flags

    check_decoder_flags(value)
    return value


def distinct_names(ctx, param, values):
    """``NAME=DIR`` values (:class:`NamedDirectory`), each name given once: a second ``forward=``
    would replace the first without a word."""
    given = {}
    for name, directory in values or ():
        if name in given:
            raise click.BadParameter(f"{name!r} is given twice ({name}={given[name]}, {name}={directory}); "
                                     "give each name once", ctx, param)
        given[name] = directory
    return values


class PathName(click.Path):
    """The type of every file and folder name a verb takes: :class:`click.Path`, and never empty
    (:func:`refuse_empty`)."""

    def convert(self, value, param, ctx):
        refuse_empty(value, param, "a file name" if self.file_okay or not self.dir_okay else "a folder name")
        return super().convert(value, param, ctx)


device_option = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=TrainConfig.device,
                             help="Where to run the model.")
threads_option = click.option("--threads", type=PARALLEL, default=None,
                              help="CPU threads for the model [default: the cores this process may use, shared "
                                   "with the other ranks on the machine under torchrun; for score, annotate and "
                                   "rescore, one with a model of under a million parameters].")
batch_tokens_option = click.option(
    "--batch-tokens", type=Count(min=1), default=ScoringOptions.batch_tokens,
    help=f"Target tokens per scoring batch [default: {CPU_BATCH_TOKENS} on a CPU, {GPU_BATCH_TOKENS} on a GPU, "
         f"where a larger batch pays: {GPU_BATCH_TOKENS} rescored 1.4-2.1 times as fast as {CPU_BATCH_TOKENS} on "
         "an H100 and an H200 (docs/benchmarks.md, 'On a GPU')]. Recorded in the output's signature.")
precision_option = click.option(
    "--precision", type=click.Choice(PRECISIONS), default=ScoringOptions.precision,
    help="fp32 on every device by default. bf16/fp16 (GPU only; a CPU runs them in fp32): autocast, so the "
         "decoder state and the output layer run in half precision and log p moves by 2.2-2.7e-3 (fp16) and "
         "1.8-2.1e-2 (bf16) nats on average, up to 0.15 on one pair (docs/precision.md); only the log-softmax "
         "stays fp32. int8 (CPU only): the output layer's product in 8-bit integers, everything else fp32 "
         "(docs/precision.md, 'int8').")
resume_option = click.option("--resume", is_flag=True,
                             help="Continue an interrupted run of the same command (starts afresh when there is "
                                  "nothing to resume).")
overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace OUTPUT if it exists (never when it is one of the inputs).")
moses_home_option = click.option("--moses-home", type=PathName(file_okay=False), envvar="MOSES_HOME", default=None,
                                 help="Moses installation (bin/, scripts/) [default: $MOSES_HOME].")


def workers_option(work: str):
    """``--workers``: the processes that do a command's per-line ``work`` beside its model(s)
    (runtime/workers.default_workers when not given)."""
    return click.option("--workers", type=Count(min=0, limit=PROCESS_LIMIT, what="processes"), default=None,
                        help=f"Processes that {work} (0: none, all in one process) [default: the cores, at most 8].")


model_option = click.option("-m", "--model", "model_dir", required=True, type=PathName(file_okay=False),
                            help="Model directory made by 'phrase-scorer train'.")


def training_number(name: str) -> FiniteFloat:
    """The type of the training setting ``name``'s flag: the range the settings check
    (``TrainConfig.NUMBERS``, their one home), an infinite end left open."""
    low, high, low_open, high_open = TrainConfig.NUMBERS[name]
    return FiniteFloat(min=low, max=None if math.isinf(high) else high, min_open=low_open, max_open=high_open)


def training_options(function):
    """The options that say what model to train and how: shared by 'train' and 'ems-config'."""
    options = [
        click.option("--arch", type=click.Choice(list(ARCH_PRESETS)), default=TrainConfig.arch,
                     help="Architecture: the RNN Encoder-Decoder (Cho et al. 2014), RNNsearch (Bahdanau et al. "
                          "2015) or a Transformer (Vaswani et al. 2017). Resumed training keeps the saved one."),
        click.option("--preset", type=click.Choice(sorted({p for presets in ARCH_PRESETS.values() for p in presets})),
                     default=TrainConfig.preset,
                     help="Network size: the paper's (the Transformer's: its base model), one that trains on a CPU in "
                          "under an hour, or a toy for tests."),
        click.option("--source-shortlist", type=Count(min=1, max=MAX_SHORTLIST), default=None,
                     help="Source words kept [default: the preset's: 15000 for the encoder-decoder's paper preset, "
                          "30000 for RNNsearch's]."),
        click.option("--target-shortlist", type=Count(min=1, max=MAX_SHORTLIST), default=None,
                     help="Target words kept [default: the preset's: 15000 for the encoder-decoder's paper preset, "
                          "30000 for RNNsearch's]."),
        click.option("--vocabulary", type=click.Choice(VOCABULARIES), default=TrainConfig.vocabulary,
                     help="What the model reads: whole words (the shortlists), or subword pieces learnt by "
                          "sentencepiece from the training words, byte-pair encoding or the unigram model, as many "
                          "as the shortlists' words. Every command still takes and writes words."),
        click.option("--recipe", type=click.Choice(list(RECIPES)), default=None,
                     help="How to optimise: 'modern' (Adam, per-token label-smoothed loss, dropout, Glorot "
                          "initialisation, rate halved on validation plateaus), 'transformer' (the same with a "
                          "linear warm-up to a higher rate that then falls as 1/sqrt(update), and more dropout) or "
                          "'paper' (the papers' Adadelta and initialisations, for reproductions). The options below "
                          "override single settings [default: 'transformer' for the Transformer, else 'modern']."),
        click.option("--warmup", type=Count(min=0), default=None, metavar="UPDATES",
                     help="Updates of linear warm-up to --lr, after which the rate falls as 1/sqrt(update) "
                          "(0: a constant rate) [default: the recipe's]."),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=None, help="[default: the recipe's]"),
        click.option("--lr", type=training_number("lr"), default=None,
                     help="Learning rate [default: the recipe's: 1e-3 for Adam, 1.0 for Adadelta]."),
        click.option("--lr-decay", type=training_number("lr_decay"), default=None,
                     help="Rate times this after --lr-patience validations without improvement (1: never) "
                          "[default: the recipe's]."),
        click.option("--lr-patience", type=Count(min=1), default=None, help="[default: the recipe's]"),
        click.option("--dropout", type=training_number("dropout"), default=None,
                     help="Dropout on embeddings, encoder outputs and readout features, in training only "
                          "[default: the recipe's]."),
        click.option("--label-smoothing", type=training_number("label_smoothing"), default=None,
                     help="[default: the recipe's]"),
        click.option("--loss", type=click.Choice(LOSSES), default=None,
                     help="Mean NLL per pair (the papers) or per target token [default: the recipe's]."),
        click.option("--init", type=click.Choice(INITS), default=None,
                     help="Initial weights: the papers' or Glorot-uniform [default: the recipe's]."),
        click.option("--batch-size", type=Count(min=1, max=MAX_SHORTLIST), default=TrainConfig.batch_size,
                     help="Pairs per update."),
        click.option("--valid-pairs", type=Count(min=0), default=TrainConfig.valid_pairs,
                     help="About this many pairs are held out for validation, by source phrase (0: none; the "
                          "training NLL then picks the best weights)."),
        click.option("--valid-every", type=Count(min=1), default=TrainConfig.valid_every,
                     help="Steps between validations and checkpoints."),
        click.option("--valid-metric", type=click.Choice(VALID_METRICS), default=None,
                     help="What picks the best weights, stops early and decays the rate: validation NLL per token, or "
                          "the BLEU of the validation translations (sentence pairs only) [default: bleu with --corpus, "
                          "else nll]."),
        click.option("--valid-beam", type=Count(min=1, max=MAX_SHORTLIST), default=TrainConfig.valid_beam,
                     help="Beam of the validation translations (1: greedy)."),
        click.option("--average-checkpoints", type=Count(min=0), default=TrainConfig.average_checkpoints,
                     metavar="K", help="When training stops, the mean of the weights of the last K validations becomes "
                                       "model.pt if it validates better than the best single weights (0: off)."),
        click.option("--patience", type=Count(min=1), default=TrainConfig.patience,
                     help="Stop after this many validations without improvement."),
        click.option("--max-steps", type=Count(min=1), default=None, help="Stop after this many updates."),
        click.option("--max-epochs", type=training_number("max_epochs"), default=None,
                     help="Stop after this many passes over the pairs."),
        click.option("--max-time", type=Duration(positive=True), default=None,
                     help="Stop after this long (3600, 90m, 2h, ...)."),
        click.option("--clip-norm", type=training_number("clip_norm"), default=None,
                     help="Gradient-norm clipping threshold [default: the recipe's]."),
        click.option("--seed", type=SEED, default=TrainConfig.seed,
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
        from phrase_scorer.config import preset_config

        base = preset_config(config)
        model_config = replace(base, source_shortlist=source_shortlist or base.source_shortlist,
                               target_shortlist=target_shortlist or base.target_shortlist)
    return config, model_config, explicit


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
    if not all(map(math.isfinite, weights)):
        raise click.BadParameter(f"{value!r} holds a number that is not finite")
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
        batch_tokens_option,
        click.option("--window-lines", type=WINDOW, default=AnnotateOptions.window_lines,
                     help="Lines read, scored and written at a time (also the resume granularity)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def tune_options(function):
    """The mert-moses.pl options shared by 'tune' and 'experiment'."""
    options = [
        click.option("--method", type=click.Choice(["mert", "mira"]), default=TuneOptions.method,
                     help="MERT or batch MIRA (PRO is left out: mert-moses.pl downloads it at run time)."),
        click.option("--max-iterations", type=Count(min=1), default=TuneOptions.max_iterations),
        click.option("--return-best-dev/--return-last", default=TuneOptions.return_best_dev,
                     help="Keep the iteration with the best dev BLEU, or the last one."),
        click.option("--threads", type=PARALLEL, default=None,
                     help="Decoder threads [default: all cores]."),
        click.option("--decoder-flags", default=TuneOptions.decoder_flags, callback=decoder_flags_value,
                     help="More decoder options, e.g. '-v 0 -search-algorithm 1 -s 400'."),
        click.option("--nbest", type=Count(min=1), default=TuneOptions.nbest),
        click.option("--decoder", default=TuneOptions.decoder, help="Decoder program in MOSES_HOME/bin."),
        click.option("--mertdir", type=PathName(file_okay=False, exists=True), default=None,
                     help="Folder of mert's programs (extractor, mert, kbmira, pro, evaluator) "
                          "[default: MOSES_HOME/bin]."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def make_tune_options(settings: dict, seed: int = TuneOptions.seed) -> TuneOptions:
    """The values of :func:`tune_options` (parameter name -> value, each a field of TuneOptions)
    and the optimiser's ``seed`` as one object."""
    return TuneOptions(seed=seed, **settings)


class LabelledList(click.ParamType):
    """``LABEL=ITEM[,ITEM...]`` -> (label, items): the label may hold anything but the last ``=``."""

    def __init__(self, form: str, example: str) -> None:
        self.name = form
        self.example = example

    def items(self, value: str, param, ctx):
        label, sep, names = value.rpartition("=")
        items = tuple(n.strip() for n in names.split(",") if n.strip())
        if not sep or not label.strip() or not items:
            self.fail(f"{value!r} is not {self.name} (e.g. '{self.example}')", param, ctx)
        return label.strip(), items


class RowType(LabelledList):
    """A row of the rescoring report: ``LABEL=FEATURE,FEATURE`` -> the rescoring features it adds."""

    def __init__(self) -> None:
        super().__init__("LABEL=FEATURE[,FEATURE...]", "RNNsearch, both directions=RNNsearch,RNNsearchReverse")

    def convert(self, value, param, ctx):
        from phrase_scorer.experiments.system_steps import Row

        return value if isinstance(value, Row) else Row(*self.items(value, param, ctx))


class SystemType(LabelledList):
    """A decoder system: ``LABEL=INI[,INI...]``, a tuned moses.ini per run, each an existing file."""

    def __init__(self) -> None:
        super().__init__("LABEL=MOSES_INI[,MOSES_INI...]",
                         "Moses + phrase columns=exp/rnn+wp/run-1/tuned.ini,exp/rnn+wp/run-2/tuned.ini")

    def convert(self, value, param, ctx):
        from phrase_scorer.experiments.rescore_experiment import DecodedSystem

        if isinstance(value, DecodedSystem):
            return value
        label, inis = self.items(value, param, ctx)
        existing = PathName(exists=True, dir_okay=False)
        return DecodedSystem(label, tuple(existing.convert(ini, param, ctx) for ini in inis))


class NamedDirectory(click.ParamType):
    """``NAME=DIR`` -> (name, directory)."""

    name = "NAME=DIR"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        name, sep, directory = value.partition("=")
        if sep and name:
            refuse_empty(directory, param, "a folder name")
        if not sep or not name or not directory:
            self.fail(f"{value!r} is not NAME=DIR (e.g. RNNsearch=models/rnnsearch)", param, ctx)
        return name, directory
