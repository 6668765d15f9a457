"""Training under torchrun: 2 processes on the CPU (gloo) against one process, same global batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import EXAMPLE_TABLE, PAUSE_AT, ROOT
from phrase_scorer.config import TrainConfig
from phrase_scorer.runtime.distributed import shard
from phrase_scorer.training.run import train

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")]

# Without dropout: each rank draws the dropout masks of its own part of a batch, so with dropout
# N processes train like one only in distribution, not number for number.
SETTINGS = dict(preset="tiny", valid_pairs=200, valid_every=10, batch_size=16, seed=11, dropout=0.0)
ARGS = ["train", EXAMPLE_TABLE, "--preset", "tiny", "--valid-pairs", 200, "--valid-every", 10, "--batch-size", 16,
        "--seed", 11, "--dropout", 0]
STEPS = 30


def job_env() -> dict:
    """The environment of a job's processes: one thread each, this checkout's package."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def torchrun(*args, processes: int = 2, timeout: float = 900) -> subprocess.CompletedProcess:
    env = job_env()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def records(model_dir: Path) -> list:
    return [json.loads(line) for line in (model_dir / "train.log.jsonl").read_text().splitlines()]


def assert_same_curve(one: Path, many: Path, train_loss: bool = True) -> None:
    """The same validation NLL at every validation (and the same training loss, unless a resume
    restarted its interval)."""
    a, b = records(one), records(many)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b):
        assert y["valid_nll_pair"] == pytest.approx(x["valid_nll_pair"], rel=1e-4), (x, y)
        if train_loss:
            assert y["train_nll_pair"] == pytest.approx(x["train_nll_pair"], rel=1e-4), (x, y)
        assert y["pairs_seen"] == x["pairs_seen"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "model"
    train(EXAMPLE_TABLE, out, TrainConfig(max_steps=STEPS, **SETTINGS))
    return out


def test_a_rank_takes_its_contiguous_part_of_the_global_batch():
    batch = np.arange(10)
    parts = [shard(batch, r, 4) for r in range(4)]
    assert [len(p) for p in parts] == [2, 3, 2, 3]
    assert np.array_equal(np.concatenate(parts), batch)
    assert [len(shard(np.arange(1), r, 2)) for r in range(2)] == [0, 1]


def test_two_processes_learn_what_one_does_and_resume_with_nothing_there_starts_afresh(tmp_path, one_process):
    out = tmp_path / "never-made"
    run = torchrun("-m", "phrase_scorer", *ARGS, "--max-steps", STEPS, "-o", out, "--resume")
    assert run.returncode == 0, run.stderr
    assert "nothing to resume" in run.stderr and "starting afresh" in run.stderr
    assert "global batch: 16 pairs per update (2 processes x 8 pairs)" in run.stderr
    assert all(r["processes"] == 2 and r["batch_size"] == 16 for r in records(out))
    assert_same_curve(one_process, out)
    assert not list(out.glob("*.part"))


def test_train_processes_starts_the_same_job_as_torchrun(tmp_path, one_process):
    """`train --processes 2` runs the command as 2 ranks itself: the curve of one process with
    the same global batch, one closing line."""
    out = tmp_path / "two"
    env = job_env()
    run = subprocess.run([sys.executable, "-m", "phrase_scorer", *map(str, ARGS), "--max-steps", str(STEPS),
                          "-o", str(out), "--processes", "2"], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "global batch: 16 pairs per update (2 processes x 8 pairs)" in run.stderr
    assert run.stderr.count(f"model in {out}:") == 1
    assert all(r["processes"] == 2 for r in records(out))
    assert_same_curve(one_process, out)
    mismatch = torchrun("-m", "phrase_scorer", *ARGS, "--max-steps", STEPS, "-o", tmp_path / "three", "--processes", 3)
    assert mismatch.returncode != 0 and "--processes 3, but torchrun started 2 processes" in mismatch.stderr


def test_train_processes_passes_a_sigterm_on_and_says_once_where_the_job_stopped(tmp_path):
    """A SIGTERM to `train --processes 2` reaches both ranks: they stop after the same step with
    a checkpoint, the job exits 143 (128 + SIGTERM) with one line naming the resume command, and it resumes."""
    out = tmp_path / "stopped"
    env = job_env()
    command = [sys.executable, "-m", "phrase_scorer", *map(str, ARGS), "-o", str(out), "--processes", "2"]
    proc = subprocess.Popen([*command, "--max-steps", "100000"], stderr=subprocess.PIPE, text=True, env=env)
    log = out / "train.log.jsonl"
    deadline = time.monotonic() + 600
    while not (log.exists() and log.read_text().strip()):  # the first validation is written
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no validation within 10 minutes"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=600) == 128 + signal.SIGTERM, err
    assert err.count("stopped at step") == 1 and "--processes 2 --resume" in err
    step = int(err.split("stopped at step ")[1].split(",")[0])
    assert (out / "checkpoint.pt").exists()
    resumed = subprocess.run([*command, "--max-steps", str(step + 10), "--resume"], capture_output=True, text=True,
                             env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming at step {step}" in resumed.stderr
    assert records(out)[-1]["step"] == step + 10


def test_sigterm_on_one_rank_stops_all_after_the_same_step_and_resume_goes_on(tmp_path, one_process):
    out = tmp_path / "cut"
    ready = tmp_path / "ready"
    env = job_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PAUSE_AT), "step:14", str(ready), "--", *map(str, ARGS), "--max-steps", "400", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    # the first rank to finish 14 steps halts there and names itself; it cannot have moved on
    deadline = time.monotonic() + 600
    while not (ready.exists() and ready.read_text().strip()):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no rank reached step 14"
        time.sleep(0.05)
    os.kill(int(ready.read_text()), signal.SIGTERM)
    while proc.poll() is None:  # let every rank go on from step 14 (each halts there once)
        ready.unlink(missing_ok=True)
        time.sleep(0.05)
    err = proc.stderr.read()
    assert proc.returncode != 0
    # rank 0 says it, once; the checkpoint (written after both ranks agreed) is of step 15
    assert err.count("stopped at step 15, checkpoint saved") == 1, err
    state = torch.load(out / "checkpoint.pt", weights_only=True)["state"]
    assert state["step"] == 15
    resumed = torchrun("-m", "phrase_scorer", *ARGS, "--max-steps", STEPS, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming at step 15" in resumed.stderr
    assert_same_curve(one_process, out, train_loss=False)


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The process id of rank ``rank`` of a job `train --processes` started: the child of the
    launcher whose environment says RANK=rank."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    for child in children:
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no rank {rank} among the children {children} of the launcher")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the ranks through /proc (Linux)")
def test_a_rank_killed_by_sigkill_ends_the_job_with_one_line_naming_it_and_the_resume_command(tmp_path):
    """SIGKILL of rank 1 once the first checkpoint exists: the job exits non-zero with one line
    naming the rank, the signal and the resume command; rank 0's traceback about its lost peer
    (gloo's "connection reset") is not shown."""
    out = tmp_path / "killed"
    env = job_env()
    command = [sys.executable, "-m", "phrase_scorer", *map(str, ARGS), "-o", str(out), "--processes", "2",
               "--max-steps", "100000"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    while not (out / "checkpoint.pt").exists():  # the first validation's checkpoint is written
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.05)
    os.kill(rank_pid(proc, 1), signal.SIGKILL)
    err = proc.stderr.read()
    assert proc.wait(timeout=600) != 0, err
    assert "Traceback" not in err and "[rank0]" not in err and "Connection reset" not in err, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert errors == [f"phrase-scorer: error: rank 1 of 2 was killed by SIGKILL; the other ranks were stopped "
                      f"(resume with: phrase-scorer train {EXAMPLE_TABLE} -o {out} --processes 2 --resume)"], err
    assert torch.load(out / "checkpoint.pt", weights_only=True)["state"]["step"] >= 10


def test_two_processes_train_a_transformer_as_one_does(tmp_path):
    """The Transformer under torchrun: the curve of one process with the same global batch (no
    dropout, whose masks each rank draws for its own part)."""
    common = ["--arch", "transformer", "--warmup", 5, "--max-steps", 20]
    one = tmp_path / "one"
    single = subprocess.run([sys.executable, "-m", "phrase_scorer", *map(str, ARGS), *map(str, common), "-o", str(one),
                             "--threads", "1"], capture_output=True, text=True, env=job_env(), timeout=900)
    assert single.returncode == 0, single.stderr
    two = tmp_path / "two"
    run = torchrun("-m", "phrase_scorer", *ARGS, *common, "-o", two)
    assert run.returncode == 0, run.stderr
    assert all(r["processes"] == 2 for r in records(two))
    assert json.loads((two / "config.json").read_text())["model"]["arch"] == "transformer"
    assert_same_curve(one, two)
