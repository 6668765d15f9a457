"""Tasks side by side (runtime/side_by_side.py) and build-reranker's trainings run that way: each
task in a process of its own, its value or its error handed back, a failure stopping the others,
and models trained side by side the same as those trained one after another."""

from __future__ import annotations

import operator
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import DATA, TRAIN_EN, TRAIN_FR, default_sigint
from phrase_scorer.config import BuildRerankerOptions
from phrase_scorer.experiments.build_reranker import side_by_side_threads, trained_model
from phrase_scorer.io.model_layout import BEST_WEIGHTS
from phrase_scorer.runtime.side_by_side import Task, run_side_by_side


def test_each_job_runs_in_a_process_of_its_own_with_its_threads(capfd):
    import logging

    import torch

    pids = run_side_by_side([Task("a", os.getpid), Task("b", os.getpid)], threads_each=1)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert run_side_by_side([Task("t", torch.get_num_threads)], threads_each=3) == [3]
    assert run_side_by_side([Task("sum", operator.add, (2, 3)), Task("kw", dict, (), {"x": 1})], 1) == [5, {"x": 1}]
    run_side_by_side([Task("loud", logging.getLogger("phrase_scorer.training").warning, ("a %s line", "logged"))], 1)
    # the child's log, as the command's formatter writes it (a time first), marked with its job
    assert re.search(r"^\[loud\] (\S+ )?WARNING a logged line$", capfd.readouterr().err, re.M)


def test_a_failing_job_stops_the_others_and_its_error_is_raised():
    began = time.monotonic()
    with pytest.raises(ZeroDivisionError):
        run_side_by_side([Task("sleeper", time.sleep, (600,)), Task("divide", operator.truediv, (1, 0))], 1)
    assert time.monotonic() - began < 300  # the sleeper was stopped, not waited for


def test_a_job_killed_by_a_signal_is_named_with_it():
    from phrase_scorer.errors import PhraseScorerError

    with pytest.raises(PhraseScorerError, match="the crash job was killed by SIGABRT"):
        run_side_by_side([Task("crash", os.abort)], 1)


def test_side_by_side_is_the_default_on_a_cpu_with_two_threads_or_more(monkeypatch):
    import torch

    options = BuildRerankerOptions()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert side_by_side_threads(options, 3, "cpu") == 1
    assert side_by_side_threads(options, 1, "cpu") == 0  # one training: nothing beside it
    assert side_by_side_threads(options, 3, "cuda") == 0
    assert side_by_side_threads(replace(options, side_by_side=False), 3, "cpu") == 0
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert side_by_side_threads(options, 3, "cpu") == 2
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert side_by_side_threads(options, 3, "cpu") == 0
    assert side_by_side_threads(replace(options, side_by_side=True), 3, "cpu") == 1


def test_models_trained_side_by_side_are_those_trained_one_after_another(tmp_path):
    import torch

    options = replace(BuildRerankerOptions(), preset="tiny", max_steps=4, valid_every=2, batch_size=8, device="cpu")
    corpus = (str(TRAIN_EN), str(TRAIN_FR))
    tuning = (str(DATA / "multi30k.val100.en"), str(DATA / "multi30k.val100.fr"))
    together = run_side_by_side([Task(name, trained_model, (name, corpus, tuning, tmp_path / "together", "words",
                                                          replace(options, side_by_side=True)))
                                 for name in ("forward", "reverse")], threads_each=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = [trained_model(name, corpus, tuning, tmp_path / "alone", "words", replace(options, side_by_side=False))
                 for name in ("forward", "reverse")]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(together, alone):
        assert (a / BEST_WEIGHTS).read_bytes() == (b / BEST_WEIGHTS).read_bytes()


def jobs_env() -> dict:
    """The environment of a command whose jobs are in tests/side_by_side_jobs.py."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}


PARENT = """
import sys
from phrase_scorer.cli.group import ending_like_ctrl_c
from phrase_scorer.runtime.side_by_side import Task, run_side_by_side
from side_by_side_jobs import wait_for_a_signal
try:
    with ending_like_ctrl_c():
        run_side_by_side([Task(name, wait_for_a_signal, (sys.argv[1], name)) for name in ("a", "b")], 1)
except KeyboardInterrupt as exc:
    print(getattr(exc, "number", "SIGINT"))
    sys.exit(3)
"""


NICE_PARENT = """
import os, sys
from phrase_scorer.runtime.side_by_side import Task, run_side_by_side
from side_by_side_jobs import autogroup_niceness
os.nice(5)
print(run_side_by_side([Task("a", autogroup_niceness)], 1)[0])
"""


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="the kernel has no scheduler autogroups")
def test_a_niced_command_s_jobs_stay_niced_in_their_own_sessions():
    """The jobs run in sessions of their own, so each in a scheduler group of its own: the group
    takes the command's niceness, or nice on the command would lower nothing."""
    mine = Path("/proc/self/autogroup").read_text().split()
    if not mine:  # a process in a cgroup of its own (a container) is in no autogroup: the file reads empty
        pytest.skip("this process is in a control group, not a scheduler autogroup")
    try:  # this machine lets a process set its group's niceness (the same value again: no change)
        Path("/proc/self/autogroup").write_text(mine[-1])
    except OSError:
        pytest.skip("this machine does not let a process set its scheduler group's niceness")
    out = subprocess.run([sys.executable, "-c", NICE_PARENT], env=jobs_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    own = mine[0]
    group, _, niceness = out.stdout.split()
    assert group != own and niceness == str(min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5))


LOCKED_PARENT = """
import sys
from pathlib import Path
from phrase_scorer.io.output_lock import OutputLock
from phrase_scorer.runtime.side_by_side import Task, run_side_by_side
from side_by_side_jobs import hold_until_released
with OutputLock(Path(sys.argv[1]) / "work"):
    run_side_by_side([Task(name, hold_until_released, (sys.argv[1], name)) for name in ("a", "b")], 1)
"""


def test_the_jobs_keep_the_commands_lock_until_the_last_of_them_ends(tmp_path):
    """The command holds its output's lock and is killed outright while its jobs run: until the
    last job has ended, a second run is refused the output; then it takes it."""
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.io.output_lock import OutputLock

    parent = subprocess.Popen([sys.executable, "-c", LOCKED_PARENT, str(tmp_path)], env=jobs_env(),
                              stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    try:
        while not all((tmp_path / f"{name}.began").exists() for name in "ab"):
            assert parent.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        while not all((tmp_path / f"{name}.stopping").exists() for name in "ab"):  # the jobs saw it, and go on
            assert time.monotonic() < deadline, "a job did not see its command killed"
            time.sleep(0.05)
        with pytest.raises(PhraseScorerError, match="another phrase-scorer run is writing this output"):
            OutputLock(tmp_path / "work").acquire()
    finally:
        parent.kill()
        (tmp_path / "release").write_text("")  # the jobs end, whatever happened above
    while True:  # bounded: the jobs end once released, and the lock with them
        try:
            lock = OutputLock(tmp_path / "work")
            lock.acquire()
            break
        except PhraseScorerError:
            assert time.monotonic() < deadline, "the lock outlived the jobs"
            time.sleep(0.05)
    lock.release()
    assert not (tmp_path / "work.lock").exists()


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_command_reaches_every_job_once_and_the_command_ends_interrupted(tmp_path, number):
    """SIGTERM (a scheduler) or SIGINT (Ctrl-C, which reaches only the command: the jobs have
    sessions of their own) sent to the command is passed on to each job once; the command waits
    for them to stop and ends as interrupted."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], env=jobs_env(), stdout=subprocess.PIPE,
                              text=True, preexec_fn=default_sigint)  # SIGINT's default even in a background run
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"{name}.began").exists() for name in "ab"):  # both jobs waiting
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    parent.send_signal(number)
    out, _ = parent.communicate(timeout=300)
    assert parent.returncode == 3
    assert out.strip() == (str(int(number)) if number == signal.SIGTERM else "SIGINT")
    for name in "ab":
        assert (tmp_path / f"{name}.stopped").read_text() == str(int(number))  # once each


def test_the_jobs_of_a_command_killed_outright_stop_as_on_a_sigterm(tmp_path):
    """SIGKILL leaves the command no chance to pass anything on: each job sees its command gone
    and stops as a SIGTERM stops it (a training: after its step, with a checkpoint)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], env=jobs_env(), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"{name}.began").exists() for name in "ab"):
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    parent.kill()
    parent.wait()
    stopped = [tmp_path / f"{name}.stopped" for name in "ab"]
    while not all(path.exists() and path.read_text() for path in stopped):  # bounded: fails, not hangs
        assert time.monotonic() < deadline, "a job went on after its command was killed"
        time.sleep(0.05)
    for name in "ab":
        assert (tmp_path / f"{name}.stopped").read_text() == str(int(signal.SIGTERM))
