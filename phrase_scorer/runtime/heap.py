"""Python's cycle collector during a streaming loop.

A streaming verb keeps a few windows of parsed lines alive (tens of thousands of small lists and
records) beside everything torch and the models put on the heap when they load. CPython's
collector runs after every 700 new containers and, every so often, walks all of them while it
holds the interpreter lock, stopping the scoring threads too: rescoring 30,000 n-best lines with
a `small` model on 2 threads took 9.0 s with the default collector and 8.2 s with the objects
that exist before the loop set aside (``gc.freeze``) and collections 14 times rarer
(docs/benchmarks.md, "Rescoring"). Nothing is left uncollected: garbage made in the loop is
collected as before, only less often, and the objects set aside are handed back after it.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

# Containers allocated between two collections of the youngest generation (CPython's default: 700).
YOUNG_THRESHOLD = 10_000

_lock = threading.Lock()
_depth = 0
_saved: tuple = ()
_froze = False


@contextmanager
def steady_heap() -> Iterator[None]:
    """Inside: the objects that exist on entry are left out of collections, and the youngest
    generation is collected every :data:`YOUNG_THRESHOLD` containers. Nested and concurrent uses
    share one setting; the last to leave restores the collector as it was."""
    global _depth, _saved, _froze
    with _lock:
        if _depth == 0:
            _saved = gc.get_threshold()
            _froze = gc.get_freeze_count() == 0  # another owner's frozen objects stay frozen
            if _froze:
                gc.freeze()
            gc.set_threshold(max(YOUNG_THRESHOLD, _saved[0]), *_saved[1:])
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved)
                if _froze:
                    gc.unfreeze()
