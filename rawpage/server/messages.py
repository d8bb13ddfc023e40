"""POST /v1/messages (Anthropic's Messages API) and POST /v1/messages/count_tokens.

A body is parsed once into a MessagesRequest (messages_input.py), whose ChatRequest runs
on the same path as chat completions (chat_request.py); its Reply is written as a message
object, or as Anthropic's event stream (messages_output.py). Errors on these routes are in
Anthropic's shape, and the key may come as `x-api-key` (app.py).

    Reply            content block
    reasoning        {"type": "thinking", "thinking", "signature"} (--reasoning-parser; the
                     signature is reasoning_seal.py's: signed, not encrypted)
    content          {"type": "text", "text"}  (present unless there are only tool calls)
    each call        {"type": "tool_use", "id", "name", "input"}
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.server.chat_request import final_output, prompt_ids, submit, token_counts
from rawpage.server.messages_input import parse_count_tokens, parse_messages_request
from rawpage.server.messages_output import message_object, stream_message
from rawpage.server.state import ServerState


async def create_message(request: Request, state: ServerState) -> Response:
    req = await state.parse(request, parse_messages_request, state.caller(request))
    gen, parser = await submit(request, state, req.chat)
    if req.stream:
        return stream_message(state, req, gen, parser)
    final = await final_output(request, gen)
    o = final.outputs[0]
    reply = parser.parse(o.text, o.finish_reason)
    sign = state.seal.seal
    message = message_object(
        req.chat.request_id, req.model, reply, o, token_counts(state, final), sign, req.omit_thinking
    )
    return JSONResponse(message, headers={"request-id": req.chat.request_id})


async def count_message_tokens(request: Request, state: ServerState) -> Response:
    """The prompt's length in tokens, rendered exactly as /v1/messages renders it."""
    chat = await state.parse(request, parse_count_tokens, state.caller(request))
    return JSONResponse({"input_tokens": len((await prompt_ids(state, chat))[0])})
