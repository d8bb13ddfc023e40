"""Reasoning handed to a client to send back later, signed so that it comes back unchanged.

Responses' `encrypted_content` (with include: ["reasoning.encrypted_content"]) and a
Messages `thinking` block's `signature` are both one sealed blob:

    rp1.<base64url(JSON {"reasoning": text})>.<base64url(HMAC-SHA256(secret, "rp1." + payload))>

It is signed and encoded, NOT encrypted: anyone can read the reasoning inside (it is the
model's own text, which the same reply shows anyway). The signature only proves that this
server wrote it, so a reasoning item or thinking block sent back is the model's thinking as
it was; a changed one is a 400. The secret is --reasoning-secret
(or $RAWPAGE_REASONING_SECRET): share it among replicas behind one address; without it each
server draws its own, and blobs from before a restart are refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os

from rawpage.server.protocol import APIError

_VERSION = "rp1"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReasoningSeal:
    def __init__(self, secret: str | None = None) -> None:
        self._key = hashlib.sha256(secret.encode()).digest() if secret else os.urandom(32)

    def _mac(self, signed: str) -> str:
        return _b64(hmac.new(self._key, signed.encode(), hashlib.sha256).digest())

    def seal(self, reasoning: str) -> str:
        signed = f"{_VERSION}.{_b64(json.dumps({'reasoning': reasoning}, ensure_ascii=False).encode())}"
        return f"{signed}.{self._mac(signed)}"

    def open(self, blob: object, param: str) -> str:
        """The reasoning a blob of ours holds; a 400 naming `param` for anything else."""
        if isinstance(blob, str) and blob.count(".") == 2:
            signed, _, mac = blob.rpartition(".")
            if signed.startswith(_VERSION + ".") and hmac.compare_digest(mac, self._mac(signed)):
                try:
                    value = json.loads(_unb64(signed.split(".", 1)[1]))
                except (binascii.Error, ValueError):
                    value = None
                if isinstance(value, dict) and isinstance(value.get("reasoning"), str):
                    return value["reasoning"]
        raise APIError(
            f"'{param}' is not reasoning this server signed: it was changed, or it comes from another server or "
            "from before a restart (replicas must share --reasoning-secret)",
            param=param,
        )
