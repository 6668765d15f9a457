"""CPU threads of a command that runs a model: how many, and whether the machine is busy."""

from __future__ import annotations

import logging
import os
import time
from typing import Optional, Sequence

from phrase_scorer.errors import setting

log = logging.getLogger(__name__)


def other_running_tasks(samples: int = 5, interval: float = 0.01) -> Optional[int]:
    """How many threads of other programs are running or waiting for a core right now.

    Read from the kernel's count of runnable tasks (``/proc/loadavg``, this process excluded),
    the least of a few samples; ``None`` where the kernel does not say. Unlike the one-minute
    load average, it does not count a command that has just finished.
    """
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return None
        counts.append(running - 1)
        if counts[-1] <= 0:
            break
        if i + 1 < samples:
            time.sleep(interval)
    return min(counts)


ONE_THREAD_PARAMETERS = 1_000_000  # a CPU scores a model smaller than this fastest on one thread


def default_threads(models: Sequence, cores: int) -> int:
    """CPU threads for scoring with ``models`` when the user gives none: all ``cores``, or one
    when every model has fewer than :data:`ONE_THREAD_PARAMETERS` parameters (the ``tiny``
    preset has about 30,000). Such a model's operations are too small to gain from a second
    thread, and a waiting thread still takes a core from the processes that read and write
    (docs/benchmarks.md, "Annotate's ceiling": one thread is faster with workers and without)."""
    if models and all(sum(p.numel() for p in m.parameters()) < ONE_THREAD_PARAMETERS for m in models):
        return 1
    return cores


def set_threads(threads: Optional[int], models: Sequence = ()) -> None:
    """By default all the cores this process may use (its CPU affinity, shared with the job's
    other ranks on the machine under torchrun): the same count every run, so results repeat
    exactly; one thread for scoring with ``models`` too small to gain from more
    (:func:`default_threads`). On a busy machine PyTorch's threads wait on
    each other and run far slower: say so."""
    import torch

    from phrase_scorer.runtime.distributed import cores_per_process

    cores = cores_per_process()
    if threads is None:
        threads = default_threads(models, cores)
        machine = os.cpu_count() or 1
        busy = other_running_tasks()
        if threads > 1 and busy is not None and busy > 0.75 * machine:
            log.warning("this machine is busy (%d other tasks running on %d cores); if this runs slowly, give it fewer "
                        "threads with %s", busy, machine,
                        setting("threads", max(1, min(cores, round(machine - busy)))))
    torch.set_num_threads(threads)
