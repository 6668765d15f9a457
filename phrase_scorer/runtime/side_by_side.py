"""Tasks side by side: each in a Python process of its own on this machine, all at once, each on
its share of the cores. ``build-reranker`` trains its models this way on a CPU: two trainings on
one core each go about twice as far in the same time as one training on both (docs/benchmarks.md,
"Training side by side"). The processes are supervised by :mod:`phrase_scorer.runtime.supervisor`.

A task is a module-level function and its arguments (both pickled to the child). The child logs
as the command does, each line marked with the task's name, shows no progress bars (they would
overwrite each other), and hands back the function's value or its exception.

Signals. The children run in sessions of their own, so a terminal's Ctrl-C reaches this process
alone, and :func:`run_side_by_side` passes each SIGINT, SIGTERM or SIGHUP it gets on to every
child still running, once (a training stops after its current step with a checkpoint; a second
Ctrl-C stops it at once), then waits for them and raises the interruption. A task that fails
stops the others the same way (SIGTERM), since the command cannot go on without it, and its
error is raised once they have ended. A task whose command is killed outright (SIGKILL) stops as
on a SIGTERM within a second. A command started with ``nice`` keeps its tasks as nice: each
child's scheduler group takes the child's niceness (:func:`keep_niceness`).

Locks. Each child is given a copy of the descriptor of every output lock the command holds
(:class:`~phrase_scorer.io.output_lock.OutputLock`: ``build-reranker``'s working folder), so the folder
stays locked until the last task has ended: a command killed outright leaves no moment in which a
second run could take the folder while its tasks still write their checkpoints.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from phrase_scorer.runtime.supervisor import Children, leave_when_parent_gone, signal_name


@dataclass(frozen=True)
class Task:
    name: str  # marks the child's log lines
    function: Callable[..., Any]  # a module-level function (pickled by reference)
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Order:
    task: Task
    parent: int  # the pid of the process that started the task
    threads: int
    log_level: int
    formatter: Optional[logging.Formatter]  # the command's own (each line is marked with the task's name)
    result: str  # where the child pickles ("value", x) or ("error", exception)


def run_side_by_side(tasks: Sequence[Task], threads_each: int) -> List[Any]:
    """The value of each task's function, in the tasks' order, each run in a child process with
    ``threads_each`` torch threads, all at once."""
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.io.output_lock import held_output_locks

    locks = [fd for fd in (lock.fileno() for lock in held_output_locks()) if fd is not None]
    results = Path(tempfile.mkdtemp(prefix="phrase-scorer-tasks-"))
    children = Children()
    interruption: Optional[BaseException] = None
    stopped_for: Optional[int] = None  # the task whose failure stopped the others
    logger = logging.getLogger("phrase_scorer")
    level = logger.getEffectiveLevel()
    formatter = next((h.formatter for h in logger.handlers if h.formatter is not None), None)

    def stop_the_rest_after_a_failure() -> None:
        nonlocal stopped_for
        if stopped_for is None and interruption is None:
            stopped_for = children.first_failed()
            if stopped_for is not None:
                children.pass_on(signal.SIGTERM)

    def pass_on(exc: KeyboardInterrupt) -> None:  # Ctrl-C, or the command line's Terminated for SIGTERM, SIGHUP
        nonlocal interruption
        interruption = interruption or exc
        children.pass_on(getattr(exc, "number", signal.SIGINT))

    try:
        with children:  # an error here (children not all started) leaves none behind
            for k, task in enumerate(tasks):
                result = os.fspath(results / f"task{k}.pickle")
                order = _Order(task, os.getpid(), threads_each, level, formatter, result)
                child = children.start([sys.executable, "-c", "from phrase_scorer.runtime.side_by_side import "
                                        "child_main; child_main()"], stdin=subprocess.PIPE, start_new_session=True,
                                       pass_fds=locks)
                assert child.stdin is not None
                child.stdin.write(pickle.dumps(order))
                child.stdin.close()
            children.supervise(stop_the_rest_after_a_failure, pass_on)
            outcomes = [_outcome(results / f"task{k}.pickle") for k in range(len(tasks))]
    finally:
        for path in results.iterdir():
            path.unlink()
        results.rmdir()
    if interruption is not None:
        raise interruption
    first = [stopped_for] if stopped_for is not None else []  # the failure that stopped the others
    codes = children.exitcodes()
    for k in first + list(range(len(tasks))):
        kind, value = outcomes[k] or ("error", None)
        if kind == "error":
            if isinstance(value, BaseException):
                raise value
            code = codes[k]
            name = signal_name(-code) if code is not None and code < 0 else None
            how = f"was killed by {name}" if name is not None else f"ended with status {code}"
            raise PhraseScorerError(f"the {tasks[k].name} job {how}",
                                    hint="run the same command again: it continues from what was kept")
    return [value for _, value in outcomes]  # type: ignore[misc]


def _outcome(path: Path) -> Optional[Tuple[str, Any]]:
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None  # the child ended before writing it (killed)


class _Marked(logging.Formatter):
    """The command's formatter, each line led by the task's name."""

    def __init__(self, inner: logging.Formatter, name: str) -> None:
        super().__init__()
        self.inner, self.name = inner, name

    def format(self, record: logging.LogRecord) -> str:
        return f"[{self.name}] {self.inner.format(record)}"


AUTOGROUP = "/proc/self/autogroup"


def keep_niceness() -> None:
    """A child in a session of its own is, on Linux with the scheduler's autogroups, in a group of
    its own, which shares the CPU with the others by the group's niceness (0), not the process's:
    ``nice phrase-scorer build-reranker`` would lower nothing. The group takes the process's
    niceness (inherited from the command) where the kernel has autogroups."""
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness <= 0 or not os.path.exists(AUTOGROUP):
        return
    try:
        with open(AUTOGROUP, "w", encoding="ascii") as f:
            f.write(str(niceness))
    except OSError:  # autogroups switched off, or not allowed: nothing to keep
        pass


def child_main() -> None:
    """A child's side: read the order from stdin, run the task, pickle its outcome."""
    import torch

    from phrase_scorer.runtime import progress

    order: _Order = pickle.load(sys.stdin.buffer)
    keep_niceness()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Marked(order.formatter or logging.Formatter("%(levelname)s %(message)s"), order.task.name))
    root = logging.getLogger("phrase_scorer")
    root.handlers[:] = [handler]
    root.setLevel(order.log_level)
    root.propagate = False
    progress.show_bars = False
    torch.set_num_threads(order.threads)
    # A task whose command is gone (killed with SIGKILL: it could pass nothing on) stops as on a
    # SIGTERM: a training after its current step, with a checkpoint. Without this it would go on
    # alone, in a session of its own, into a folder no lock guards any more.
    leave_when_parent_gone(order.parent, signal.SIGTERM)
    try:
        outcome: Tuple[str, Any] = ("value", order.task.function(*order.task.args, **order.task.kwargs))
        status = 0
    except BaseException as exc:  # noqa: B036 - handed to the parent, which raises it
        outcome, status = ("error", exc), 1
    try:
        data = pickle.dumps(outcome)
    except Exception:  # an exception that does not pickle: its traceback instead
        data = pickle.dumps(("error", RuntimeError("".join(traceback.format_exception(
            type(outcome[1]), outcome[1], outcome[1].__traceback__)))))
    part = f"{order.result}.part"
    with open(part, "wb") as f:
        f.write(data)
    os.replace(part, order.result)
    sys.exit(status)
