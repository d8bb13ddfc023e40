"""--root-path: the path prefix a proxy serves this server under, with vLLM's semantics
(FastAPI's `root_path`, which vLLM sets on its app).

The app, not uvicorn, sets the ASGI `root_path` of every request. Routing matches the path
without the prefix when it starts with it (Starlette's get_route_path), and as it is
otherwise, so with `--root-path /llm` both

    POST /llm/v1/chat/completions   (a proxy that forwards the whole path, or a client
                                     whose base URL already holds the prefix)
    POST /v1/chat/completions       (a proxy that strips the prefix)

reach the same route, and the prefix is never applied twice (uvicorn's own root_path
would prepend it to every path, so /llm/v1 became /llm/llm/v1: a 404). The API key is
checked by each route, after routing, so it guards both spellings alike.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


def normalize_root_path(text: str) -> str:
    """'llm/', '/llm' -> '/llm'; '' and '/' -> '' (no prefix)."""
    text = text.strip().strip("/")
    return "/" + text if text else ""


class RootPath:
    """ASGI middleware: give each HTTP and websocket request the root_path `root_path`."""

    def __init__(self, app: ASGIApp, root_path: str) -> None:
        self.app, self.root_path = app, normalize_root_path(root_path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope["root_path"] = self.root_path
        await self.app(scope, receive, send)


def route_path(scope: Scope) -> str:
    """The path routes match: without the root_path when the path starts with it."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :]
    return path
