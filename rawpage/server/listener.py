"""The listening socket: when the process runs out of file descriptors, accepting pauses
for a second and says so in one line, not once per waiting connection (issue 44 item 6).

asyncio's accept loop (selector_events._accept_connection, CPython 3.10 to 3.13) meets
EMFILE, logs it with a traceback, pauses the socket for a second, and then goes on
calling accept() for the rest of its backlog (uvicorn's 2,048), logging and scheduling
another retry each time: a server at `ulimit -n 256` wrote 358,245 lines (159 MB) in
30 s. BackoffSocket.accept raises the error once, then answers "nothing waiting"
(BlockingIOError, which ends asyncio's loop) until the second is up. The connections wait
in the kernel's backlog meanwhile and are taken once descriptors are free again: the head
and body deadlines (--request-header-timeout, --request-body-timeout) close the idle
ones that hold them. uvloop accepts inside libuv, past this class, so the server runs
asyncio's own loop (app.py) even where uvloop is installed (Ray Serve's extra brings it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import stat
import time
from typing import Any

import uvicorn

logger = logging.getLogger("rawpage.server")

OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # asyncio's list
RETRY_DELAY = 1.0  # seconds: asyncio's ACCEPT_RETRY_DELAY, the pause it takes after the error
ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message for it


class BackoffSocket(socket.socket):
    def accept(self) -> tuple[socket.socket, Any]:
        now = time.monotonic()
        if now < getattr(self, "paused_until", 0.0):
            raise BlockingIOError(errno.EAGAIN, "accepting is paused: out of file descriptors")
        try:
            return super().accept()
        except OSError as e:
            if e.errno not in OUT_OF_RESOURCES:
                raise
            self.paused_until = now + RETRY_DELAY
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            logger.warning(
                "cannot accept connections: %s (ulimit -n is %d); retrying in %g s. Raise the limit, or "
                "lower --request-header-timeout and --request-body-timeout to close idle connections sooner",
                e.strerror,
                soft,
                RETRY_DELAY,
            )
            raise


def listening_socket(config: uvicorn.Config) -> BackoffSocket:
    """uvicorn's own socket for the config (--host and --port, or --uds), as a BackoffSocket."""
    if config.uds and os.path.exists(config.uds) and stat.S_ISSOCK(os.stat(config.uds).st_mode):
        os.remove(config.uds)  # an earlier run's, as asyncio's create_unix_server removes it
    sock = config.bind_socket()
    return BackoffSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: BackoffSocket has said it in one line; asyncio's
    traceback for the same error is left out. Anything else goes to asyncio's handler."""
    if context.get("message") != ACCEPT_FAILED:
        loop.default_exception_handler(context)
