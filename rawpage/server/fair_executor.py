"""The preprocessing threads (JSON of large bodies, chat templates, tokenization), shared
fairly among callers (issue 44 item 5).

Each job is queued under its caller: the API key, or the client's address on a server
without keys. The threads take the callers' queues in turn (round robin), so a caller
with a hundred jobs waiting delays another caller's one job by at most the jobs already
running, not by the hundred. Each caller may have --max-tokenizer-queue-per-key jobs
waiting; its next request is a 429 until one is taken.

    key A: [a1 a2 a3 ...] ─┐
    key B: [b1 b2 ...]    ─┼─ in turn: a1 b1 c1 a2 b2 a3 ... ─► --preprocess threads
    key C: [c1]           ─┘
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

_Job = tuple[Future, Callable[..., Any], tuple[Any, ...]]


class QueueFull(Exception):
    """The caller already has its limit of jobs waiting."""


class FairExecutor:
    def __init__(self, threads: int, max_waiting_per_key: int, name: str) -> None:
        self.max_waiting_per_key = max_waiting_per_key
        self._cv = threading.Condition()
        # A key is in _queues (with a non-empty queue) exactly when it is in _turns.
        self._queues: dict[Hashable, deque[_Job]] = {}
        self._turns: deque[Hashable] = deque()  # keys with jobs waiting, in the order they are served
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, key: Hashable, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue fn(*args) under `key`; QueueFull if the key has its limit waiting."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the preprocessing threads have shut down")
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
                self._turns.append(key)
            elif len(queue) >= self.max_waiting_per_key:
                raise QueueFull(len(queue))
            queue.append((future, fn, args))
            self._cv.notify()
        return future

    def _next(self) -> _Job | None:
        """The next key's oldest job (the key goes to the back of the turns), or None once closed."""
        with self._cv:
            while not self._turns:
                if self._closed:
                    return None
                self._cv.wait()
            key = self._turns.popleft()
            queue = self._queues[key]
            job = queue.popleft()
            if queue:
                self._turns.append(key)
            else:
                del self._queues[key]
            return job

    def _work(self) -> None:
        while (job := self._next()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():  # its request went away while it waited
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 - the waiting handler re-raises it
                future.set_exception(e)
            else:
                future.set_result(result)

    def shutdown(self) -> None:
        """Cancel the waiting jobs; the threads end after their running ones."""
        with self._cv:
            self._closed = True
            for queue in self._queues.values():
                for future, _, _ in queue:
                    future.cancel()
            self._queues.clear()
            self._turns.clear()
            self._cv.notify_all()
