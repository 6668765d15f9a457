"""Running under ``torchrun``: who this process is, which part of the work is its own, and the
few collective steps the ranks share.

Nothing else in the package reads ``RANK`` or ``WORLD_SIZE``. A process not started by torchrun
is rank 0 of a world of 1, and none of this starts a process group.

Sharding a table. The ranks split the table into contiguous runs of whole windows (see
:mod:`phrase_scorer.io.table_windows`: window ``k`` is lines ``k * window_lines + 1`` onwards,
whatever process reads it). Each window is scored exactly as one process would score it, so the
parts, joined in rank order, are byte-identical to a one-process run. No line is repeated or
dropped (unlike a ``DistributedSampler``, which pads the last shard with repeated items).
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

# A rank waits this long for the others (the slowest shard) before giving up.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=7)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1  # processes of this job on this machine

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes what the job writes once (the joined output, signatures, logs)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    """This process's place in the job, from the environment torchrun sets."""
    env = os.environ
    size = int(env.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    return World(rank=int(env["RANK"]), size=size, local_rank=int(env.get("LOCAL_RANK", "0")),
                 local_size=int(env.get("LOCAL_WORLD_SIZE", "1")))


def cores_per_process(current: World) -> int:
    """The CPU cores this process may use, sharing the machine with the job's other local ranks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // current.local_size)


def local_device(device):
    """The device this rank uses: under torchrun, a CUDA device means the GPU of index
    ``LOCAL_RANK`` (one GPU per rank on each machine)."""
    import torch

    current = world()
    if current.distributed and torch.device(device).type == "cuda":
        return torch.device("cuda", current.local_rank)
    return torch.device(device)


def shard_lines(total_lines: int, window_lines: int, rank: int, size: int) -> Tuple[int, int]:
    """Lines [start, stop) (0-based) of rank ``rank``'s shard: contiguous whole windows, the
    windows shared out as evenly as they go."""
    windows = -(-total_lines // window_lines)
    first, last = windows * rank // size, windows * (rank + 1) // size
    return min(first * window_lines, total_lines), min(last * window_lines, total_lines)


class ProcessGroup:
    """The job's process group (gloo: the ranks only exchange a few small objects), for the
    duration of a ``with`` block; nothing at all in a world of one."""

    def __init__(self, current: World) -> None:
        self.world = current
        self._started = False

    def __enter__(self) -> "ProcessGroup":
        if self.world.distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
                self._started = True
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            import torch.distributed as dist

            dist.destroy_process_group()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if not self.world.distributed:
            return value
        import torch.distributed as dist

        box: List[Any] = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, value: Any) -> List[Any]:
        """Every rank's ``value``, in rank order, on every rank (also a barrier)."""
        if not self.world.distributed:
            return [value]
        import torch.distributed as dist

        out: List[Any] = [None] * self.world.size
        dist.all_gather_object(out, value)
        return out


# --- training under torchrun: process group, one writer, agreement between ranks ---------------
#
# Many processes under ``torchrun``: rank, world size, one writer, agreement between ranks.
#
# ``torchrun`` starts one process per GPU (or per CPU slot) and tells each its place through the
# environment: ``RANK`` (0 .. WORLD_SIZE-1 over all machines), ``WORLD_SIZE``, ``LOCAL_RANK`` (the
# GPU on its machine), ``MASTER_ADDR`` / ``MASTER_PORT`` (where they meet). Nothing else in the
# package reads these variables. Without them everything here is a one-process no-op, so the same
# code runs alone and under torchrun.
#
# Rank 0 is the *main* process: the one writer of files and logs. The backend is ``nccl`` on CUDA
# and ``gloo`` on a CPU; small control messages (stop requests, agreed clocks) always go through a
# ``gloo`` group, so deciding them never waits on the GPU.

log = logging.getLogger(__name__)

# Collectives wait this long for a peer before failing. Rank 0 may build the pair cache of a
# large table while the others wait at a barrier, so it is long.
TIMEOUT = datetime.timedelta(hours=6)

_control_group: Any = None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def world_size() -> int:
    """How many processes train together (1 when not under torchrun)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def rank() -> int:
    """This process's rank among all of them (0 when not under torchrun)."""
    import torch

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return _env_int("RANK", 0)


def local_rank() -> int:
    """This process's rank on its machine: the GPU it uses."""
    return _env_int("LOCAL_RANK", 0)


def is_distributed() -> bool:
    return world_size() > 1


def is_main() -> bool:
    """True in the one process that writes files and logs."""
    return rank() == 0


def backend_for(device: torch.device) -> str:
    import torch

    return "nccl" if device.type == "cuda" else "gloo"


def device_for_rank(device: torch.device) -> torch.device:
    """Under torchrun on GPUs, each process takes the GPU numbered by its local rank."""
    import torch

    if device.type == "cuda" and is_distributed():
        return torch.device("cuda", local_rank())
    return device


def init(device: torch.device) -> bool:
    """Join the other ranks (from the torchrun environment) when there are several; returns
    whether this call started the process group (and so should end it with :func:`shutdown`)."""
    import torch

    global _control_group
    if not is_distributed() or torch.distributed.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend=backend_for(device), timeout=TIMEOUT)
    _control_group = None
    log.info("rank %d of %d (%s backend)", rank(), world_size(), backend_for(device))
    return True


def shutdown() -> None:
    import torch

    global _control_group
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _control_group = None


def control_group():
    """A gloo group for small CPU messages (the default group itself when it is gloo)."""
    import torch

    global _control_group
    if _control_group is None:
        if torch.distributed.get_backend() == "gloo":
            _control_group = torch.distributed.group.WORLD
        else:
            _control_group = torch.distributed.new_group(backend="gloo", timeout=TIMEOUT)
    return _control_group


def barrier() -> None:
    """Wait until every rank gets here (no-op alone)."""
    import torch

    if is_distributed():
        torch.distributed.barrier(group=control_group())


def broadcast_object(value: Any = None, source: int = 0) -> Any:
    """Rank ``source``'s ``value`` (any picklable object), on every rank."""
    import torch

    if not is_distributed():
        return value
    box: List[Any] = [value]
    torch.distributed.broadcast_object_list(box, src=source, group=control_group())
    return box[0]


def max_over_ranks(values: List[float]) -> List[float]:
    """Element-wise maximum of ``values`` over the ranks (a CPU message; no-op alone)."""
    import torch

    if not is_distributed():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=control_group())
    return tensor.tolist()


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks, in place, on its device (no-op alone)."""
    import torch

    if is_distributed():
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
    return tensor


def shard(items, index: Optional[int] = None, count: Optional[int] = None):
    """This rank's contiguous part of ``items`` (a global batch): sizes differ by at most one."""
    index = rank() if index is None else index
    count = world_size() if count is None else count
    n = len(items)
    start, stop = n * index // count, n * (index + 1) // count
    return items[start:stop]
