"""Run the phrase-scorer command line, halting at a chosen point until the test kills it.

Interruption tests must not depend on how fast the machine is: instead of killing a run after
some time, they run it through this script, which stops it at an exact point and tells the test
by creating a file; the test then sends its signal to a process that cannot have moved on, and
may let it go on by removing the file (to see what the signal does at that exact point).

    python tests/pause_at.py POINT READY_FILE -- ARGS...     (ARGS as for phrase-scorer)

POINT is one of
    write:PATH:N:FRACTION   the N-th write of output data to PATH (the final name; 1-based, one chunk each):
                            the first FRACTION of its bytes are written and flushed, then it halts
                            (a torn chunk, as a kill in the middle of a write leaves it)
    step:N                  training, just before step N+1 runs (N steps done)
    none                    run to the end

Nothing in the package knows about this script: it replaces two methods before calling the CLI.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def halt(ready: Path) -> None:
    """Create ``ready``, then wait until the test kills the process or removes ``ready`` (go on)."""
    ready.write_text(f"{os.getpid()}\n")
    while ready.exists():
        time.sleep(0.02)


def install(point: str, ready: Path) -> None:
    kind, _, spec = point.partition(":")
    if kind == "none":
        return
    if kind == "write":
        from phrase_scorer.io import atomic

        path, n, fraction = spec.rsplit(":", 2)
        target, count, cut = os.path.abspath(path), int(n), float(fraction)
        original = atomic.AtomicOutput.write
        seen = {"writes": 0}

        def write(self, data: bytes) -> None:
            if os.path.abspath(self.path) == target:
                seen["writes"] += 1
                if seen["writes"] == count:
                    first = int(len(data) * cut)
                    original(self, data[:first])
                    self.file.flush()
                    halt(ready)
                    data = data[first:]  # let go on: the rest of the chunk
            original(self, data)

        atomic.AtomicOutput.write = write
    elif kind == "step":
        from phrase_scorer.training import loop as train

        step = int(spec)
        original_step = train.TrainingLoop.train_step

        def train_step(self, batch):
            if self.state.step == step:
                halt(ready)
            return original_step(self, batch)

        train.TrainingLoop.train_step = train_step
    else:
        raise SystemExit(f"unknown point {point!r}")


def main() -> None:
    point, ready, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: pause_at.py POINT READY_FILE -- ARGS..."
    install(point, Path(ready))
    from phrase_scorer.cli import main as cli_main

    sys.argv = ["phrase-scorer", *args]
    cli_main()


if __name__ == "__main__":
    main()
