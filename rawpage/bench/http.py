"""The HTTP client of `rawpage bench serve`: HTTP/1.1 on asyncio streams, from the standard
library, so that the benchmark needs nothing rawpage does not install.

It does what a benchmark needs and no more: a JSON body out; a JSON body, or a stream of
lines (server-sent events) read as they arrive, back; http and https. Each request opens
its own connection (`Connection: close`), so that requests never queue behind one another
in a pool: a request waits only where --max-concurrency puts it. Opening a connection to
a server on the same machine takes a fraction of a millisecond, which TTFT includes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

# A streamed line may be long (a chunk with logprobs): the reader's buffer limit.
LINE_LIMIT = 1 << 24


class HTTPError(Exception):
    """A reply other than 200, or a connection that failed or broke."""


class Response:
    """The status and headers of a reply, and its body, read as it arrives."""

    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader) -> None:
        self.status, self.headers, self._reader = status, headers, reader

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they come: chunked, of a Content-Length, or up to the close."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await self._reader.readline()).split(b";")[0].strip() or b"0", 16):
                data = await self._reader.readexactly(size)
                await self._reader.readline()  # the CRLF after each chunk
                yield data
        elif "content-length" in self.headers:
            yield await self._reader.readexactly(int(self.headers["content-length"]))
        else:
            while data := await self._reader.read(1 << 16):
                yield data

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines, each yielded as soon as its newline arrives."""
        pending = b""
        async for chunk in self.chunks():
            *complete, pending = (pending + chunk).split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode()
        if pending:
            yield pending.decode()


@contextlib.asynccontextmanager
async def request(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, verify: bool = True
) -> AsyncIterator[Response]:
    """Send one request; yield its Response once the head has arrived. `body` goes as JSON.
    verify=False: an https server's certificate is not checked (a self-signed one)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    tls = None
    if parts.scheme == "https":
        tls = ssl.create_default_context()
        if not verify:
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    port = parts.port or (443 if tls else 80)
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, port, ssl=tls, limit=LINE_LIMIT)
    except OSError as e:
        raise HTTPError(f"cannot connect to {parts.hostname}:{port}: {e}") from None
    try:
        writer.write(_head(method, parts, body, headers or {}))
        await writer.drain()
        yield await _read_head(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def _head(method: str, parts: Any, body: Any, headers: dict[str, str]) -> bytes:
    """The request line, the headers and the JSON body, as bytes."""
    data = b"" if body is None else json.dumps(body).encode()
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}", "Connection: close", "Accept: */*"]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def _read_head(reader: asyncio.StreamReader) -> Response:
    status_line = await reader.readline()
    try:
        status = int(status_line.split()[1])
    except (IndexError, ValueError):
        raise HTTPError(f"not an HTTP reply: {status_line[:100]!r}") from None
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return Response(status, headers, reader)


async def get_json(url: str, headers: dict[str, str] | None = None, verify: bool = True) -> Any:
    return await _json("GET", url, None, headers, verify)


async def post_json(url: str, body: Any, headers: dict[str, str] | None = None, verify: bool = True) -> Any:
    return await _json("POST", url, body, headers, verify)


async def _json(method: str, url: str, body: Any, headers: dict[str, str] | None, verify: bool) -> Any:
    """The JSON reply to one request; HTTPError for any status but 200."""
    async with request(method, url, body, headers, verify) as resp:
        data = await resp.read()
    if resp.status != 200:
        raise HTTPError(f"{method} {url}: HTTP {resp.status}: {data[:300].decode(errors='replace')}")
    return json.loads(data)
