"""ServerState: what every handler needs — the engine, the model's name, the limits."""

from __future__ import annotations

import hmac
import json
import time
import uuid
from dataclasses import dataclass, field

from starlette.requests import Request

from rawpage.engine import LLMEngine
from rawpage.sampling_params import SamplingParams
from rawpage.server.async_engine import AsyncEngine
from rawpage.server.metrics import ServerMetrics
from rawpage.server.protocol import APIError, Body


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    api_key: str | None = None
    max_request_bytes: int = 4 << 20
    chat_template: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def llm(self) -> LLMEngine:
        """The loaded engine, or a 503 while it loads (or after it died)."""
        if self.engine.error is not None:
            raise APIError(f"the engine is not running: {self.engine.error}", 503, type="service_unavailable")
        if self.engine.engine is None:
            raise APIError("the model is still loading; retry shortly", 503, type="service_unavailable")
        return self.engine.engine

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):  # constant time
            raise APIError(
                "missing or invalid API key",
                401,
                type="authentication_error",
                code="invalid_api_key",
            )

    def check_model(self, body: Body) -> None:
        name = body.str("model")
        if name is not None and name != self.model_name:
            raise APIError(f"the model '{name}' does not exist; this server serves '{self.model_name}'", 404,
                           param="model", type="not_found_error", code="model_not_found")  # fmt: skip

    async def read_body(self, request: Request) -> Body:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > self.max_request_bytes:
            raise APIError(f"request body of {size} bytes exceeds the limit of {self.max_request_bytes}", 413)
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > self.max_request_bytes:
                raise APIError(f"request body exceeds the limit of {self.max_request_bytes} bytes", 413)
            chunks.append(chunk)
        try:
            return Body(json.loads(b"".join(chunks)))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None

    def request_id(self, request: Request, prefix: str) -> str:
        given = request.headers.get("x-request-id")
        return given if given and len(given) <= 128 else f"{prefix}-{uuid.uuid4().hex}"

    def validate_prompt(self, ids: list[int], params: SamplingParams, param: str) -> None:
        try:
            self.llm.validate_prompt(ids, params)
        except ValueError as e:
            raise APIError(str(e), param=param) from None

    def token_text(self, token_id: int) -> str:
        return self.llm.tokenizer.decode([token_id], skip_special_tokens=False)
