"""Work done ahead in a background thread: the next training batches are read from the pair
cache, padded and turned into (pinned) tensors while the current step runs.

:class:`Prefetcher` applies ``make`` to each item of an iterator in one thread, at most ``depth``
items ahead, and hands the results over in order. An error in the thread is raised in the
consumer, and closing it (leaving the ``with`` block) stops the thread. With ``depth`` 0 there
is no thread: each item is made when it is asked for.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterator, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[Item, Result]):
    POLL_SECONDS = 0.1

    def __init__(self, items: Iterator[Item], make: Callable[[Item], Result], depth: int = 2) -> None:
        self._items, self._make = items, make
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = None
        if depth > 0:
            self._thread = threading.Thread(target=self._work, name="prefetch", daemon=True)
            self._thread.start()

    def _put(self, value) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=self.POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            for item in self._items:
                if not self._put(self._make(item)):
                    return
            self._put(_DONE)
        except BaseException as exc:  # handed to the consumer
            self._put(_Failure(exc))

    def __iter__(self) -> "Prefetcher[Item, Result]":
        return self

    def __next__(self) -> Result:
        if self._thread is None:
            return self._make(next(self._items))
        value = self._queue.get()
        if value is _DONE:
            self._queue.put(_DONE)
            raise StopIteration
        if isinstance(value, _Failure):
            raise value.error
        return value

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> "Prefetcher[Item, Result]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
