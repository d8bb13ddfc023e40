"""A request's body: its bytes read once, within --max-request-bytes and
--request-body-timeout, then decoded from JSON (issue 44 items 4 and 6).

Only the reading happens on the event loop. A body larger than INLINE_BYTES is decoded,
and later parsed into its typed request (ServerState.parse), on the preprocessing
threads in its caller's turn (fair_executor.py): checking the two million ids of a 4 MiB
prompt list takes a second of CPU, which on the loop would stall every client and
/health. A smaller body is decoded in place, where that is cheaper than the hand-over to
a thread. json.loads itself holds the interpreter lock wherever it runs, so a body's
decode still pauses the loop for its own length (SECURITY.md gives the measurement).
Python's garbage collector is paused meanwhile (gc_paused): a body of a million empty
lists, each a new container, set off collections that walked every object of the server
and took that decode from 0.19 s to 1 s; after the pause, one young collection walks
the body's objects once (0.06 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request

from rawpage.server.protocol import APIError, check_json

# Bodies up to this many bytes are decoded and parsed on the event loop. Measured on the
# 2-core VM at load 11: a thread's hand-over costs 0.15 ms; a body of 8,000 token ids
# 5 ms to decode and check, a 16 KiB chat body (text) 0.08 ms.
INLINE_BYTES = 16 << 10


async def read_bytes(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body: a 413 beyond `limit` bytes, a 408 (and the connection closed) if it
    has not all arrived `timeout` seconds after its head (a client trickling it byte by
    byte holds a socket and a task until then). A client that leaves mid-body raises
    starlette's ClientDisconnect (app.py: a disconnect, not an error)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise APIError(f"request body of {size} bytes exceeds the limit of {limit} (--max-request-bytes)", 413)
    try:
        return await asyncio.wait_for(_read(request, limit), timeout)
    except asyncio.TimeoutError:
        raise APIError(
            f"the request body did not arrive within {timeout:g} s (--request-body-timeout)",
            408,
            code="request_timeout",
            headers={"Connection": "close"},  # the rest of the body is never read
        ) from None


async def _read(request: Request, limit: int) -> bytes:
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise APIError(f"request body exceeds the limit of {limit} bytes (--max-request-bytes)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


def decode(raw: bytes) -> Any:
    """The body's JSON, refused with a 400 if it is not JSON or holds what nothing
    downstream can use (check_json). A large body is decoded with the collector paused."""
    try:
        with gc_paused() if len(raw) > INLINE_BYTES else contextlib.nullcontext():
            data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError("the request body nests too deeply") from None
    check_json(data)
    return data


_pauses, _pauses_lock, _was_enabled = 0, threading.Lock(), True


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the block runs, on every thread (it is
    one switch): JSON's containers are trees, whose memory reference counts free, so
    nothing waits on a collection meanwhile. Nested and concurrent pauses count: the last
    to end restores the collector as the first found it."""
    global _pauses, _was_enabled
    with _pauses_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pauses_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
