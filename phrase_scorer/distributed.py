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
import os
from dataclasses import dataclass
from typing import Any, List, Tuple

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
