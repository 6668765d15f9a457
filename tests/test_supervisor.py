"""The one supervisor of the package's child processes (runtime/supervisor.py): what it does to its
children is told apart from what happened to them, none is left behind, and how one ended is named
for every signal number. The callers' behaviour (tasks side by side, a local training job, worker
pools) is pinned by tests/test_side_by_side.py, tests/test_distributed.py and tests/test_supervision.py."""

from __future__ import annotations

import signal
import sys

from phrase_scorer.runtime.supervisor import Children, how_it_ended, signal_name

WAIT = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_a_child_killed_from_elsewhere_is_told_apart_from_one_this_process_stopped():
    with Children() as children:
        for _ in range(3):
            children.start(WAIT)
        children.stop(0)  # stopped here (SIGTERM): no surprise
        children.processes[1].send_signal(signal.SIGKILL)  # as the OOM killer or a user's kill would
        for k in (0, 1):
            children.processes[k].wait()
        assert children.running()  # the third still runs
        assert children.killed_from_elsewhere() == (1, signal.SIGKILL)
        assert children.first_failed() == 0
    assert not children.running()


def test_a_signal_passed_on_is_no_surprise_and_reaches_only_the_children_still_running():
    with Children() as children:
        first = children.start(WAIT)
        children.pass_on(signal.SIGKILL)
        first.wait()
        second = children.start(WAIT)
        children.pass_on(signal.SIGTERM)
        assert second.wait() == -signal.SIGTERM
        assert children.killed_from_elsewhere() is None
        assert children.exitcodes() == [-signal.SIGKILL, -signal.SIGTERM]


def test_children_still_running_when_the_block_ends_are_killed_and_reaped():
    try:
        with Children() as children:
            children.start(WAIT)
            children.start(WAIT)
            raise RuntimeError("the caller failed")
    except RuntimeError:
        pass
    assert children.exitcodes() == [-signal.SIGKILL, -signal.SIGKILL]  # reaped: each has its status


def test_how_a_child_ended_is_named_for_any_signal_number():
    assert signal_name(signal.SIGABRT) == "SIGABRT"
    assert signal_name(200) is None  # a number the platform does not name
    assert how_it_ended(-signal.SIGKILL) == f"was killed by signal {int(signal.SIGKILL)} (SIGKILL: out of memory?)"
    assert how_it_ended(-200) == "was killed by signal 200"
    assert how_it_ended(3) == "exited with status 3"
    assert how_it_ended(None) == "stopped answering"
