"""RequestGuard: what a browser page on another site must not be able to make the server do,
checked before any route runs, with or without --api-key.

- **Host.** Only the names the server is bound to are served (127.0.0.1, localhost, [::1],
  --host, and --allowed-hosts). Otherwise a page on evil.example could point its own DNS
  name at 127.0.0.1 and read the API as same-origin (DNS rebinding; Ollama's
  CVE-2024-28224). Refused with 421. A request without a Host header (HTTP/1.0) passes: a
  browser always sends one.
- **Origin.** A POST or DELETE whose Origin is neither this server itself nor one of
  --allowed-origins is refused with 403: a page elsewhere cannot change state here.
  Requests without an Origin (curl, the SDKs) pass.
- **Content-Type.** A body must be `application/json`. Otherwise a page could send JSON as
  `text/plain`, a CORS "simple request" that no preflight stops. Refused with 415.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from rawpage.server.args import ServerConfig
from rawpage.server.protocol import APIError, is_anthropic_path

logger = logging.getLogger("rawpage.server")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def host_name(value: str) -> str:
    """'[::1]:8000' -> '::1', 'LocalHost.:80' -> 'localhost': a Host header or --host, without its port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # a name or IPv4 address with a port; a bare IPv6 address has several
        value = value.split(":")[0]
    return value.rstrip(".")


def allowed_host_names(config: ServerConfig) -> frozenset[str] | None:
    """The Host names served, or None for any: '*' in --allowed-hosts, a unix socket (--uds)
    or a bind to every interface (0.0.0.0, ::) with no --allowed-hosts, where the machine's
    own names are not known."""
    if "*" in config.allowed_hosts:
        return None
    if config.uds and not config.allowed_hosts:  # a unix socket: no browser reaches it by name
        return None
    if host_name(config.host) in WILDCARD_BINDS and not config.allowed_hosts:
        logger.warning(
            "--host %s without --allowed-hosts: requests for any Host name are served, so a web page "
            "could reach this server by DNS rebinding; name the server's names with --allowed-hosts",
            config.host,
        )
        return None
    return frozenset({*LOOPBACK_NAMES, host_name(config.host), *map(host_name, config.allowed_hosts)})


class RequestGuard:
    """ASGI middleware: Host, Origin and Content-Type, each refused in OpenAI's error shape
    (Anthropic's under /v1/messages)."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.hosts = allowed_host_names(config)
        self.origins = frozenset(o.rstrip("/").lower() for o in config.allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.refusal(scope["method"], Headers(scope=scope))
            if error is not None:
                body = error.anthropic_body() if is_anthropic_path(scope["path"]) else error.body()
                await JSONResponse(body, status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if host is not None and self.hosts is not None and host_name(host) not in self.hosts:
            return APIError(
                f"this server does not answer to the Host '{host_name(host)[:100]}'; the operator can add "
                "the name with --allowed-hosts",
                421,
                code="misdirected_request",
            )
        origin = headers.get("origin")
        if method in STATE_CHANGING and origin is not None and not self._origin_allowed(origin, host):
            return APIError(
                f"requests from the web origin '{origin[:100]}' are not allowed to {method} here; "
                "the operator can allow it with --allowed-origins",
                403,
                type="permission_error",
                code="origin_not_allowed",
            )
        if self._has_body(method, headers) and not _is_json(headers.get("content-type", "")):
            return APIError(
                f"the request body must be JSON sent as 'Content-Type: application/json', "
                f"not '{headers.get('content-type', 'none')[:100]}'",
                415,
                code="unsupported_media_type",
            )
        return None

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.rstrip("/").lower()
        same_origin = host is not None and urlsplit(origin).netloc == host.strip().lower()  # the web page
        return same_origin or "*" in self.origins or origin in self.origins

    @staticmethod
    def _has_body(method: str, headers: Headers) -> bool:
        size = headers.get("content-length", "0").strip()
        return method in STATE_CHANGING and ("transfer-encoding" in headers or size not in ("", "0"))


def _is_json(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == "application/json"
