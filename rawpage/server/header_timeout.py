"""A deadline for each request head: slowloris clients are closed (issue 29 item 8).

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
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on every request head."""

    header_timeout = 10.0  # set per server by with_header_timeout

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
