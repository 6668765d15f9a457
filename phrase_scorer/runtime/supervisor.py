"""Child processes, supervised: the one place that starts the package's own processes, polls
them, passes a signal on to those still running, stops the rest after a failure, names how one
ended, and, on a child's side, leaves when the process that started it is gone.

Three kinds of children run under it, each with its own rule for what a failure means:

* tasks side by side (:mod:`phrase_scorer.runtime.side_by_side`): Python functions, each in a
  process of its own (``build-reranker``'s trainings);
* the ranks of a training run on this machine (:func:`phrase_scorer.runtime.distributed.launch_local`,
  ``train --processes N``), with the environment torchrun would give them;
* the worker processes of a :class:`~phrase_scorer.runtime.workers.WorkerPool` (``annotate``,
  ``score``, ``rescore``), started with ``spawn`` and the run's signals blocked.

External programs (Moses, mert, the binarisers) are not children of this kind: they run through
:mod:`phrase_scorer.runtime.programs` and ``moses/streaming.py``, which only name how they ended
(:func:`how_it_ended`). In this package a "job" is an output being written
(:class:`~phrase_scorer.runtime.job.OutputJob`); a process started here is a "child".

The signals that end a run are listed once: :data:`TERMINATION_SIGNALS` (what a scheduler,
``kill`` or a closed terminal sends) and :data:`RUN_SIGNALS` (those and Ctrl-C's SIGINT).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

#: The signals that end a run as Ctrl-C does: what a scheduler (Slurm), ``kill`` or a closed
#: terminal sends (the command line ends a run the same way for each: :mod:`phrase_scorer.cli.group`).
TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
#: The signals that end a whole run: Ctrl-C's SIGINT and the termination signals. A terminal or a
#: scheduler sends them to every process of the run; workers leave them to the parent.
RUN_SIGNALS = (signal.SIGINT, *TERMINATION_SIGNALS)

POLL_SECONDS = 0.2  # how often the children are polled
PARENT_CHECK_SECONDS = 1.0  # how often a child looks whether the process that started it is still there


# --- how a child ended ---------------------------------------------------------------------------


def signal_name(number: int) -> Optional[str]:
    """The name of signal ``number`` (``SIGKILL``), None for a number the platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def killing_signal(exitcode: Optional[int]) -> Optional[int]:
    """The signal that killed a child that ended with ``exitcode`` (negative: the signal), if any."""
    return -exitcode if exitcode is not None and exitcode < 0 else None


def how_it_ended(exitcode: Optional[int]) -> str:
    """How a process that stopped ended, from its exit code (negative: the signal that killed it)."""
    if exitcode is None:
        return "stopped answering"
    if exitcode >= 0:
        return f"exited with status {exitcode}"
    number = -exitcode
    name = signal_name(number)
    if name is None:
        return f"was killed by signal {number}"
    if number == getattr(signal, "SIGKILL", None):
        name += ": out of memory?"  # what the kernel's OOM killer sends
    return f"was killed by signal {number} ({name})"


# --- a child's side ------------------------------------------------------------------------------


def leave_when_parent_gone(parent: int, stop_signal: Optional[int] = None) -> None:
    """In a child: once the process ``parent`` (the pid of the one that started it) is gone, which
    a parent killed outright (SIGKILL) could not say, send this process ``stop_signal`` (it stops
    as on that signal: a training after its current step, with a checkpoint), or, with None, leave
    at once, even while blocked in a read. Watched by a daemon thread."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        if stop_signal is None:
            os._exit(1)
        os.kill(os.getpid(), stop_signal)

    threading.Thread(target=watch, name="phrase-scorer-parent-watch", daemon=True).start()


# --- children started as commands ----------------------------------------------------------------


class Children:
    """Child processes started together (each a command, ``subprocess.Popen``), supervised together.

    Used as a context manager: a child still running when the block ends (an error, the children
    not all started) is killed and reaped, so none is left behind. The caller keeps its own rule
    for a failure; the children record what this process did to them, so that a child a signal
    from elsewhere ended can be told apart (:meth:`killed_from_elsewhere`)."""

    def __init__(self) -> None:
        self.processes: List[subprocess.Popen] = []
        self.sent: Set[int] = set()  # the signals passed on to every child still running
        self.stopped: Set[int] = set()  # the children this process stopped one by one

    def start(self, argv: Sequence[str], **options: Any) -> subprocess.Popen:
        child = subprocess.Popen(list(argv), **options)
        self.processes.append(child)
        return child

    def running(self) -> bool:
        """Whether any child still runs (every child is polled)."""
        return any([child.poll() is None for child in self.processes])

    def exitcodes(self) -> List[Optional[int]]:
        return [child.returncode for child in self.processes]

    def first_failed(self) -> Optional[int]:
        """The first child (by index) that ended with a non-zero status, as last polled."""
        return next((k for k, child in enumerate(self.processes) if child.returncode), None)

    def pass_on(self, number: int) -> None:
        """Send signal ``number`` to every child still running (once per signal this process got)."""
        self.sent.add(number)
        for child in self.processes:
            if child.poll() is None:
                child.send_signal(number)

    def stop(self, k: int, at_once: bool = False) -> None:
        """Stop child ``k`` if it still runs: SIGTERM (it stops as on Ctrl-C), or SIGKILL ``at_once``."""
        child = self.processes[k]
        if child.poll() is None:
            if at_once:
                child.kill()
            else:
                child.terminate()
            self.stopped.add(k)

    def killed_from_elsewhere(self) -> Optional[Tuple[int, int]]:
        """(child, signal) of the first child that a signal this process neither passed on nor
        sent ended (the OOM killer, a user's ``kill``, a segfault), if any."""
        for k, child in enumerate(self.processes):
            number = killing_signal(child.returncode)
            if number is not None and number not in self.sent and k not in self.stopped:
                return k, number
        return None

    def supervise(self, after_poll: Callable[[], None],
                  on_interrupt: Callable[[KeyboardInterrupt], None]) -> None:
        """Poll the children every POLL_SECONDS until none runs, calling ``after_poll`` after each
        poll (the caller's rule for stopping the rest after a failure). Ctrl-C, or a termination
        signal the command line raised as one, goes to ``on_interrupt`` (to pass it on, or not),
        and the waiting goes on until every child has ended."""
        while True:
            try:
                if not self.running():
                    return
                after_poll()
                time.sleep(POLL_SECONDS)
            except KeyboardInterrupt as exc:
                on_interrupt(exc)

    def kill_running(self) -> None:
        for child in self.processes:
            if child.poll() is None:
                child.kill()
                child.wait()

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.kill_running()


# --- Python worker processes ---------------------------------------------------------------------


def start_worker(target: Callable[..., None], args: Tuple, name: str) -> Any:
    """A daemon process running ``target(*args)``, started with ``spawn`` (it imports only what
    ``target`` needs, and nothing of this process's threads or locks is copied into it) and
    :data:`RUN_SIGNALS` blocked while it starts (:func:`_start_guarded`). Returns the process."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(target=target, args=args, name=name, daemon=True)
    _start_guarded(process)
    return process


def _start_guarded(process) -> None:
    """Start ``process`` with :data:`RUN_SIGNALS` blocked in this thread, so the new interpreter
    inherits them blocked: a Ctrl-C in a terminal (sent to every process of the group) then
    reaches only this process, never a worker still importing its modules (which would print a
    traceback). A signal that comes meanwhile stays pending here and is delivered right after.

    SIGPIPE is blocked too: starting a process writes to multiprocessing's resource tracker,
    and a tracker that was killed (by the OOM killer, say) would otherwise end this process
    silently (the command line restores SIGPIPE's default action); blocked, the write fails
    and multiprocessing starts a new tracker."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        process.start()
        return
    import warnings

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {*RUN_SIGNALS, signal.SIGPIPE})
    try:
        with warnings.catch_warnings():  # a new tracker is no concern of the user's
            warnings.simplefilter("ignore")
            process.start()
    finally:
        if signal.SIGPIPE not in blocked:
            signal.sigtimedwait({signal.SIGPIPE}, 0)  # one raised by a write to a dead tracker
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def reap_workers(processes: Sequence[Any], at_once: bool, grace: float = 5) -> None:
    """Wait for each worker to end, ``grace`` seconds at most before it is killed; ``at_once``
    (after a failure or Ctrl-C, when their results are of no use) kills them first."""
    for process in processes:
        if at_once:
            process.kill()
        process.join(timeout=grace)
        if process.is_alive():
            process.kill()
            process.join()
