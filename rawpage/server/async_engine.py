"""AsyncEngine: the LLMEngine stepping in one background thread, with an asyncio face.

HTTP handlers never touch the engine directly: they read its EngineInfo
(engine_info.py) and put commands (add, abort, adapters) in a thread-safe inbox; the engine thread drains the inbox between steps, runs
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
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from rawpage.backends.cpu_malloc import keep_freed_memory
from rawpage.backends.cpu_threads import IDLE_TICK_S
from rawpage.engine import LLMEngine, PromptType
from rawpage.engine_args import EngineArgs
from rawpage.errors import CONFIG_ERRORS
from rawpage.lora import LoRAAdapter, LoRARequest
from rawpage.outputs import RequestOutput
from rawpage.pooling.pooler import PoolingParams
from rawpage.pooling.pooling_engine import new_engine
from rawpage.request_checks import CheckedPrompt
from rawpage.sampling_params import SamplingParams
from rawpage.server.engine_info import EngineInfo
from rawpage.server.protocol import APIError

logger = logging.getLogger("rawpage.server")


T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine thread failed; the server can no longer generate."""


class RequestFailedError(RuntimeError):
    """The engine failed this one request (and freed its blocks); it serves the others on."""


class _Stream:
    """One request's outputs, from the engine thread to its handler on the event loop.

    Outputs are cumulative with per-step deltas, so unread ones are merged into one
    (deltas joined, the rest from the newest): a client that reads slowly costs one
    output's memory, not one per step. A client that leaves more than `max_unread`
    tokens unread is cut off."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_unread: int) -> None:
        self.loop, self.max_unread = loop, max_unread
        self.ready = asyncio.Event()
        self._lock = threading.Lock()
        self._pending: RequestOutput | BaseException | None = None
        self.owner: str | None = None  # the key_id of the API key that sent it (engine view)

    def put(self, item: RequestOutput | BaseException) -> bool:
        """Engine thread. False if the reader fell too far behind (the caller aborts it)."""
        with self._lock:
            if isinstance(self._pending, BaseException):
                return True  # an error is already waiting; it is the last word
            if isinstance(item, RequestOutput) and isinstance(self._pending, RequestOutput):
                item = _merge(self._pending, item)
            self._pending = item
            behind = isinstance(item, RequestOutput) and sum(len(o.delta_token_ids) for o in item.outputs)
        self.loop.call_soon_threadsafe(self.ready.set)
        return not behind or behind <= self.max_unread

    async def get(self) -> RequestOutput:
        while True:
            await self.ready.wait()
            self.ready.clear()
            with self._lock:
                item, self._pending = self._pending, None
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                return item


class RequestStream:
    """The async iterator `AsyncEngine.generate` returns: one request's outputs until it
    finishes. Closed early, or garbage-collected without being read to the end, it aborts
    the request, so a client that left never costs compute."""

    def __init__(self, engine: AsyncEngine, request_id: str, stream: _Stream) -> None:
        self.engine, self.request_id, self.stream = engine, request_id, stream
        self.done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.done:
            raise StopAsyncIteration
        try:
            out = await self.stream.get()
        except BaseException:
            self._close()
            raise
        if out.finished:
            self.done = True
            self.engine._streams.pop(self.request_id, None)
        return out

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if not self.done:
            self.done = True
            self.engine._streams.pop(self.request_id, None)
            self.engine.abort(self.request_id)

    def __del__(self) -> None:
        self._close()


def _merge(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """`new` carrying the deltas of both (cumulative fields are already newest in `new`)."""
    prev = {o.index: o for o in old.outputs}
    for o in new.outputs:
        p = prev.get(o.index)
        if p is not None:
            o.delta_text = p.delta_text + o.delta_text
            o.delta_token_ids = p.delta_token_ids + o.delta_token_ids
            if o.delta_logprobs is not None and p.delta_logprobs is not None:
                o.delta_logprobs = p.delta_logprobs + o.delta_logprobs
    return new


class AsyncEngine:
    def __init__(
        self,
        args: EngineArgs,
        on_step: Callable[[LLMEngine, list[RequestOutput]], None] | None = None,
        max_waiting_requests: int | None = None,
        request_timeout: float | None = None,
        max_unread_tokens: int = 8192,
        log_requests: bool = True,
    ) -> None:
        self.args = args
        self.log_requests = log_requests  # one log line per request (--disable-log-requests)
        self.max_waiting_requests = max_waiting_requests
        self.request_timeout = request_timeout
        self.max_unread_tokens = max_unread_tokens
        self._num_waiting = 0  # in the scheduler's queue at the last step (engine thread writes)
        # Adds sent by handlers minus adds taken by the engine thread; each counter has one writer.
        self._adds_sent = self._adds_taken = 0
        self._deadlines: dict[str, float] = {}  # engine thread: request id -> when to abort it
        self._engine: LLMEngine | None = None  # the engine thread's alone
        self.info: EngineInfo | None = None  # what handlers may read of it, once loaded
        self.error: BaseException | None = None  # why the engine thread stopped, if it did
        self.on_step = on_step  # metrics hook, called in the engine thread after every step
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rawpage-engine", daemon=True)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        # Before the engine thread's first malloc, which picks its arena: a thread that
        # allocates before ARENA_MAX=1 holds an arena of 64 MB heaps, and every larger block
        # (a vision encoder's 64-70 MB temporaries) is mapped and faulted in afresh.
        keep_freed_memory()
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout)

    @property
    def is_loading(self) -> bool:
        return self.info is None and self.error is None

    @property
    def failed_to_start(self) -> bool:
        return self.info is None and self.error is not None

    # --- called from the event loop ------------------------------------------------------
    def check_capacity(self, count: int = 1) -> None:
        """Refuse early (429) when the queue already holds --max-waiting-requests."""
        limit = self.max_waiting_requests
        if limit is not None and self._num_waiting + self._adds_sent - self._adds_taken + count > limit:
            raise APIError(
                f"the server is at capacity ({limit} requests waiting, --max-waiting-requests); retry shortly",
                429,
                type="rate_limit_error",
                headers={"Retry-After": "1"},
            )

    def generate(
        self,
        request_id: str,
        prompt: CheckedPrompt,
        lora_request: LoRARequest | None = None,
        owner: str | None = None,
    ) -> RequestStream:
        """Queue a request that passed EngineInfo.check_prompt now (the engine thread adds it
        without checking it again) and return the stream of its outputs. Leaving the stream
        early (closing it, or dropping it unread) aborts the request. `owner` names the
        tenant (an API key's key_id) that the engine view shows it to."""
        if self.error is not None:
            raise EngineDeadError("the engine has stopped; see the server log")
        params = prompt.params
        if self.log_requests:
            logger.info(
                "request %s: max_tokens %s, temperature %g, n %d",
                request_id,
                params.max_tokens,
                params.temperature,
                params.n,
            )
        return self._submit(request_id, prompt, params, prompt.priority, lora_request, owner)

    def encode(
        self, request_id: str, prompt: PromptType, params: PoolingParams, priority: int = 0, owner: str | None = None
    ) -> RequestStream:
        """vLLM's name: queue one input to pool (a --runner pooling engine); its stream ends
        with one EmbeddingRequestOutput."""
        if self.error is not None:
            raise EngineDeadError("the engine has stopped; see the server log")
        if self.log_requests:
            logger.info("request %s: embedding, dimensions %s", request_id, params.dimensions)
        return self._submit(request_id, prompt, params, priority, None, owner)

    def _submit(
        self,
        request_id: str,
        prompt: PromptType | CheckedPrompt,
        params: SamplingParams | PoolingParams,
        priority: int,
        lora_request: LoRARequest | None,
        owner: str | None,
    ) -> RequestStream:
        stream = _Stream(asyncio.get_running_loop(), self.max_unread_tokens)
        stream.owner = owner
        self._streams[request_id] = stream
        self._adds_sent += 1  # counted at once, so a burst cannot slip past check_capacity
        self._inbox.put(("add", request_id, prompt, params, priority, time.time(), lora_request))
        return RequestStream(self, request_id, stream)

    def owner_of(self, request_id: str) -> str | None:
        """Any thread: the tenant of a request still streaming, else None (shown to no tenant)."""
        stream = self._streams.get(request_id)
        return stream.owner if stream is not None else None

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def call_in_engine_thread(self, fn: Callable[[LLMEngine], None]) -> None:
        """Run fn(engine) in the engine thread between two steps, where it may read any state
        (an observer: the engine view's refresh)."""
        self._inbox.put(("call", fn))

    async def add_lora(self, adapter: LoRAAdapter, replaces: LoRAAdapter | None = None) -> None:
        """Make a loaded adapter known by its name, in place of `replaces` if that is still
        the one known by it, between two steps (LoRAError if it cannot be)."""
        await self._run_in_engine_thread(
            lambda engine: engine.lora.register(adapter, _adapters_in_use(engine), replaces)
        )

    async def remove_lora(self, name: str, expected: LoRAAdapter | None = None) -> None:
        """Forget an adapter's name (KeyError if unknown, or if it names another adapter than
        `expected` by now); requests running with it finish with it."""

        def remove(engine: LLMEngine) -> None:
            if expected is not None and engine.lora.adapters.get(name) is not expected:
                raise KeyError(name)
            engine.lora.remove(name)

        await self._run_in_engine_thread(remove)

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """LLMEngine.reset_prefix_cache, between two steps."""
        return await self._run_in_engine_thread(lambda engine: engine.reset_prefix_cache(reset_running_requests))

    async def _run_in_engine_thread(self, fn: Callable[[LLMEngine], T]) -> T:
        """fn(engine) in the engine thread between two steps; its result (or exception) here."""
        done: Future = Future()

        def call(engine: LLMEngine) -> None:
            try:
                result, error = fn(engine), None
            except Exception as e:  # noqa: BLE001 - handed to the caller
                result, error = None, e
            if not done.set_running_or_notify_cancel():  # the caller stopped waiting
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        self.call_in_engine_thread(call)
        return await asyncio.wrap_future(done)

    def abort_all(self) -> None:
        """End every request now (shutdown): each stream gets its final output, finish_reason "abort"."""
        self._inbox.put(("abort_all",))

    # --- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._engine = new_engine(self.args)  # --runner pooling: a PoolingEngine
            self.info = EngineInfo(engine)
        except BaseException as e:  # noqa: BLE001 - the server exits on it (rawpage serve)
            self.error = e
            if isinstance(e, CONFIG_ERRORS):  # the user's setting: its message says what to change
                logger.error("the engine could not start: %s", e)
            else:  # a bug: its traceback
                logger.error("the engine could not start\n%s", traceback.format_exc())
            return
        self._report([])  # the metrics that describe the loaded engine (vllm:cache_config_info), before any request
        try:
            while not self._stop.is_set():
                self._drain_inbox(block=not engine.has_unfinished_requests())
                if engine.has_unfinished_requests():
                    self._abort_expired()
                    outputs = engine.step()
                    self._num_waiting = len(engine.scheduler.waiting)
                    self._report(outputs)
        except BaseException as e:  # noqa: BLE001 - every waiting request must hear about it
            self.error = e
            logger.error("engine step failed; the server is now unhealthy\n%s", traceback.format_exc())
            dead = EngineDeadError(f"the engine failed: {type(e).__name__}: {e}")
            for stream in list(self._streams.values()):
                stream.put(dead)

    def _report(self, outputs: list[RequestOutput]) -> None:
        if self.on_step is not None:  # metrics first: a client that got its output sees it counted
            try:
                self.on_step(self._engine, outputs)
            except Exception:  # noqa: BLE001 - metrics must never stop generation
                logger.exception("metrics hook failed")
        for out in outputs:
            if out.finished:
                self._deadlines.pop(out.request_id, None)
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            item = RequestFailedError(f"the engine failed this request: {out.error}") if out.error else out
            if not stream.put(item) and not out.finished:
                logger.warning(
                    "request %s: the client left %d+ tokens unread; aborting it", out.request_id, self.max_unread_tokens
                )
                self._engine.abort_request(out.request_id)
                stream.put(
                    APIError(
                        f"the client read too slowly (over {self.max_unread_tokens} tokens unread)",
                        408,
                        type="timeout_error",
                    )
                )

    def _abort_expired(self) -> None:
        """--request-timeout: requests past their deadline end with finish_reason 'abort'."""
        if not self._deadlines:
            return
        now = time.time()
        expired = [rid for rid, t in self._deadlines.items() if t < now]
        for rid in expired:
            del self._deadlines[rid]
            logger.info("request %s ran past --request-timeout %g s; aborting it", rid, self.request_timeout)
        self._engine.abort_request(expired)

    def _drain_inbox(self, block: bool) -> None:
        """Apply queued adds and aborts. With nothing to run, sleep until a command comes,
        and every IDLE_TICK_S let the backend look around (cpu_threads.py observe)."""
        try:
            cmd = self._inbox.get(timeout=IDLE_TICK_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            if block:  # (not between steps: a running engine measures at its forward passes)
                self._engine.backend.idle()
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        engine = self._engine
        if cmd[0] == "add":
            _, rid, prompt, params, priority, arrival, lora = cmd
            self._adds_taken += 1
            stream = self._streams.get(rid)
            if stream is None:  # the client left before we got to it: it costs nothing
                return
            try:  # a CheckedPrompt (generate's) is added without checking it again
                _check_still_loaded(engine, lora)
                engine.add_request(rid, prompt, params, arrival_time=arrival, priority=priority, lora_request=lora)
                if self.request_timeout is not None:
                    self._deadlines[rid] = arrival + self.request_timeout
            except (ValueError, APIError) as e:
                stream.put(e)
            except Exception as e:  # noqa: BLE001 - a bad request must not stop the engine thread
                logger.exception("adding request %s failed", rid)
                engine.abort_request(rid)
                stream.put(RequestFailedError(f"the engine could not add this request: {type(e).__name__}: {e}"))
        elif cmd[0] == "abort":  # its handler stopped reading: the client disconnected
            if self.log_requests and cmd[1] in engine.requests:  # not already finished
                logger.info("request %s: aborted, the client disconnected", cmd[1])
            engine.abort_request(cmd[1])
        elif cmd[0] == "call":
            try:
                cmd[1](engine)
            except Exception:  # noqa: BLE001 - an observer must never stop generation
                logger.exception("engine-thread call failed")
        elif cmd[0] == "abort_all":
            engine.abort_request(list(self._streams))


def _check_still_loaded(engine: LLMEngine, lora: LoRARequest | None) -> None:
    """A request's adapter, chosen by name when it was parsed, must still be the one known
    by that name: one unloaded or replaced since (perhaps by another tenant's, under the
    same name) is a 404, never read again from disk as an adapter nobody owns."""
    if lora is None:
        return
    known = engine.lora.adapters.get(lora.lora_name) if engine.lora is not None else None
    if known is None or known.int_id != lora.lora_int_id:
        raise APIError(
            f"the LoRA adapter '{lora.lora_name}' was unloaded or replaced before this request started; retry",
            404,
            param="model",
            type="not_found_error",
            code="model_not_found",
        )


def _adapters_in_use(engine: LLMEngine) -> set[str]:
    """Engine thread: the adapters that requests in the engine run with."""
    return {r.lora.name for r in engine.requests.values() if r.lora is not None}
