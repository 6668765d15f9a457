"""A job for tests/test_side_by_side.py: it says it began, then waits until a signal stops it,
and records which signal, as a training records its checkpoint before it stops."""

from __future__ import annotations

import signal
import time
from pathlib import Path


def on_stop_signals(handler) -> None:
    """``handler`` for each signal that stops a job: SIGINT, SIGTERM, SIGHUP."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, handler)


def wait_for_a_signal(folder: str, name: str) -> None:
    got = []

    def stop(number, frame):
        got.append(number)
        raise KeyboardInterrupt

    on_stop_signals(stop)
    (Path(folder) / f"{name}.began").write_text("")
    try:
        while True:
            time.sleep(0.05)
    finally:
        (Path(folder) / f"{name}.stopped").write_text(",".join(map(str, got)))


def hold_until_released(folder: str, name: str) -> None:
    """Like :func:`wait_for_a_signal`, but once stopped it goes on until the file ``release``
    exists in ``folder``: a job still writing its checkpoint after its command has gone."""
    got = []

    def stop(number, frame):
        got.append(number)

    on_stop_signals(stop)
    (Path(folder) / f"{name}.began").write_text("")
    while not got:
        time.sleep(0.05)
    (Path(folder) / f"{name}.stopping").write_text(",".join(map(str, got)))
    while not (Path(folder) / "release").exists():
        time.sleep(0.05)


def autogroup_niceness() -> str:
    """What the job's scheduler group says of itself (``/autogroup-N nice K``)."""
    return Path("/proc/self/autogroup").read_text()
