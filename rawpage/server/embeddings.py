"""POST /v1/embeddings: text (or token ids) in, one vector per input out, in OpenAI's shape.

Needs a pooling engine (`rawpage serve MODEL --runner pooling`). Each input becomes one
engine request, which the scheduler batches like prompts. A request keeps at most two
steps' worth of its inputs' tokens (2 x --max-num-batched-tokens) queued at a time and
queues the next as one finishes, so another client's inputs, queued meanwhile, run
within a couple of steps instead of behind all of a large request (issue 44).
A generating server answers with a 400 that says how to start one that embeds, and
a pooling server answers chat and completions with a 400 that says what it is.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import EmbeddingRequestOutput
from rawpage.server.prompt_input import parse_embedding
from rawpage.server.protocol import APIError
from rawpage.server.state import ServerState
from rawpage.server.streaming import unless_disconnected

Handler = Callable[[Request, ServerState], Awaitable[Response]]


def generate_only(handler: Handler) -> Handler:
    """Wrap a chat or completions handler: a pooling server answers it with a 400."""

    async def wrapped(request: Request, state: ServerState) -> Response:
        if state.info.runner == "pooling":
            raise APIError(
                f"'{state.model_name}' is a pooling model (--runner pooling): it serves /v1/embeddings only; "
                "start the server without --runner pooling to generate text",
                param="model",
            )
        return await handler(request, state)

    return wrapped


async def create_embedding(request: Request, state: ServerState) -> Response:
    req = await state.parse(request, parse_embedding, state.caller(request))
    texts = [x for x in req.inputs if isinstance(x, str)]  # tokenized off the event loop
    inputs = await state.encode(texts, req.add_special_tokens, "input") if texts else list(req.inputs)
    try:
        inputs = [state.info.check_input(ids, req.params) for ids in inputs]  # truncated where asked
    except ValueError as e:
        raise APIError(str(e), param=getattr(e, "param", "input")) from None
    rid, tag = state.request_id(request, "embd"), uuid.uuid4().hex[:8]
    state.engine.check_capacity(len(inputs))
    owner = state.owner(request)

    def submit(i: int) -> AsyncIterator[EmbeddingRequestOutput]:
        return state.engine.encode(f"{rid}#{i}#{tag}", {"prompt_token_ids": inputs[i]}, req.params, req.priority, owner)

    window = 2 * state.info.max_num_batched_tokens
    finals = await unless_disconnected(request, windowed(submit, [len(ids) for ids in inputs], window))
    if any(f is None or not f.finished or not f.outputs.embedding for f in finals):
        raise APIError("the server ended this request early (shutting down, or --request-timeout)", 503)
    return JSONResponse(_response(state.model_name, finals, req.encoding_format), headers={"X-Request-Id": rid})


async def windowed(
    submit: Callable[[int], AsyncIterator[EmbeddingRequestOutput]], sizes: list[int], window: int
) -> list[EmbeddingRequestOutput | None]:
    """Each input's last output, in input order. submit(i) queues input i (sizes[i] tokens);
    inputs are queued in order while this request has at most `window` tokens queued or
    running (always at least one input). Cancelled, it aborts every input still queued."""
    finals: list[EmbeddingRequestOutput | None] = [None] * len(sizes)
    pending: dict[asyncio.Future, int] = {}  # an input's last output, being awaited -> its index
    queued, nxt = 0, 0
    try:
        while nxt < len(sizes) or pending:
            while nxt < len(sizes) and (not pending or queued + sizes[nxt] <= window):
                pending[asyncio.ensure_future(_last(submit(nxt)))] = nxt
                queued, nxt = queued + sizes[nxt], nxt + 1
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                queued -= sizes[i]
                finals[i] = task.result()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return finals


async def _last(stream: AsyncIterator[EmbeddingRequestOutput]) -> EmbeddingRequestOutput | None:
    last = None
    async with aclosing(stream) as outputs:
        async for out in outputs:
            last = out
    return last


def _response(model: str, finals: list[EmbeddingRequestOutput], encoding: str) -> dict[str, Any]:
    """OpenAI's CreateEmbeddingResponse: object, data, model, usage (prompt and total tokens)."""
    num_tokens = sum(len(f.prompt_token_ids) for f in finals)
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(f.outputs.embedding, encoding)}
        for i, f in enumerate(finals)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    """base64: the little-endian float32 bytes, as OpenAI sends them (and its SDK decodes)."""
    if encoding == "float":
        return vector
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
