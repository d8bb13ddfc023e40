"""Send one streamed request to an OpenAI-compatible server and timestamp every chunk.

Works with vLLM, llama.cpp's llama-server, llama-cpp-python and rawpage: all stream
Server-Sent Events, `data: {json}` lines ending with `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

from rawpage.bench import http
from rawpage.bench.datasets import BenchRequest
from rawpage.bench.metrics import RequestRecord

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"


@dataclass
class Server:
    """Where the benchmark sends its requests, and what goes with each."""

    base_url: str  # without /v1
    headers: dict[str, str] = field(default_factory=dict)  # the API key's, --header's
    verify: bool = True  # check an https server's certificate (--insecure: not)
    timeout: float = 600.0  # seconds a request may take before it counts as failed

    async def get_json(self, path: str) -> Any:
        return await asyncio.wait_for(http.get_json(self.base_url + path, self.headers, self.verify), self.timeout)

    async def post_json(self, path: str, body: Any) -> Any:
        return await asyncio.wait_for(
            http.post_json(self.base_url + path, body, self.headers, self.verify), self.timeout
        )


def request_body(
    req: BenchRequest,
    endpoint: str,
    model: str,
    max_tokens: int,
    ignore_eos: bool,
    temperature: float | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        # Ask for a final chunk with the exact token counts, instead of retokenizing text.
        "stream_options": {"include_usage": True},
    }
    if endpoint == CHAT_ENDPOINT:
        body["messages"] = req.messages
    else:
        body["prompt"] = req.prompt
    if ignore_eos:
        # Not in OpenAI's API: vLLM's extension, also read by llama-server and rawpage.
        # It makes every request produce exactly max_tokens, so engines do equal work.
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = temperature
    return body | (extra or {})


def chunk_text(data: dict[str, Any], endpoint: str) -> str:
    """The generated text one streamed chunk carries ("" for role-only or usage-only chunks)."""
    choices = data.get("choices") or []
    if not choices:
        return ""
    if endpoint == CHAT_ENDPOINT:
        delta = choices[0].get("delta") or {}
        # Reasoning models stream their thinking apart from the answer; both are output tokens.
        return (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    return choices[0].get("text") or ""


async def send_streaming(server: Server, endpoint: str, body: dict[str, Any], rec: RequestRecord) -> None:
    """POST `body` and fill `rec` with chunk arrival times, text, usage, success or error."""
    rec.sent = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(server, endpoint, body, rec), server.timeout)
    except (http.HTTPError, OSError, ssl.SSLError, EOFError, ValueError) as e:  # ValueError: bad JSON too
        rec.error = f"{type(e).__name__}: {e}"
    except asyncio.TimeoutError:
        rec.error = f"timed out after {server.timeout:g} s (--request-timeout)"
    finally:
        rec.finished = time.perf_counter()


async def _stream(server: Server, endpoint: str, body: dict[str, Any], rec: RequestRecord) -> None:
    async with http.request("POST", server.base_url + endpoint, body, server.headers, server.verify) as resp:
        if resp.status != 200:
            detail = (await resp.read()).decode(errors="replace")[:500]
            rec.error = f"HTTP {resp.status}: {detail}"
            return
        async for line in resp.lines():
            now = time.perf_counter()
            if not line.startswith("data:"):
                continue  # blank separators, ": keep-alive" comments, "event:" lines
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                break
            data = json.loads(payload)
            if "error" in data:
                rec.error = f"error in stream: {json.dumps(data['error'])[:500]}"
                return
            text = chunk_text(data, endpoint)
            if text:
                rec.chunk_times.append(now)
                rec.text += text
            if usage := data.get("usage"):
                rec.input_tokens = usage.get("prompt_tokens")
                rec.output_tokens = usage.get("completion_tokens")
                rec.token_count_source = "usage"
    rec.success = True


async def first_model(server: Server) -> str:
    """The id of the first model in GET /v1/models, which is what single-model servers serve."""
    models = (await server.get_json("/v1/models")).get("data") or []
    if not models:
        raise ValueError(f"{server.base_url}/v1/models lists no model; pass --model")
    return models[0]["id"]
