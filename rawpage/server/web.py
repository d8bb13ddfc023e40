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
        per_key = state.config.max_event_streams_per_key
        if view.watchers >= MAX_WATCHERS or view.watchers_by_key[caller.key_id] >= per_key:
            mine = view.watchers_by_key[caller.key_id] >= per_key
            raise APIError(
                f"too many open engine event streams for this API key (limit {per_key}, --max-event-streams-per-key)"
                if mine
                else f"too many open engine event streams (limit {MAX_WATCHERS})",
                429,
                type="rate_limit_error",
                headers={"Retry-After": "5"},
            )
        return StreamingResponse(
            _events(view, state, caller),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return endpoint


async def _events(view: EngineView, state: ServerState, caller: Caller) -> AsyncIterator[bytes]:
    view.watchers += 1
    view.watchers_by_key[caller.key_id] += 1
    try:
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
    finally:
        view.watchers -= 1
        view.watchers_by_key[caller.key_id] -= 1
