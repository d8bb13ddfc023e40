"""Async plumbing shared by the endpoints: SSE framing, merging the output streams of
several engine requests, and cancelling work when the client goes away."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from rawpage.outputs import RequestOutput
from rawpage.server.protocol import APIError

T = TypeVar("T")
logger = logging.getLogger("rawpage.server")


class ClientDisconnected(Exception):
    pass


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One server-sent event: `data: {...}` and a blank line, after `event: <name>` when
    named (the Responses and Messages APIs name each event; chat's are unnamed)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n" if event is None else f"event: {event}\ndata: {payload}\n\n"


ErrorEvents = Callable[[APIError], list[str]]


def chat_error_events(err: APIError) -> list[str]:
    """How chat and completions streams end on a failure, as OpenAI's do: the error object, then [DONE]."""
    return [sse(err.body()), sse("[DONE]")]


async def guard_stream(events: AsyncIterator[str], error_events: ErrorEvents = chat_error_events) -> AsyncIterator[str]:
    """Pass SSE events through; if the request fails once the stream has begun (the 200 is
    already sent), end it with the API's own error events rather than a torn connection."""
    try:
        async with aclosing(events) as it:
            async for event in it:
                yield event
    except (ClientDisconnected, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - reported to the client, never a torn connection
        if isinstance(e, APIError):
            err = e
        elif isinstance(e, ValueError):
            err = APIError(str(e))
        else:
            logger.error("stream failed: %s: %s", type(e).__name__, e)
            err = APIError(str(e) or type(e).__name__, 500, type="internal_server_error")
        for event in error_events(err):
            yield event


def sse_response(
    events: AsyncIterator[str], request_id: str, error_events: ErrorEvents = chat_error_events
) -> StreamingResponse:
    """A streamed reply: the events under guard_stream, with the request's id in a header."""
    stream = guard_stream(events, error_events)
    return StreamingResponse(stream, media_type="text/event-stream", headers={"X-Request-Id": request_id})


async def merge(
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several output streams as (stream index, output), in arrival order.
    Closing this generator closes every stream, which aborts unfinished requests."""
    if len(streams) == 1:  # the common case needs no tasks
        async with aclosing(streams[0]) as s:
            async for out in s:
                yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with aclosing(stream) as s:
                async for out in s:
                    await queue.put((i, out))
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            await queue.put((i, e))
        finally:
            await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def final_outputs(streams: list[AsyncIterator[RequestOutput]]) -> list[RequestOutput]:
    """Run every stream to its end; the last output of each, in order."""
    last: list[RequestOutput | None] = [None] * len(streams)
    async with aclosing(merge(streams)) as merged:
        async for i, out in merged:
            last[i] = out
    return [o for o in last if o is not None]


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`, but cancel it (aborting its requests) if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected()
    return task.result()
