"""Many processes under ``torchrun``: rank, world size, one writer, agreement between ranks.

``torchrun`` starts one process per GPU (or per CPU slot) and tells each its place through the
environment: ``RANK`` (0 .. WORLD_SIZE-1 over all machines), ``WORLD_SIZE``, ``LOCAL_RANK`` (the
GPU on its machine), ``MASTER_ADDR`` / ``MASTER_PORT`` (where they meet). Nothing else in the
package reads these variables. Without them everything here is a one-process no-op, so the same
code runs alone and under torchrun.

Rank 0 is the *main* process: the one writer of files and logs. The backend is ``nccl`` on CUDA
and ``gloo`` on a CPU; small control messages (stop requests, agreed clocks) always go through a
``gloo`` group, so deciding them never waits on the GPU.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any, List, Optional

import torch

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
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return _env_int("WORLD_SIZE", 1)


def rank() -> int:
    """This process's rank among all of them (0 when not under torchrun)."""
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
    return "nccl" if device.type == "cuda" else "gloo"


def device_for_rank(device: torch.device) -> torch.device:
    """Under torchrun on GPUs, each process takes the GPU numbered by its local rank."""
    if device.type == "cuda" and is_distributed():
        return torch.device("cuda", local_rank())
    return device


def init(device: torch.device) -> bool:
    """Join the other ranks (from the torchrun environment) when there are several; returns
    whether this call started the process group (and so should end it with :func:`shutdown`)."""
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
    global _control_group
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _control_group = None


def control_group():
    """A gloo group for small CPU messages (the default group itself when it is gloo)."""
    global _control_group
    if _control_group is None:
        if torch.distributed.get_backend() == "gloo":
            _control_group = torch.distributed.group.WORLD
        else:
            _control_group = torch.distributed.new_group(backend="gloo", timeout=TIMEOUT)
    return _control_group


def barrier() -> None:
    """Wait until every rank gets here (no-op alone)."""
    if is_distributed():
        torch.distributed.barrier(group=control_group())


def broadcast_object(value: Any = None, source: int = 0) -> Any:
    """Rank ``source``'s ``value`` (any picklable object), on every rank."""
    if not is_distributed():
        return value
    box: List[Any] = [value]
    torch.distributed.broadcast_object_list(box, src=source, group=control_group())
    return box[0]


def max_over_ranks(values: List[float]) -> List[float]:
    """Element-wise maximum of ``values`` over the ranks (a CPU message; no-op alone)."""
    if not is_distributed():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=control_group())
    return tensor.tolist()


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over the ranks, in place, on its device (no-op alone)."""
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
