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
processes. The parent supervises its workers (started and reaped by
:mod:`phrase_scorer.runtime.supervisor`): a worker that dies is reported at once, naming it and
how it ended, and a run that ends for any reason stops and reaps every worker.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Dict, List, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.runtime.heap import steady_heap
from phrase_scorer.runtime.supervisor import (RUN_SIGNALS, how_it_ended, leave_when_parent_gone, reap_workers,
                                              start_worker)

POLL_SECONDS = 0.2
# After a failure or Ctrl-C, how long the writer thread may take to finish the chunk it is writing.
WRITER_STOP_SECONDS = 10


class Stopped(Exception):
    """Raised in a thread waiting on the pipeline after another thread has failed."""


def default_workers(cores: int) -> int:
    """Worker processes for a command's host work: all the cores (the scorer's threads and the
    workers take turns), at least one, at most 8 (about 1M lines/s, past what a GPU scores)."""
    return max(1, min(8, cores))


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
            reading, writing = threads
            writing.join(timeout=WRITER_STOP_SECONDS)  # a chunk being written is finished
            # The reader stops at its next hand-over; one blocked on an input that never comes
            # (a pipe held open) is left behind: it is a daemon thread and holds nothing the
            # caller needs, so Ctrl-C does not wait on the input.
            reading.join(timeout=POLL_SECONDS)
        if self.error is not None:
            raise self.error


class _Inbox:
    """A worker's end of its task pipe, read as a queue: ``get`` waits at most ``timeout`` seconds."""

    def __init__(self, connection) -> None:
        self.connection = connection

    def get(self, timeout: float):
        if not self.connection.poll(timeout):
            raise queue.Empty
        return self.connection.recv()


def _serve(factory: Callable[..., Any], args: Tuple, inbox, answers, parent: int) -> None:
    """A worker process: build the handler, then answer tasks in the order they come, each as
    ``(method, status, index, value)`` on ``answers``; leave when told to, or when the parent
    process is gone (killed). The signals that end a whole run (:data:`RUN_SIGNALS`) are the
    parent's to handle: it stops the pool (the worker starts with them blocked, see
    :func:`~phrase_scorer.runtime.supervisor.start_worker`), and only the parent says how the run
    ended. A worker whose parent is gone leaves at once, even while blocked in a read: a parent
    killed in the middle of sending a task leaves a partial message in the pipe, on which the read
    waits forever (holding the parent's standard error open, among others)."""
    for number in RUN_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    leave_when_parent_gone(parent)
    try:
        handler = factory(*args)
    except BaseException as exc:
        _answer(answers, (None, "error", None, exc))  # every waiting method gets it
        return
    while True:
        try:
            task = inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                break
            continue
        except (EOFError, OSError):  # the parent closed the pipe: nothing more will come
            break
        if task is None:
            break
        method, index, payload = task
        try:
            answer = (method, "ok", index, getattr(handler, method)(index, *payload))
        except BaseException as exc:  # reported; later tasks are still answered, in order
            answer = (method, "error", index, exc)
        if not _answer(answers, answer):
            break


def _answer(answers, answer: Tuple) -> bool:
    """Send ``answer`` to the parent; False when the parent no longer reads (it is gone).
    An answer that cannot be pickled is sent as the error it raised."""
    method, _, index, _ = answer
    try:
        data = ForkingPickler.dumps(answer)
    except Exception as exc:
        data = ForkingPickler.dumps((method, "error", index, RuntimeError(f"the answer cannot be sent: {exc!r}")))
    try:
        answers.send_bytes(data)
        return True
    except OSError:
        return False


class WorkerPool:
    """``workers`` processes, each holding ``factory(*args)``; see the module docstring.

    ``submit(method, i, *payload)`` asks item ``i``'s worker to call ``handler.method(i, *payload)``;
    ``result(method, i)`` returns that call's value (or raises its exception). For each method,
    results must be collected in the order the items were submitted. ``stopping`` (an Event) makes
    a waiting ``result`` give up with :class:`Stopped`.

    Each worker has a task pipe and an answer pipe, and two threads here: one sends the tasks
    (``submit`` never blocks), one receives the answers as they come (a worker never waits to
    hand one over) and waits on the worker's exit as well. A worker that dies (killed by the
    OOM killer, say) is seen at once, whatever it was doing, even in the middle of an answer:
    ``result`` then raises an error naming the worker and how it ended. The pool uses plain
    pipes, no locks or semaphores shared between processes, so nothing depends on
    multiprocessing's resource tracker once the workers have started.
    """

    GONE = "gone"  # an answer's status: the worker has ended

    def __init__(self, factory: Callable[..., Any], args: Tuple, methods: List[str], workers: int,
                 stopping: Optional[threading.Event] = None) -> None:
        self.workers = workers
        self.stopping = stopping or threading.Event()
        self._inline = factory(*args) if workers == 0 else None
        self._inline_results: Dict[str, "queue.Queue"] = {m: queue.Queue() for m in methods}
        self._processes: List[Any] = []
        self._tasks: List["queue.Queue"] = []  # per worker: pickled tasks for its sender thread
        self._answers: List[Dict[str, "queue.Queue"]] = []  # per worker and method: its answers
        self._connections: List[Any] = []
        self._threads: List[threading.Thread] = []
        self._reaping = threading.Lock()  # one thread at a time waits for a worker's exit status
        if workers:
            try:
                for n in range(workers):
                    task_out, task_in = multiprocessing.Pipe(duplex=False)  # (reader, writer)
                    answer_out, answer_in = multiprocessing.Pipe(duplex=False)
                    self._connections += [task_in, answer_out, task_out, answer_in]
                    process = start_worker(_serve, (factory, args, _Inbox(task_out), answer_in, os.getpid()),
                                           name=f"phrase-scorer-worker-{n + 1}")
                    self._processes.append(process)
                    task_out.close()  # the worker's ends: a worker that dies closes them for good
                    answer_in.close()
                    self._tasks.append(queue.Queue())
                    self._answers.append({m: queue.Queue() for m in methods})
                    self._threads += [
                        threading.Thread(target=self._send, args=(task_in, self._tasks[n]),
                                         name=f"phrase-scorer-tasks-{n + 1}", daemon=True),
                        threading.Thread(target=self._receive, args=(answer_out, process, self._answers[n]),
                                         name=f"phrase-scorer-answers-{n + 1}", daemon=True),
                    ]
                    for thread in self._threads[-2:]:
                        thread.start()
            except BaseException:  # Ctrl-C or a failed start: stop the workers already running
                self.close(failed=True)
                raise

    @staticmethod
    def _send(connection, tasks: "queue.Queue") -> None:
        """A worker's sender thread: its tasks, in order, until told to stop (None) or the worker
        is gone. SIGPIPE is blocked in this thread, so a write to a dead worker fails here instead
        of ending the process (the command line restores SIGPIPE's default action)."""
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        while True:
            data = tasks.get()
            if data is None:
                return
            try:
                connection.send_bytes(data)
            except OSError:  # the worker is gone; its answers' thread says so
                if hasattr(signal, "sigtimedwait"):
                    signal.sigtimedwait({signal.SIGPIPE}, 0)
                return

    @classmethod
    def _receive(cls, connection, process, answers: Dict[str, "queue.Queue"]) -> None:
        """A worker's answers' thread: hand each answer to its method's queue as it comes, and
        once the worker has ended (its pipe is closed, or its process has exited with nothing
        left to read) tell every method's queue so."""
        from multiprocessing.connection import wait

        while True:
            try:
                if connection not in wait([connection, process.sentinel]):
                    break  # the process has exited and nothing is left to read
                method, status, index, value = connection.recv()
            except (EOFError, OSError):  # closed: the worker has ended, maybe in the middle of an answer
                break
            for name in answers if method is None else [method]:
                answers[name].put((status, index, value))
        for box in answers.values():
            box.put((cls.GONE, None, None))

    def submit(self, method: str, index: int, *payload) -> None:
        if self._inline is not None:
            try:
                self._inline_results[method].put(("ok", index, getattr(self._inline, method)(index, *payload)))
            except Exception as exc:
                self._inline_results[method].put(("error", index, exc))
            return
        self._tasks[index % self.workers].put(ForkingPickler.dumps((method, index, payload)))

    def result(self, method: str, index: int):
        n = index % self.workers if self._inline is None else None
        box = self._inline_results[method] if n is None else self._answers[n][method]
        while True:
            try:
                status, got, value = box.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if self.stopping.is_set():
                    raise Stopped() from None
        if status == self.GONE:
            box.put((status, got, value))  # for any later reader of this method
            assert n is not None  # only a worker process ends: the inline handler has no end
            raise self._ended(n)
        if status == "error":
            raise value
        if got != index:  # would be a bug in the caller's order of submit/result
            raise RuntimeError(f"{method} result for item {got} where item {index} was expected")
        return value

    def _ended(self, n: int) -> PhraseScorerError:
        """The error of worker ``n``'s end, once its answers' thread has seen it."""
        process = self._processes[n]
        with self._reaping:
            process.join(timeout=WRITER_STOP_SECONDS)  # its pipe closes as it exits: the status comes at once
            exitcode = process.exitcode
        hint = (Text("if memory is short, run with fewer ", setting("workers"))
                if exitcode == -getattr(signal, "SIGKILL", 9) else None)
        return PhraseScorerError(f"worker {n + 1} {how_it_ended(exitcode)}", hint=hint)

    def close(self, failed: bool = False) -> None:
        """Stop the workers and release the pipes. After a success each worker is told to leave
        and finishes; after a failure or Ctrl-C (``failed``) the workers' results are of no use,
        so they are killed at once (a worker ignores the signals that end a run: the pool stops
        it). Either way every worker is reaped, and no thread is left to hold up or disturb this
        process's exit."""
        for tasks in self._tasks:
            if not failed:
                tasks.put(ForkingPickler.dumps(None))  # the task that tells the worker to leave
            tasks.put(None)  # the sender thread's end
        with self._reaping:
            reap_workers(self._processes, at_once=failed)
        for thread in self._threads:  # the pipes' other ends are closed: each ends at once
            if thread.ident is not None:  # one that could not start (no memory for its stack) is not waited for
                thread.join(timeout=5)
        for connection in self._connections:
            connection.close()
        for process in self._processes:
            process.close()  # its sentinel
        self._processes, self._tasks, self._answers, self._connections, self._threads = [], [], [], [], []

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

