"""Running under ``torchrun``: who this process is, which part of the work is its own, and the
few collective steps the ranks share. ``train`` and ``annotate`` both use this one view.

``torchrun`` starts one process per GPU (or per CPU slot) and tells each its place through the
environment: ``RANK`` (0 .. WORLD_SIZE-1 over all machines), ``WORLD_SIZE``, ``LOCAL_RANK`` (the
GPU on its machine), ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` / ``MASTER_PORT`` (where they meet).
Nothing else in the package reads these variables (:func:`world`). A process not started by
torchrun is rank 0 of a world of 1; every collective here is then a no-op and no process group
is started, so the same code runs alone and under torchrun.

Rank 0 is the *main* process: the one writer of files and logs. The backend is ``nccl`` on CUDA
and ``gloo`` on a CPU; small control messages (stop requests, agreed clocks, Python objects)
always go through a ``gloo`` group, so deciding them never waits on the GPU.

Sharding a table. The ranks split the table into contiguous runs of whole windows (see
:mod:`phrase_scorer.io.table_windows`: window ``k`` is lines ``k * window_lines + 1`` onwards,
whatever process reads it). Each window is scored exactly as one process would score it, so the
parts, joined in rank order, are byte-identical to a one-process run. No line is repeated or
dropped (unlike a ``DistributedSampler``, which pads the last shard with repeated items).

``train --processes N`` starts such a job itself on this machine (:func:`launch_local`): N
processes with the environment ``torchrun --standalone --nproc-per-node N`` would give them.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

# Collectives wait this long for a peer before failing: ranks wait for the slowest shard of a
# large table, and for rank 0 building the pair cache of one, so it is long. A rank that dies
# is noticed sooner: torchrun stops the others.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=7)

_control_group: Any = None


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1  # processes of this job on this machine

    @property
    def is_main(self) -> bool:
        """Rank 0 writes what the job writes once (outputs, checkpoints, signatures, logs)."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """This process's place in the job, from the environment torchrun sets."""
    env = os.environ
    size = int(env.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    return World(rank=int(env["RANK"]), size=size, local_rank=int(env.get("LOCAL_RANK", "0")),
                 local_size=int(env.get("LOCAL_WORLD_SIZE", "1")))


def cores_per_process(current: Optional[World] = None) -> int:
    """The CPU cores this process may use, sharing the machine with the job's other local ranks."""
    current = current or world()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // current.local_size)


LAUNCH_GRACE = 30.0  # seconds the other ranks of a local job get to end after one failed
# Set by launch_local for each rank: the file where the rank writes a failure it did not expect
# (a traceback) instead of the terminal (see failures_to_launcher).
RANK_FAILURE_FILE = "PHRASE_SCORER_RANK_FAILURE"
# Beside it: the error of a rank that ran out of memory, open files or processes (pickled).
RANK_EXHAUSTED = ".exhausted"


def _quiet_about_memory(unraisable) -> None:
    """A rank's hook for exceptions Python can only ignore (a weakref callback's, a finaliser's):
    a MemoryError among them is not shown, as it would be with a traceback beside the job's one
    line; if the rank then fails, its line says that memory ran out. Others are shown as always."""
    if not isinstance(unraisable.exc_value, MemoryError):
        sys.__unraisablehook__(unraisable)


@contextlib.contextmanager
def failures_to_launcher() -> Iterator[None]:
    """Under :func:`launch_local`, an unexpected exception of this rank (one that would print a
    traceback) is written to the file the launcher named, and the rank exits with status 1. The
    launcher shows it when the job ends, unless another rank was killed by a signal: the failure
    is then that lost peer's consequence (a collective's "connection reset"), and the launcher's
    one line says what happened. Project errors, I/O errors and interrupts are reported as always."""
    path = os.environ.get(RANK_FAILURE_FILE)
    if not path:
        yield
        return
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.runtime.resources import exhausted

    # Out of memory, wording the line may itself fail: this one is made while there is memory.
    out_of_memory = pickle.dumps(exhausted(MemoryError()))
    sys.unraisablehook = _quiet_about_memory  # for the rank's life, its exit included
    try:
        yield
    except PhraseScorerError:
        raise
    except Exception as exc:
        traceback.clear_frames(exc.__traceback__)  # the failed work's locals (its tensors) are freed first
        try:
            error = exhausted(exc)  # memory, open files, ...: the job's one line, said by the launcher
            said = pickle.dumps(error) if error is not None else None
        except (MemoryError, SystemError):  # an allocation failed again: native code raises SystemError
            said = out_of_memory
        if said is not None:
            with open(path + RANK_EXHAUSTED, "wb") as failure:
                failure.write(said)
            raise SystemExit(1) from None
        if isinstance(exc, OSError):
            raise
        with open(path, "w", encoding="utf-8") as failure:
            failure.write(traceback.format_exc())
        raise SystemExit(1) from None


def launch_local(processes: int, arguments: Sequence[str], threads: Optional[int] = None,
                 resume_command: Optional[str] = None) -> int:
    """Run ``phrase-scorer ARGUMENTS`` as a job of ``processes`` ranks on this machine, each a
    process with the environment torchrun would give it, and return the job's exit status (rank
    0's, else the first failure's). Each rank gets ``threads`` threads, by default its share of
    the cores. An interrupt from the terminal reaches every rank (they stop after the same step
    with a checkpoint) and this process waits for them; a SIGTERM sent to this process is passed
    on. A rank that fails leaves the others LAUNCH_GRACE seconds to end before they are stopped.

    A rank killed by a signal (SIGKILL from the out-of-memory killer or a user, a segfault) ends
    the job at once: the other ranks are stopped, their tracebacks about the lost peer are not
    shown, and a :class:`~phrase_scorer.errors.PhraseScorerError` names the rank, the signal and
    ``resume_command``."""
    from phrase_scorer.errors import PhraseScorerError, Text
    from phrase_scorer.runtime.resources import check_open_files
    from phrase_scorer.runtime.supervisor import Children, signal_name

    check_open_files(processes)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    failures = tempfile.mkdtemp(prefix="phrase-scorer-ranks-")
    ranks = Children()  # what this process passes on or stops itself is no surprise (killed_from_elsewhere)
    failed_at = None

    def forward(number, frame) -> None:
        ranks.pass_on(number)

    def stop_the_rest_after_a_failure() -> None:
        nonlocal failed_at
        if failed_at is None and ranks.first_failed() is not None:
            failed_at = time.monotonic()
        waited = time.monotonic() - failed_at if failed_at is not None else 0.0
        for rank in range(len(ranks.processes)):
            if waited > 2 * LAUNCH_GRACE:
                ranks.stop(rank, at_once=True)
            elif waited > LAUNCH_GRACE or ranks.killed_from_elsewhere():  # a lost rank: the job cannot go on
                ranks.stop(rank)

    def wait_for_their_checkpoint(exc: KeyboardInterrupt) -> None:
        """An interrupt from the terminal reached the ranks too: they stop after the same step."""

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        for rank in range(processes):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(processes), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(processes), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            env[RANK_FAILURE_FILE] = os.path.join(failures, f"rank-{rank}.txt")
            env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a peer's lost connection is the launcher's to name
            env.setdefault("OMP_NUM_THREADS",
                           str(threads or cores_per_process(World(size=processes, local_size=processes))))
            ranks.start([sys.executable, "-m", "phrase_scorer", *arguments], env=env)
        ranks.supervise(stop_the_rest_after_a_failure, wait_for_their_checkpoint)
        codes = [code or 0 for code in ranks.exitcodes()]  # every rank has ended
        lost = ranks.killed_from_elsewhere()
        if lost is not None:
            rank, number = lost
            name = signal_name(number) or f"signal {number}"
            raise PhraseScorerError(f"rank {rank} of {processes} was killed by {name}; the other ranks were stopped",
                                    hint=f"resume with: {resume_command}" if resume_command else None)
        for rank in range(processes):  # a rank that ran out of something: the others' failures follow from it
            path = os.path.join(failures, f"rank-{rank}.txt{RANK_EXHAUSTED}")
            if os.path.exists(path):
                with open(path, "rb") as failure:
                    error = pickle.load(failure)  # written by the rank into this run's own private folder
                resume = f"; then resume with: {resume_command}" if resume_command else ""
                raise PhraseScorerError(Text(f"rank {rank} of {processes}: ", error.message), path=error.path,
                                        hint=Text(error.hint or "", resume))
        # A rank that ended with a line of its own (an error, an interrupt) said why the job ended: the
        # tracebacks of the others are the lost peer's consequence ("connection closed by peer").
        said = any(code > 0 and rank not in ranks.stopped
                   and not os.path.exists(os.path.join(failures, f"rank-{rank}.txt"))
                   for rank, code in enumerate(codes))
        for rank in range(processes):  # what the ranks did not expect, as they would have shown it
            path = os.path.join(failures, f"rank-{rank}.txt")
            if os.path.exists(path) and not said:
                with open(path, encoding="utf-8") as traceback_text:
                    sys.stderr.write(traceback_text.read())
    finally:
        signal.signal(signal.SIGTERM, previous)
        ranks.kill_running()  # an error here (ranks not all started) leaves none behind
        shutil.rmtree(failures, ignore_errors=True)
    return codes[0] or next((code for code in codes if code), 0)


def device_for_rank(device) -> "torch.device":
    """The device this rank uses: under torchrun, a CUDA device means the GPU of index
    ``LOCAL_RANK`` (one GPU per rank on each machine)."""
    import torch

    device = torch.device(device)
    current = world()
    if current.is_distributed and device.type == "cuda":
        return torch.device("cuda", current.local_rank)
    return device


def shard_lines(total_lines: int, window_lines: int, rank: int, size: int) -> Tuple[int, int]:
    """Lines [start, stop) (0-based) of rank ``rank``'s shard: contiguous whole windows, the
    windows shared out as evenly as they go."""
    windows = -(-total_lines // window_lines)
    first, last = windows * rank // size, windows * (rank + 1) // size
    return min(first * window_lines, total_lines), min(last * window_lines, total_lines)


def shard(items, index: Optional[int] = None, count: Optional[int] = None):
    """This rank's contiguous part of ``items`` (a global batch): sizes differ by at most one."""
    current = world()
    index = current.rank if index is None else index
    count = current.size if count is None else count
    n = len(items)
    start, stop = n * index // count, n * (index + 1) // count
    return items[start:stop]


# --- the process group -------------------------------------------------------------------------


def backend_for(device: "torch.device") -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(device: "torch.device") -> bool:
    """Join the other ranks (from the torchrun environment) when there are several; returns
    whether this call started the process group (and so should end it with :func:`shutdown`)."""
    import torch

    global _control_group
    current = world()
    if not current.is_distributed or torch.distributed.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend=backend_for(device), timeout=COLLECTIVE_TIMEOUT)
    _control_group = None
    log.info("rank %d of %d (%s backend)", current.rank, current.size, backend_for(device))
    return True


def shutdown() -> None:
    import torch

    global _control_group
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _control_group = None


@contextlib.contextmanager
def joined(device: Optional["torch.device"] = None) -> Iterator[World]:
    """The ranks' process group for the duration of a ``with`` block (started here unless it
    already runs; a CPU group unless ``device`` is a GPU); nothing at all in a world of one."""
    import torch

    started = init(device if device is not None else torch.device("cpu"))
    try:
        yield world()
    finally:
        if started:
            shutdown()


def control_group():
    """A gloo group for small CPU messages (the default group itself when it is gloo)."""
    import torch

    global _control_group
    if _control_group is None:
        if torch.distributed.get_backend() == "gloo":
            _control_group = torch.distributed.group.WORLD
        else:
            _control_group = torch.distributed.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    return _control_group


# --- collectives (no-ops in a world of one) -----------------------------------------------------


def barrier() -> None:
    """Wait until every rank gets here."""
    import torch

    if world().is_distributed:
        torch.distributed.barrier(group=control_group())


def broadcast_object(value: Any = None, source: int = 0) -> Any:
    """Rank ``source``'s ``value`` (any picklable object), on every rank."""
    import torch

    if not world().is_distributed:
        return value
    box: List[Any] = [value]
    torch.distributed.broadcast_object_list(box, src=source, group=control_group())
    return box[0]


def all_gather_object(value: Any) -> List[Any]:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank (also a barrier)."""
    import torch

    current = world()
    if not current.is_distributed:
        return [value]
    out: List[Any] = [None] * current.size
    torch.distributed.all_gather_object(out, value, group=control_group())
    return out


def max_over_ranks(values: List[float]) -> List[float]:
    """Element-wise maximum of ``values`` over the ranks (a CPU message)."""
    import torch

    if not world().is_distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=control_group())
    return tensor.tolist()


def sum_over_ranks(tensor: "torch.Tensor") -> "torch.Tensor":
    """The sum of ``tensor`` over the ranks, in place, on its device."""
    import torch

    if world().is_distributed:
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor
