"""Fetch an image URL over http(s), for a server run with --allowed-media-domains.

Only hosts in that list (exactly, or a subdomain of one) are fetched. The host's
addresses are resolved once and every one must be public: a name that resolves to a
loopback, private, link-local or otherwise reserved address is refused even when its
domain is allowed (server-side request forgery). The connection goes to the address
that was checked (TLS still verifies the certificate against the host name), so a
second DNS answer cannot send it elsewhere. Redirects are not followed; the body is
read up to MAX_IMAGE_BYTES; each step has a timeout.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import urlsplit

from rawpage.multimodal.image_input import MAX_IMAGE_BYTES, ImageError

FETCH_TIMEOUT_S = 10.0


def host_allowed(host: str, domains: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in (d.lower().rstrip(".") for d in domains))


def public_address(host: str, port: int) -> str:
    """The first address of host, if every address it resolves to is public."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise ImageError(f"image URL host {host!r} does not resolve") from None
    addresses = [info[4][0] for info in infos]
    for a in addresses:
        if not ipaddress.ip_address(a.split("%")[0]).is_global:
            raise ImageError(f"image URL host {host!r} resolves to a non-public address; it is not fetched")
    return addresses[0]


def fetch_image(url: str, domains: tuple[str, ...]) -> bytes:
    """The bytes at an http(s) URL whose host is in `domains` (--allowed-media-domains)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not domains:
        raise ImageError("image URLs over http(s) need the server to run with --allowed-media-domains")
    if not host_allowed(host, domains):
        raise ImageError(f"image URL host {host!r} is not in --allowed-media-domains")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = public_address(host, port)
    conn = _connection(parts.scheme, host, address, port)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers={"Host": host})
        resp = conn.getresponse()
        if resp.status != 200:
            raise ImageError(f"image URL answered HTTP {resp.status} (redirects are not followed)")
        data = resp.read(MAX_IMAGE_BYTES + 1)
    except (OSError, http.client.HTTPException) as e:
        raise ImageError(f"image URL could not be fetched ({type(e).__name__})") from None
    finally:
        conn.close()
    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"image is over {MAX_IMAGE_BYTES} bytes")
    return data


def _connection(scheme: str, host: str, address: str, port: int) -> http.client.HTTPConnection:
    """A connection to the checked address; for https, TLS verified against the host name."""
    if scheme == "http":
        return http.client.HTTPConnection(address, port, timeout=FETCH_TIMEOUT_S)
    ctx = ssl.create_default_context()

    class Pinned(http.client.HTTPSConnection):
        def connect(self) -> None:
            sock = socket.create_connection((address, port), FETCH_TIMEOUT_S)
            self.sock = ctx.wrap_socket(sock, server_hostname=host)

    return Pinned(host, port, timeout=FETCH_TIMEOUT_S, context=ctx)
