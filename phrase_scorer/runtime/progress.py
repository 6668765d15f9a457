"""Progress bars (tqdm) for long passes over a file.

Bars go to stderr, only when it is a terminal, and never with ``-q``; the library logs a line per
interval whatever happens, so a job running in the background still leaves a trace.
"""

from __future__ import annotations

import sys
import time
from typing import Optional

from tqdm import tqdm

# Set by the command line: None = show bars when stderr is a terminal, False = never, True = always.
show_bars: Optional[bool] = None


def duration(seconds: float) -> str:
    """A time as a person says it: ``42 s``, ``7 min``, ``2 h 05 min``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"


def bars_enabled() -> bool:
    return sys.stderr.isatty() if show_bars is None else show_bars


class FileProgress:
    """Lines done, lines/s and, when the input's size is known, a percentage and an ETA.

    ``source`` is anything with ``bytes_read``, ``size`` and ``lines_read`` attributes (a
    :class:`~phrase_scorer.io.phrase_table.PhraseTableReader`).
    """

    REFRESH_SECONDS = 0.5

    def __init__(self, desc: str, source) -> None:
        self.source = source
        self.start = time.monotonic()
        self.lines = 0
        self._next_refresh = 0.0
        self.bar = None
        if bars_enabled():
            self.bar = tqdm(
                desc=desc,
                total=None,
                unit="B",
                unit_scale=True,
                dynamic_ncols=True,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix} [{elapsed}<{remaining}]",
                file=sys.stderr,
            )

    def advance(self, lines: int = 1) -> None:
        self.lines += lines
        if self.bar is None:
            return
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.REFRESH_SECONDS
        self.refresh(now)

    def refresh(self, now: Optional[float] = None) -> None:
        if self.bar is None:
            return
        now = now or time.monotonic()
        size = getattr(self.source, "size", None)
        if size and self.bar.total != size:
            self.bar.total = size
        self.bar.n = getattr(self.source, "bytes_read", 0)
        rate = self.lines / max(now - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.lines:,} lines, {rate:,.0f} lines/s", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()

    def __enter__(self) -> "FileProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_bar(desc: str, source) -> FileProgress:
    return FileProgress(desc, source)


def step_bar(desc: str, total: Optional[int], initial: int = 0, unit: str = "step"):
    """A plain counter bar (training steps)."""
    return tqdm(
        desc=desc, total=total, initial=initial, unit=unit, dynamic_ncols=True,
        disable=not bars_enabled(), file=sys.stderr,
    )
