"""AsyncEngine: the LLMEngine stepping in one background thread, with an asyncio face.

HTTP handlers never touch the engine directly. They put commands (add, abort)
in a thread-safe inbox; the engine thread drains the inbox between steps, runs
`step()`, and pushes each RequestOutput into the asyncio.Queue of the request
it belongs to, on that request's event loop. A handler that stops listening
(the client disconnected) aborts its request, and the engine frees the blocks
on its next iteration.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from rawpage.engine import LLMEngine, PromptType
from rawpage.engine_args import EngineArgs
from rawpage.outputs import RequestOutput
from rawpage.sampling_params import SamplingParams

logger = logging.getLogger("rawpage.server")


class EngineDeadError(RuntimeError):
    """The engine thread failed; the server can no longer generate."""


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def put(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class AsyncEngine:
    def __init__(
        self,
        args: EngineArgs,
        on_step: Callable[[LLMEngine, list[RequestOutput]], None] | None = None,
    ):
        self.args = args
        self.engine: LLMEngine | None = None
        self.error: BaseException | None = None  # why the engine thread stopped, if it did
        self.on_step = on_step  # metrics hook, called in the engine thread after every step
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rawpage-engine", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout)

    @property
    def is_ready(self) -> bool:
        return self.engine is not None and self.error is None

    @property
    def is_loading(self) -> bool:
        return self.engine is None and self.error is None

    # --- called from the event loop ------------------------------------------------------
    async def generate(self, request_id: str, prompt: PromptType, params: SamplingParams,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:  # fmt: skip
        """Yield this request's outputs until it finishes. Leaving early aborts it."""
        if self.error is not None:
            raise EngineDeadError(f"the engine has stopped: {self.error}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        self._inbox.put(("add", request_id, prompt, params, priority, time.monotonic()))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    # --- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.engine = LLMEngine(self.args)
        except BaseException as e:  # noqa: BLE001 - reported through /health and the log
            self.error = e
            logger.error("engine failed to start: %s", e)
            return
        try:
            while not self._stop.is_set():
                self._drain_inbox(block=not self.engine.has_unfinished_requests())
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    if self.on_step is not None:  # metrics first: a client that got its output sees it counted
                        self.on_step(self.engine, outputs)
                    for out in outputs:
                        stream = self._streams.get(out.request_id)
                        if stream is not None:
                            stream.put(out)
        except BaseException as e:  # noqa: BLE001 - every waiting request must hear about it
            self.error = e
            logger.error("engine step failed; the server is now unhealthy\n%s", traceback.format_exc())
            dead = EngineDeadError(f"the engine failed: {type(e).__name__}: {e}")
            for stream in list(self._streams.values()):
                stream.put(dead)

    def _drain_inbox(self, block: bool) -> None:
        """Apply queued adds and aborts. With nothing to run, sleep until a command comes."""
        try:
            cmd = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        engine = self.engine
        if cmd[0] == "add":
            _, rid, prompt, params, priority, arrival = cmd
            stream = self._streams.get(rid)
            if stream is None:  # the client left before we got to it
                return
            try:
                engine.add_request(rid, prompt, params, arrival_time=arrival, priority=priority)
            except ValueError as e:
                stream.put(e)
        elif cmd[0] == "abort":
            engine.abort_request(cmd[1])
