"""How a run ends when a process it depends on dies, or when it is told to stop.

A worker killed (as the OOM killer kills one) ends the run with one line naming the worker and
how it died; a killed resource tracker does not end it at all; SIGTERM and SIGHUP (Slurm,
``kill``, a closed terminal) end it exactly as Ctrl-C does. Each run is halted at a known point
(tests/pause_at.py) before the signal is sent, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import (
    EXAMPLE_TABLE, VAL_EN, child_processes, kill_and_see_it_dead, process_state, start_halted,
)
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.runtime.workers import WorkerPool

ANNOTATE = ["--window-lines", 100, "--threads", 1, "--workers", 2]


def phrase_scorer(*args) -> list:
    return [sys.executable, "-m", "phrase_scorer", *map(str, args)]


def workers_of(pid: int) -> list:
    """The worker processes of run ``pid``, in the order they were started."""
    return sorted(p for p, command in child_processes(pid).items() if "spawn_main" in command)


def tracker_of(pid: int) -> int:
    trackers = [p for p, command in child_processes(pid).items() if "resource_tracker" in command]
    assert len(trackers) == 1, child_processes(pid)
    return trackers[0]


def let_go(ready: Path) -> None:
    """Let a run halted by tests/pause_at.py go on."""
    ready.unlink()


def last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def assert_stopped(pids) -> None:
    """Each of ``pids`` is dead (gone, or a zombie left to init): none runs on after its run."""
    assert [p for p in pids if process_state(p) not in (None, "Z", "X")] == []


def table_lines() -> int:
    return len(gzip.decompress(EXAMPLE_TABLE.read_bytes()).splitlines())


# --- a worker that dies ------------------------------------------------------------------------


class DiesOnRequest:
    """A worker's handler: ``echo`` answers its item's index, or kills its own process with
    SIGKILL (as the OOM killer does) when asked to."""

    def echo(self, index: int, die: bool) -> int:
        if die:
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_killed_worker_is_named_with_its_signal_and_every_worker_is_reaped():
    with pytest.raises(PhraseScorerError) as failure:
        with WorkerPool(DiesOnRequest, (), ["echo"], 2) as pool:
            workers = workers_of(os.getpid())
            for index in range(4):
                pool.submit("echo", index, index == 1)  # item 1 is worker 2's
            assert pool.result("echo", 0) == 0
            pool.result("echo", 1)
    assert failure.value.message == "worker 2 was killed by signal 9 (SIGKILL: out of memory?)"
    assert "fewer workers" in failure.value.hint
    assert len(workers) == 2 and all(process_state(p) is None for p in workers)  # reaped, none a zombie


def test_annotate_with_a_killed_worker_ends_with_one_line_naming_it_and_the_part_kept(tmp_path, tiny_model):
    """Worker 2 is killed while the run is halted in the middle of writing its second chunk; when
    the run goes on it must not wait for the dead worker's answers (it used to, forever, when the
    worker died in the middle of one)."""
    out, ready = tmp_path / "out.gz", tmp_path / "ready"
    proc = start_halted(f"write:{out}:2:0.5", ["annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out, *ANNOTATE],
                        ready)
    workers = workers_of(proc.pid)
    assert len(workers) == 2
    kill_and_see_it_dead(workers[1])
    let_go(ready)
    _, err = proc.communicate(timeout=300)  # bounds a hang only
    assert proc.returncode == 1, err
    line = last_line(err)
    assert line.startswith("phrase-scorer: error: worker 2 was killed by signal 9 (SIGKILL: out of memory?)"), line
    assert "--resume" in line and "kept" in line
    assert Path(f"{out}.part").exists() and Path(f"{out}.part.json").exists()
    assert not out.exists() and not Path(f"{out}.lock").exists()
    assert_stopped(workers)
    resumed = subprocess.run(phrase_scorer("annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out, *ANNOTATE,
                                           "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert len(gzip.decompress(out.read_bytes()).splitlines()) == table_lines()


# --- the resource tracker ------------------------------------------------------------------------


def test_a_killed_resource_tracker_does_not_end_annotate(tmp_path, tiny_model):
    """multiprocessing's resource tracker, a child of the run, is killed in the middle of the run
    (it used to end the run silently with status 141, SIGPIPE, when the run next wrote to it)."""
    out, ready = tmp_path / "out.gz", tmp_path / "ready"
    proc = start_halted(f"write:{out}:2:0.5", ["annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out, *ANNOTATE],
                        ready)
    kill_and_see_it_dead(tracker_of(proc.pid))
    let_go(ready)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err and "Warning" not in err, err
    assert len(gzip.decompress(out.read_bytes()).splitlines()) == table_lines()


# --- termination signals --------------------------------------------------------------------------


def test_sigterm_ends_annotate_as_ctrl_c_does_keeping_the_part_for_resume(tmp_path, tiny_model):
    out, ready = tmp_path / "out.gz", tmp_path / "ready"
    proc = start_halted(f"write:{out}:2:0.5", ["annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out, *ANNOTATE],
                        ready)
    workers = workers_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    let_go(ready)  # the signal has arrived where the run was halted: see what it does there
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert last_line(err) == ("phrase-scorer: error: interrupted by SIGTERM; the finished part is kept. "
                              "Resume with the same command and --resume")
    assert err.count("interrupted") == 1  # the main process says it, no worker does
    assert Path(f"{out}.part").exists() and Path(f"{out}.part.json").exists()
    assert not out.exists() and not Path(f"{out}.lock").exists()
    assert len(workers) == 2
    assert_stopped(workers)
    resumed = subprocess.run(phrase_scorer("annotate", EXAMPLE_TABLE, "-m", tiny_model, "-o", out, *ANNOTATE,
                                           "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert len(gzip.decompress(out.read_bytes()).splitlines()) == table_lines()


@pytest.mark.parametrize("sig, status, said", [
    (signal.SIGINT, 130, "interrupted"),  # as it has always been: what the other two must match
    (signal.SIGTERM, 143, "interrupted by SIGTERM"),
    (signal.SIGHUP, 129, "interrupted by SIGHUP"),
])
def test_a_termination_signal_ends_translate_as_ctrl_c_does_leaving_nothing_behind(tmp_path, sentence_models,
                                                                                  sig, status, said):
    """``translate -m`` cannot resume: an interrupted run leaves no OUT.part and no OUT.lock."""
    source = tmp_path / "in.txt"
    source.write_text(VAL_EN.read_text(encoding="utf-8"), encoding="utf-8")
    out, ready = tmp_path / "out.txt", tmp_path / "ready"
    proc = start_halted(f"write:{out}:2:0.5", ["translate", "-m", sentence_models("encdec"), source, "-o", out,
                                              "--batch-sentences", 1, "--beam", 2, "--threads", 1], ready)
    proc.send_signal(sig)
    let_go(ready)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == status, err
    assert last_line(err) == f"phrase-scorer: error: {said}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_sigterm_ends_rescore_as_ctrl_c_does_keeping_the_part_for_resume(tmp_path, tiny_model):
    data = Path(__file__).resolve().parent / "data"
    args = ["rescore", data / "val.nbest.head.gz", "--source", data / "val.tok.en.head", "-m", tiny_model,
            "--window-lines", 30, "--threads", 1]
    out, ready = tmp_path / "out.gz", tmp_path / "ready"
    proc = start_halted(f"write:{out}:2:0.5", [*args, "-o", out], ready)
    proc.send_signal(signal.SIGTERM)
    let_go(ready)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert last_line(err) == ("phrase-scorer: error: interrupted by SIGTERM; the finished part is kept. "
                              "Resume with the same command and --resume")
    assert Path(f"{out}.part").exists() and Path(f"{out}.part.json").exists()
    assert not out.exists() and not Path(f"{out}.lock").exists()
    resumed = subprocess.run(phrase_scorer(*args, "-o", out, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert len(gzip.decompress(out.read_bytes()).splitlines()) == 221
