"""The built-in web page (GET /, files under /web/) and the engine's event stream
(GET /v1/engine/events) that its live view of the KV cache reads.

The page is static: plain HTML, CSS and JavaScript shipped in the package (rawpage/web/),
with no build step and nothing fetched from elsewhere. It holds no data, so it is served
without the API key; everything it shows comes from the API, with the key the user types.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from rawpage.server.engine_view import EngineView
from rawpage.server.protocol import APIError
from rawpage.server.state import Caller, ServerState

PAGE_FILES = {
    "index.html": "text/html",
    "style.css": "text/css",
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "chat.js": "text/javascript",
    "engine.js": "text/javascript",
    "markdown.js": "text/javascript",
    "images.js": "text/javascript",
}
# Model output is rendered by our own DOM-building code; this policy is the second line of
# defence: no inline script, no script or style from anywhere but this server.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
MAX_WATCHERS = 16  # open event streams; each costs a little of the event loop
POLL_INTERVAL = 0.05  # seconds between looks at the newest snapshot
KEEPALIVE = 15.0  # seconds of quiet before a comment line keeps proxies from closing the stream


def page_file(name: str) -> bytes:
    return resources.files("rawpage.web").joinpath(name).read_bytes()


async def index(request: Request, state: ServerState) -> Response:
    return Response(page_file("index.html"), media_type="text/html", headers=PAGE_HEADERS)


async def static_file(request: Request, state: ServerState) -> Response:
    name = request.path_params["name"]
    if name not in PAGE_FILES:  # a fixed list: no path ever reaches the file system
        raise APIError(f"GET /web/{name}: not found", 404, type="not_found_error")
    return Response(page_file(name), media_type=PAGE_FILES[name], headers=PAGE_HEADERS)


async def page_info(request: Request, state: ServerState) -> Response:
    """What the page needs before it can call the API: whether to ask for a key."""
    return JSONResponse(
        {"api_key_required": bool(state.config.api_keys or state.config.admin_api_key)}, headers=PAGE_HEADERS
    )


def engine_events(view: EngineView) -> Callable[[Request, ServerState], Awaitable[Response]]:
    async def endpoint(request: Request, state: ServerState) -> Response:
        """Server-sent events: `event: snapshot` with one JSON snapshot each time the engine
        thread takes a new one (docs/engine-events.md). A key that is not the admin's sees
        only its own requests."""
        _ = state.info  # 503 while the model loads
        caller = state.caller(request)
        _admit(view, caller.key_id, state.config.max_event_streams_per_key)
        return _EventStream(_events(view, state, caller), lambda: _leave(view, caller.key_id))

    return endpoint


def _admit(view: EngineView, key: str | None, per_key: int) -> None:
    """Count a stream in at admission, in the same step as its check (no await between
    them), so that many opened at once cannot all pass the check before any is counted."""
    mine = view.watchers_by_key[key] >= per_key
    if view.watchers >= MAX_WATCHERS or mine:
        raise APIError(
            f"too many open engine event streams for this API key (limit {per_key}, --max-event-streams-per-key)"
            if mine
            else f"too many open engine event streams (limit {MAX_WATCHERS})",
            429,
            type="rate_limit_error",
            headers={"Retry-After": "5"},
        )
    view.watchers += 1
    view.watchers_by_key[key] += 1


def _leave(view: EngineView, key: str | None) -> None:
    view.watchers -= 1
    view.watchers_by_key[key] -= 1


class _EventStream(StreamingResponse):
    """The stream, which gives its place back when it ends, however it ends: also when the
    client leaves before its first byte, when the generator never starts."""

    def __init__(self, events: AsyncIterator[bytes], leave: Callable[[], None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._leave = leave

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._leave()


async def _events(view: EngineView, state: ServerState, caller: Caller) -> AsyncIterator[bytes]:
    # The current state first: `latest` if no step ran since it was taken, else the one
    # the engine thread takes for us.
    state.engine.call_in_engine_thread(view.refresh)
    sent, quiet_since = (None if view.is_current else view.latest), time.monotonic()
    while True:
        snap = view.latest
        if snap is not None and snap is not sent:
            data = snap.data if caller.admin else snap.for_tenant(caller.key_id)
            yield b"event: snapshot\ndata: " + data + b"\n\n"
            sent, quiet_since = snap, time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE:
            yield b": keepalive\n\n"
            quiet_since = time.monotonic()
        await asyncio.sleep(POLL_INTERVAL)
