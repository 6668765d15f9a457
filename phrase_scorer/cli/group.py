"""The command group, its error handling and logging, and the option types every verb shares."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import sys
import threading
from typing import Iterator, Optional

import click

from phrase_scorer import __version__
from phrase_scorer.runtime import progress, resources
from phrase_scorer.errors import PhraseScorerError, Setting, Text, one_line, rendered


log = logging.getLogger("phrase_scorer")


class UserError(click.ClickException):
    """A PhraseScorerError (or an interruption) as click reports it: one line, no traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(one_line(message))
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        try:
            click.echo(f"phrase-scorer: error: {self.format_message()}", err=True)
        except OSError:  # standard error is gone (a closed terminal: SIGHUP): nobody reads the line
            pass


#: The signals that end a run as Ctrl-C does: what a scheduler (Slurm), ``kill`` or a closed
#: terminal sends.
TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(KeyboardInterrupt):
    """A termination signal (:data:`TERMINATION_SIGNALS`), raised where Ctrl-C raises
    KeyboardInterrupt: every clean-up of an interrupted run applies to it unchanged."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


def _terminate(number: int, frame) -> None:
    for other in TERMINATION_SIGNALS:  # the first one ends the run; its clean-up is not interrupted
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(number)


@contextlib.contextmanager
def ending_like_ctrl_c() -> Iterator[None]:
    """While a command runs, a termination signal ends it exactly as Ctrl-C does (the same
    clean-up, kept partial output and message, :func:`interrupted`) instead of killing the
    process where it stands. A signal that was ignored when the command started (``nohup``)
    stays ignored, and a handler of the caller's own is kept; the handlers are restored after.
    A rank of a job of several processes (torchrun) keeps the default: a rank waiting in a
    collective runs no Python handler, and its launcher ends the job with SIGTERM then SIGKILL
    after a grace period, which a handler would only lengthen (its output stays resumable)."""
    from phrase_scorer.runtime.distributed import world

    previous = {}
    if threading.current_thread() is threading.main_thread() and not world().is_distributed:
        for number in TERMINATION_SIGNALS:
            if signal.getsignal(number) is signal.SIG_DFL:
                previous[number] = signal.signal(number, _terminate)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def interrupted(rest: str = "") -> UserError:
    """The error that ends a run interrupted by Ctrl-C or a termination signal (called while
    handling its KeyboardInterrupt): ``interrupted`` + ``rest``, exit status 130 for Ctrl-C; for a
    termination signal it names the signal and exits with 128 + its number, as a shell reports a
    process the signal killed, so that a scheduler still sees how the run ended."""
    exc = sys.exc_info()[1]
    if isinstance(exc, Terminated):
        return UserError(f"interrupted by {signal.Signals(exc.number).name}{rest}", exit_code=128 + exc.number)
    return UserError(f"interrupted{rest}", exit_code=130)


#: The flags whose spelling is not ``--`` + the setting's library name with ``-`` for ``_``, as the
#: options declare them: setting -> (short flag or None, long flag).
FLAGS = {
    "model": ("-m", "--model"),
    "reverse_model": ("-r", "--reverse-model"),
    "output": ("-o", "--output"),
    "input": ("-i", "--input"),
    "samples": ("-n", "--samples"),
    "model_dir": ("-m", "--model"),
    "models": ("-m", "--model"),
    "reverse_models": ("-r", "--reverse-model"),
    "model_kinds": (None, "--models"),
    "names": (None, "--name"),
    "reverse_names": (None, "--reverse-name"),
    "sources": (None, "--source"),
    "seeds": (None, "--seed"),
    "ignore_features": (None, "--ignore-feature"),
    "language_model": (None, "--lm"),
    "binarizer": (None, "-Binarizer"),
}


def flag(setting: Setting) -> str:
    """How the command line writes ``setting`` (a :class:`~phrase_scorer.errors.Setting`): its
    flag, with the value if it has one. Every error and logged message a command shows names its
    settings this way (:func:`shown`, :class:`FlagFormatter`)."""
    short_flag, long_flag = FLAGS.get(setting.name, (None, "--" + setting.name.replace("_", "-")))
    text = short_flag if setting.short and short_flag else long_flag
    if setting.value is True or setting.value is None:
        return text
    if setting.value is False:
        return "--no-" + long_flag[2:]
    return f"{text} {setting.value}"


def shown(value: object) -> str:
    """``value`` as the command line shows it: the settings a library message names (a
    :class:`~phrase_scorer.errors.Text`, a setting or an error) as their flags."""
    return rendered(value, flag)


class FlagFormatter(logging.Formatter):
    """A log line with the settings its arguments name written as flags (:func:`shown`), on one
    line whatever the names in it hold (:func:`~phrase_scorer.errors.one_line`; a traceback
    logged with it keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, Text) or (isinstance(record.args, tuple) and record.args):
            args = tuple(map(_shown_argument, record.args)) if isinstance(record.args, tuple) else record.args
            record = logging.makeLogRecord({**record.__dict__, "msg": _shown_argument(record.msg), "args": args})
        return super().format(record)


def _shown_argument(value: object) -> object:
    return shown(value) if isinstance(value, (Text, Setting, PhraseScorerError)) else value


class Group(click.Group):
    def invoke(self, ctx):
        from phrase_scorer.io.output_lock import held_output_locks, release_output_locks

        held_before = held_output_locks()  # a caller's own, kept
        with ending_like_ctrl_c(), resources.checked_before_torch():
            try:
                return super().invoke(ctx)
            except PhraseScorerError as exc:
                raise UserError(shown(exc)) from None
            except click.ClickException as exc:  # the parser's own errors: one line too (a group's help is no error)
                if not isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                    exc.message = one_line(exc.message)
                raise
            except KeyboardInterrupt:
                raise interrupted() from None
            except (OSError, MemoryError, RuntimeError, SystemError) as exc:  # unanticipated: still one line
                from phrase_scorer.io.os_errors import describe_os_error

                error = resources.exhausted(exc)  # memory, disk, open files, processes: named with the limit
                if error is not None:
                    raise UserError(shown(error)) from None
                if not isinstance(exc, OSError):
                    raise
                raise UserError(str(describe_os_error(exc, exc.filename or "output"))) from None
            finally:  # the outputs the command claimed and did not release (phrase_scorer.io.outputs)
                release_output_locks(keep=held_before)


class Duration(click.ParamType):
    """Seconds, or a duration such as 90s, 30m, 2h, 1h30m."""

    name = "duration"

    def __init__(self, positive: bool = False) -> None:
        self.positive = positive  # refuse 0 (a run that stops before its first step)

    _PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
    _UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)) and math.isfinite(value):
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
        if not math.isfinite(total):  # float() of 400 nines is infinity: no time a run can stop at
            self.fail(f"{value!r} is not a finite duration", param, ctx)
        if self.positive and total <= 0:
            self.fail(f"{value!r} is no time at all; give a positive duration (a run that stops before its first "
                      "step writes no model)", param, ctx)
        return total


def interrupted_resumable(output: str) -> UserError:
    """Ctrl-C or a termination signal during a resumable run (:func:`interrupted`): say whether a
    finished part was kept for --resume."""
    from phrase_scorer.io.paths import part_path

    if output != "-" and os.path.exists(f"{part_path(output)}.json"):
        return interrupted("; the finished part is kept. Resume with the same command and --resume")
    return interrupted(" before the first chunk was finished; nothing kept, run the command again")


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FlagFormatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("phrase_scorer")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


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
