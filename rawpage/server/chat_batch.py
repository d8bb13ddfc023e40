"""POST /v1/chat/completions/batch (vLLM's): several conversations in one request, one
choice per conversation (index 0..N-1), in one chat.completion object with the usage of
all. Like vLLM's, it does not stream, call tools, beam-search or take n > 1."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.server.chat import (
    NO_EFFECT_FIELDS,
    ChatFormatter,
    chat_choice,
    chat_sampling_params,
    output_constraint,
    parse_messages,
    role_and_echo,
)
from rawpage.server.chat_request import reply_parser
from rawpage.server.protocol import APIError, Body, output_options, usage
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, unless_disconnected

_REFUSED = {
    "stream": "batch chat completions do not stream",
    "tools": "batch chat completions do not call tools",
    "use_beam_search": "batch chat completions do not beam-search",
}


def _conversations(body: Body, limit: int) -> list[list[dict[str, Any]]]:
    """'messages' is a list of conversations, each checked as one chat's messages."""
    body.mark_read("messages")
    convs = body.data.get("messages")
    if not isinstance(convs, list) or not convs or not all(isinstance(c, list) and c for c in convs):
        raise APIError("'messages' must be a non-empty list of conversations (non-empty lists)", param="messages")
    if len(convs) > limit:
        raise APIError(
            f"'messages' has {len(convs)} conversations; the limit is {limit} (--max-prompts-per-request)",
            param="messages",
        )
    for name, why in _REFUSED.items():
        if body.data.get(name):
            raise APIError(why, param=name)
    if body.int("n", 1, 1) != 1:
        raise APIError("batch chat completions take n = 1 only", param="n")
    return [parse_messages(Body({"messages": c})) for c in convs]


async def create_batch_chat_completion(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    lora = state.check_model(body)
    conversations = _conversations(body, state.config.max_prompts_per_request)
    body.mark_read(*_REFUSED)
    reply = reply_parser(state, None, body.bool("include_reasoning", True))
    out = output_options(body, state.config)
    params = chat_sampling_params(body, state, out, output_constraint(body, reply))
    roles = [role_and_echo(body, msgs) for msgs in conversations]
    render = state.render_options(body)
    prompts = [await state.render_chat(render, msgs) for msgs in conversations]
    priority, salt = state.priority(body), state.cache_salt(body)
    body.reject_unread(NO_EFFECT_FIELDS)
    await state.compile_grammar(params)
    for ids in prompts:
        state.validate_prompt(ids, params, "messages")
    fmt = ChatFormatter(state, state.request_id(request, "chatcmpl"), out, params)
    fmt.model = lora.lora_name if lora else state.model_name
    state.engine.check_capacity(len(prompts))
    tag = uuid.uuid4().hex[:8]
    gens = [
        state.engine.generate(
            f"{fmt.rid}#{i}#{tag}",
            {"prompt_token_ids": ids, "cache_salt": salt},
            params,
            priority,
            lora,
            state.owner(request),
        )
        for i, ids in enumerate(prompts)
    ]
    finals = await unless_disconnected(request, final_outputs(gens))
    choices = []
    for i, final in enumerate(finals):
        fmt.role, fmt.echo = roles[i]
        choice = chat_choice(fmt, reply.for_prompt(state.info.tokenizer, prompts[i]), final.outputs[0])
        choices.append({**choice, "index": i})
    total = usage(sum(len(f.prompt_token_ids) for f in finals), sum(len(f.outputs[0].token_ids) for f in finals), None)
    return JSONResponse(fmt.envelope(choices, total, "chat.completion"), headers={"X-Request-Id": fmt.rid})
