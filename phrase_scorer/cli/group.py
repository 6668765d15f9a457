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
from typing import Iterator, Optional, Sequence, Tuple

import click

from phrase_scorer import __version__
from phrase_scorer.runtime import progress, resources
from phrase_scorer.runtime.supervisor import TERMINATION_SIGNALS  # what ends a run as Ctrl-C does
from phrase_scorer.errors import PhraseScorerError, Setting, Text, one_line, rendered


log = logging.getLogger("phrase_scorer")


class UserError(click.ClickException):
    """A PhraseScorerError (or an interruption) as click reports it: one line, no traceback."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(one_line(message))
        self.exit_code = exit_code  # type: ignore[misc]  # click declares one for the class; each has its own

    def show(self, file=None) -> None:
        try:
            click.echo(f"phrase-scorer: error: {self.format_message()}", err=True)
        except OSError:  # standard error is gone (a closed terminal: SIGHUP): nobody reads the line
            pass


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


def verb_command(verb: Sequence[str]) -> Optional[click.Command]:
    """The command of ``verb``, the names that call it (``("rescore",)``, ``("plot", "embeddings")``;
    ``()``: the group itself); None if the command line has no such verb."""
    command: click.Command = cli
    for name in verb:
        if not isinstance(command, click.Group) or name not in command.commands:
            return None
        command = command.commands[name]
    return command


def running_verb() -> Optional[Tuple[str, ...]]:
    """The names of the verb this command line runs now (``("plot", "embeddings")``; ``()`` while the
    group parses its own options); None outside it: a library caller, or another program's click
    command calling the library."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.find_root().command is not cli:
        return None
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return tuple(reversed(names))


def flag(setting: Setting, verb: Optional[Sequence[str]] = None) -> str:
    """How the command line writes ``setting`` (a :class:`~phrase_scorer.errors.Setting`): the flag
    of the option whose parameter is the setting, read from the options of the verb ``verb``
    (default: the one running, :func:`running_verb`) or of the setting's own verb where it names
    one, with the value if it has one; the longest flag (``--model``), the shortest where the
    setting asks for it (``-m``), a negative flag (``--no-tokenize``) for False. A setting the verb
    has no option for, or any setting outside the command line, keeps the library's spelling
    (``name=value``): a message never names a flag its verb does not have. Every error and logged
    message a command shows names its settings this way (:func:`shown`, :class:`FlagFormatter`)."""
    if verb is None:
        verb = running_verb()
    if verb is None:
        return str(setting)
    command = verb_command(tuple(setting.verb.split()) if setting.verb else verb)
    option = next((p for p in command.params if isinstance(p, click.Option) and p.name == setting.name
                   and not p.hidden), None) if command is not None else None  # a hidden option: not the verb's own
    if option is None or (setting.value is False and not option.secondary_opts):
        return str(setting)
    if setting.value is False:
        return max(option.secondary_opts, key=len)
    text = min(option.opts, key=len) if setting.short else max(option.opts, key=len)
    return text if setting.value is True or setting.value is None else f"{text} {setting.value}"


def shown(value: object, verb: Optional[Sequence[str]] = None) -> str:
    """``value`` as the command line shows it: the settings a library message names (a
    :class:`~phrase_scorer.errors.Text`, a setting or an error) as the flags of the verb ``verb``
    (default: the one running, :func:`flag`)."""
    return rendered(value, lambda one: flag(one, verb))


class FlagFormatter(logging.Formatter):
    """A log line with the settings its arguments name written as flags (:func:`shown`), on one
    line whatever the names in it hold (:func:`~phrase_scorer.errors.one_line`; a traceback
    logged with it keeps its lines). Pickled (a child process's copy), it keeps the verb that ran
    when it was, whose flags the child's lines name."""

    verb: Optional[Tuple[str, ...]] = None  # the verb whose flags it writes; None: the one running

    def __getstate__(self) -> dict:
        return {**self.__dict__, "verb": self.verb if self.verb is not None else running_verb()}

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, Text) or (isinstance(record.args, tuple) and record.args):
            args = tuple(self._shown(a) for a in record.args) if isinstance(record.args, tuple) else record.args
            record = logging.makeLogRecord({**record.__dict__, "msg": self._shown(record.msg), "args": args})
        return super().format(record)

    def _shown(self, value: object) -> object:
        return shown(value, self.verb) if isinstance(value, (Text, Setting, PhraseScorerError)) else value


def shown_error(exc: BaseException) -> Optional[UserError]:
    """A library error, or running out of memory, disk, open files or processes
    (:func:`~phrase_scorer.runtime.resources.exhausted`), as the one line the command line shows,
    naming the running verb's flags; None for any other exception."""
    if isinstance(exc, PhraseScorerError):
        return UserError(shown(exc))
    if isinstance(exc, (OSError, MemoryError, RuntimeError, SystemError)):
        error = resources.exhausted(exc)
        if error is not None:
            return UserError(shown(error))
    return None


class Verb(click.Command):
    """A verb: its errors are made the line shown while it still runs (its options' checks at the
    parser included), so that the settings they name are written as its own flags (:func:`flag`)."""

    def parse_args(self, ctx, args):
        with shown_as_this_verbs():
            return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with shown_as_this_verbs():
            return super().invoke(ctx)


@contextlib.contextmanager
def shown_as_this_verbs():
    """Make an error raised inside it the line shown, while the verb's context is the current one."""
    try:
        yield
    except (PhraseScorerError, OSError, MemoryError, RuntimeError, SystemError) as exc:
        error = shown_error(exc)
        if error is None:
            raise
        raise error from None


class Verbs(click.Group):
    """A group of verbs inside the command line (``plot``)."""

    command_class = Verb


class Group(click.Group):
    command_class = Verb
    group_class = Verbs

    def invoke(self, ctx):
        from phrase_scorer.io.output_lock import held_output_locks, release_output_locks

        held_before = held_output_locks()  # a caller's own, kept
        with ending_like_ctrl_c(), resources.checked_before_torch():
            try:
                return super().invoke(ctx)
            except PhraseScorerError as exc:  # raised before a verb ran (its options' values)
                raise UserError(shown(exc)) from None
            except click.ClickException as exc:  # the parser's own errors: one line too (a group's help is no error)
                if not isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                    exc.message = one_line(exc.message)
                raise
            except KeyboardInterrupt:
                raise interrupted() from None
            except (OSError, MemoryError, RuntimeError, SystemError) as exc:  # unanticipated: still one line
                from phrase_scorer.io.os_errors import describe_os_error

                error = shown_error(exc)  # memory, disk, open files, processes: named with the limit
                if error is not None:
                    raise error from None
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
