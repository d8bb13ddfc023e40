"""A deadline for each request head: slowloris clients are closed (issue 29 item 8); and
a bound on its size.

uvicorn times a connection out only between requests (--timeout-keep-alive), and
only once a response has gone out: a client that connects and sends half a request
line, or one header byte every few seconds, holds its socket (and a file descriptor)
forever. h11's --h11-max-incomplete-event-size bounds how big a head may grow, not
how long it may take. So here a head must be complete within --request-header-timeout
seconds of its first byte (or of the accept, for the first request); otherwise the
connection is closed.

    accept ──► head timer ──► head complete: cancelled ──► response ──► keep-alive timer
                   │                                                      │
                   └── expired: close                 next request's bytes┘──► head timer

h11 holds a head to --h11-max-incomplete-event-size only while it is incomplete: a
20 KB head that arrives in one read went through (issue 44). BoundedHeadConnection
measures every head, however it arrived, before h11 parses it.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_HEAD_END = re.compile(rb"\n\r?\n")  # h11's own: the blank line that ends a head


class BoundedHeadConnection(h11.Connection):
    """h11's server connection, which refuses a head longer than its limit also when the
    whole head is already in the buffer (uvicorn answers the error with a 400 and closes)."""

    def __init__(self, max_head: int) -> None:
        super().__init__(h11.SERVER, max_head)
        self.max_head = max_head

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:  # a head is next: the request line and headers
            end = _HEAD_END.search(self.trailing_data[0])
            if end is not None and end.end() > self.max_head:
                raise h11.RemoteProtocolError(
                    f"request head of {end.end()} bytes over the limit of {self.max_head}", error_status_hint=431
                )
        return super().next_event()


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on every request head and a bound on its size."""

    header_timeout = 10.0  # set per server by with_header_timeout

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.conn = BoundedHeadConnection(config.h11_max_incomplete_event_size or 16 << 10)  # h11's default

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self._start_head_timer()  # these bytes begin a head (a no-op if one is being timed)
        super().data_received(data)
        if self.cycle is not cycle:  # a new request began: its head is complete
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _start_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.logger.debug("closing a connection whose request head took over %.0f s", self.header_timeout)
            self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn.Config(http=...), with this deadline."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})


def uvicorn_limits(config: Any) -> dict[str, Any]:
    """uvicorn.Config's connection limits from ServerConfig."""
    return {
        "http": with_header_timeout(config.request_header_timeout),
        "timeout_keep_alive": config.timeout_keep_alive,
        "h11_max_incomplete_event_size": config.h11_max_incomplete_event_size,
    }
