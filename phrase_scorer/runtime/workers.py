"""Work spread over threads and worker processes, with bounded queues and the input order kept.

* :class:`Pipeline` runs a producer thread and a consumer thread around the caller's loop
  (read -> work -> write), with bounded queues between them; an error in any of the three stops
  all of them and is raised in the caller's thread.
* :class:`WorkerPool` runs the per-item host work (parsing, id lookup, formatting, compression)
  in worker processes. Item ``i`` goes to worker ``i mod N`` for every one of its stages, so a
  worker can keep what an early stage of an item produced for a later one, and each worker
  answers in the order it was asked: reading worker ``i mod N``'s answers in ``i`` order
  restores the input order without any sorting. The caller bounds how many items are in flight
  (the :class:`Pipeline`'s queues do), so every queue stays small whatever the input's size.

Workers are started with ``spawn``: they import only what their handler needs (torch only if it
scores), and nothing of the parent's threads or locks is copied into them. ``workers=0`` runs
the same handler in the calling threads, one item after another: the same code, without
processes.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError, setting
from phrase_scorer.runtime.heap import steady_heap

POLL_SECONDS = 0.2
ORPHAN_CHECK_SECONDS = 1.0  # how often a worker looks whether its parent is still there
# After a failure or Ctrl-C, how long the writer thread may take to finish the chunk it is writing.
WRITER_STOP_SECONDS = 10


class Stopped(Exception):
    """Raised in a thread waiting on the pipeline after another thread has failed."""


class Pipeline:
    """Runs ``produce`` (reader) and ``consume`` (writer) in threads around the caller's loop.

    Exceptions in any of the three stop the whole pipeline and are raised in the caller's thread.
    """

    DONE = object()

    def __init__(self, depth: int = 2) -> None:
        self.inbox: "queue.Queue" = queue.Queue(maxsize=depth)
        self.outbox: "queue.Queue" = queue.Queue(maxsize=depth)
        self.error: Optional[BaseException] = None
        self.stopping = threading.Event()

    def _put(self, q: "queue.Queue", item) -> bool:
        while not self.stopping.is_set():
            try:
                q.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: "queue.Queue"):
        while True:
            try:
                return q.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self.stopping.is_set() or self.error is not None:
                    return self.DONE

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # handed to the main thread
                if self.error is None and not isinstance(exc, Stopped):
                    self.error = exc
                self.stopping.set()

        return run

    def run(self, produce: Callable[[Callable[[Any], bool]], None], work: Callable[[Any], Any],
            consume: Callable[[Any], None]) -> None:
        with steady_heap():  # the windows in flight are many small objects: collect them less often
            self._run(produce, work, consume)

    def _run(self, produce: Callable[[Callable[[Any], bool]], None], work: Callable[[Any], Any],
             consume: Callable[[Any], None]) -> None:
        def reader() -> None:
            produce(lambda item: self._put(self.inbox, item))
            self._put(self.inbox, self.DONE)

        def writer() -> None:
            while True:
                item = self._get(self.outbox)
                if item is self.DONE:
                    return
                consume(item)

        threads = [
            threading.Thread(target=self._guard(reader), name="phrase-scorer-reader", daemon=True),
            threading.Thread(target=self._guard(writer), name="phrase-scorer-writer", daemon=True),
        ]
        for t in threads:
            t.start()
        try:
            while True:
                item = self._get(self.inbox)
                if item is self.DONE:
                    break
                if not self._put(self.outbox, work(item)):
                    break
            if self.error is None:
                self._put(self.outbox, self.DONE)
                threads[1].join()
        except BaseException as exc:
            self.stopping.set()
            if isinstance(exc, Stopped) and self.error is not None:
                raise self.error from None
            raise
        finally:
            self.stopping.set()
            reader, writer = threads
            writer.join(timeout=WRITER_STOP_SECONDS)  # a chunk being written is finished
            # The reader stops at its next hand-over; one blocked on an input that never comes
            # (a pipe held open) is left behind: it is a daemon thread and holds nothing the
            # caller needs, so Ctrl-C does not wait on the input.
            reader.join(timeout=POLL_SECONDS)
        if self.error is not None:
            raise self.error


def _serve(factory: Callable[..., Any], args: Tuple, inbox, outboxes: Dict[str, Any], parent: int) -> None:
    """A worker process: build the handler, then answer tasks in the order they come; leave
    when told to, or when the parent process is gone (killed). Ctrl-C is the parent's to
    handle: it stops the pool (the worker starts with SIGINT blocked, see :func:`_start_without_sigint`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True).start()
    try:
        handler = factory(*args)
    except BaseException as exc:
        for box in outboxes.values():
            box.put(("error", None, exc))
        return
    while True:
        try:
            task = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                break
            continue
        if task is None:
            break
        method, index, payload = task
        try:
            outboxes[method].put(("ok", index, getattr(handler, method)(index, *payload)))
        except BaseException as exc:  # reported; later tasks are still answered, in order
            outboxes[method].put(("error", index, exc))
    for box in outboxes.values():  # asked to stop: answers nobody will read must not hold up the exit
        box.cancel_join_thread()


def _exit_when_orphaned(parent: int) -> None:
    """Leave at once when the parent process is gone, even while blocked in a read: a parent
    killed in the middle of sending a task leaves a partial message in the pipe, on which the
    read waits forever (holding the parent's standard error open, among others)."""
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_SECONDS)
    os._exit(1)


def _start_without_sigint(process) -> None:
    """Start ``process`` with SIGINT blocked in this thread, so the new interpreter inherits the
    blocked signal: a Ctrl-C in a terminal (sent to every process of the group) then reaches
    only this process, never a worker still importing its modules (which would print a
    traceback). A SIGINT that comes meanwhile stays pending here and is delivered right after."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        process.start()
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class WorkerPool:
    """``workers`` processes, each holding ``factory(*args)``; see the module docstring.

    ``submit(method, i, *payload)`` asks item ``i``'s worker to call ``handler.method(i, *payload)``;
    ``result(method, i)`` returns that call's value (or raises its exception). For each method,
    results must be collected in the order the items were submitted. ``stopping`` (an Event) makes
    a waiting ``result`` give up with :class:`Stopped`.
    """

    def __init__(self, factory: Callable[..., Any], args: Tuple, methods: List[str], workers: int,
                 stopping: Optional[threading.Event] = None) -> None:
        self.workers = workers
        self.stopping = stopping or threading.Event()
        self._inline = factory(*args) if workers == 0 else None
        self._inline_results: Dict[str, "queue.Queue"] = {m: queue.Queue() for m in methods}
        self._processes: List[Any] = []
        self._inboxes: List[Any] = []
        self._outboxes: List[Dict[str, Any]] = []
        if workers:
            context = multiprocessing.get_context("spawn")
            try:
                for n in range(workers):
                    inbox = context.Queue()
                    outboxes = {m: context.Queue() for m in methods}
                    process = context.Process(target=_serve, args=(factory, args, inbox, outboxes, os.getpid()),
                                              name=f"phrase-scorer-worker-{n}", daemon=True)
                    self._inboxes.append(inbox)
                    self._outboxes.append(outboxes)
                    _start_without_sigint(process)
                    self._processes.append(process)
            except BaseException:  # Ctrl-C or a failed start: stop the workers already running
                self.close(failed=True)
                raise

    def submit(self, method: str, index: int, *payload) -> None:
        if self._inline is not None:
            try:
                self._inline_results[method].put(("ok", index, getattr(self._inline, method)(index, *payload)))
            except Exception as exc:
                self._inline_results[method].put(("error", index, exc))
            return
        self._inboxes[index % self.workers].put((method, index, payload))

    def result(self, method: str, index: int):
        if self._inline is not None:
            box, process = self._inline_results[method], None
        else:
            box, process = self._outboxes[index % self.workers][method], self._processes[index % self.workers]
        while True:
            try:
                status, got, value = box.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if self.stopping.is_set():
                    raise Stopped() from None
                if process is not None and not process.is_alive():
                    raise PhraseScorerError(
                        f"a worker process stopped unexpectedly (exit code {process.exitcode})",
                        hint=f"out of memory? run again with {setting('resume', True)}, "
                             f"or with fewer {setting('workers')}",
                    ) from None
        if status == "error":
            raise value
        if got != index:  # would be a bug in the caller's order of submit/result
            raise RuntimeError(f"{method} result for item {got} where item {index} was expected")
        return value

    def close(self, failed: bool = False) -> None:
        """Stop the workers and release the queues. After a success each worker is told to
        leave and finishes; after a failure or Ctrl-C (``failed``) the workers' results are of
        no use, so they are terminated at once. Either way no queue thread is left to hold up
        or disturb this process's exit."""
        for inbox in self._inboxes:
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
        for process in self._processes:
            if failed:
                process.terminate()
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for boxes in [self._inboxes, *[list(o.values()) for o in self._outboxes]]:
            for box in boxes:
                box.cancel_join_thread()
                box.close()
        for process in self._processes:
            if not process.is_alive():
                process.close()  # its pipes and sentinel
        self._processes, self._inboxes, self._outboxes = [], [], []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
