"""POST /v1/chat/completions/batch (vLLM's): several conversations in one request, one
choice per conversation (index 0..N-1), in one chat.completion object with the usage of
all. Like vLLM's, it does not stream, call tools, beam-search or take n > 1."""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.server.chat import ChatFormatter, chat_choice
from rawpage.server.chat_input import parse_batch_chat
from rawpage.server.chat_request import checked_prompt
from rawpage.server.protocol import usage
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, unless_disconnected


async def create_batch_chat_completion(request: Request, state: ServerState) -> Response:
    batch = await state.parse(request, parse_batch_chat, state.request_id(request, "chatcmpl"))
    checked = [await checked_prompt(state, c.chat) for c in batch.conversations]  # every one, before any is queued
    first = batch.conversations[0]
    fmt = ChatFormatter(state, first)
    state.engine.check_capacity(len(checked))
    tag, owner = uuid.uuid4().hex[:8], state.owner(request)
    gens = [
        state.engine.generate(f"{fmt.rid}#{i}#{tag}", prompt, first.chat.lora, owner)
        for i, (prompt, _) in enumerate(checked)
    ]
    finals = await unless_disconnected(request, final_outputs(gens))
    choices = []
    for i, final in enumerate(finals):
        fmt.role, fmt.echo = batch.conversations[i].role, batch.conversations[i].echo
        choice = chat_choice(fmt, checked[i][1], final.outputs[0])
        choices.append({**choice, "index": i})
    total = usage(sum(len(f.prompt_token_ids) for f in finals), sum(len(f.outputs[0].token_ids) for f in finals), None)
    return JSONResponse(fmt.envelope(choices, total, "chat.completion"), headers={"X-Request-Id": fmt.rid})
