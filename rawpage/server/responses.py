"""POST /v1/responses (OpenAI's Responses API), and GET, DELETE and cancel of stored ones.

A body is parsed once into a ResponsesRequest (responses_input.py), whose ChatRequest
runs on the same path as chat completions (chat_request.py); its Reply is written as a
response object or its event stream (responses_output.py). With `store` (the default) the response and its
conversation go into the bounded in-memory store (response_store.py), which
`previous_response_id` continues from.

There is no background mode (`background: true` is a 400): a response is stored once it
has finished, so `cancel` finds it finished and returns it unchanged, as OpenAI does
for a finished background response.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import RequestOutput
from rawpage.server.chat_reply import Reply, ReplyParser
from rawpage.server.chat_request import final_output, reply_steps, submit, token_counts
from rawpage.server.logprob_items import logprob_items
from rawpage.server.protocol import APIError
from rawpage.server.request import ResponsesRequest
from rawpage.server.responses_input import parse_responses
from rawpage.server.responses_output import OutputItems, ResponseEvents, finished, new_envelope, usage
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse_response


async def create_response(request: Request, state: ServerState) -> Response:
    req = await state.parse(request, parse_responses, state.caller(request))
    rid = req.chat.request_id
    envelope = new_envelope(rid, req.model, req.fields)
    items = OutputItems(state.seal.seal if req.encrypted_reasoning else None)
    gen, parser = await submit(request, state, req.chat)
    if req.stream:
        events = ResponseEvents(envelope, items)
        return sse_response(_stream(state, req, gen, parser, events), rid, events.error_events)
    final = await final_output(request, gen)
    o = final.outputs[0]
    reply = parser.parse(o.text, o.finish_reason)
    response = finished(envelope, reply, items.of(reply), _usage(state, final))
    response = _with_extras(state, req, response, final)
    _keep(state, req, response, reply)
    return JSONResponse(response, headers={"X-Request-Id": rid})


async def _stream(state: ServerState, req: ResponsesRequest, gen, parser: ReplyParser, events: ResponseEvents):
    for e in events.start():
        yield e
    final, reason = None, None
    async for out, steps in reply_steps(gen, parser):
        for step in steps:
            if step.o.delta_logprobs:  # each text delta carries its tokens' logprobs
                events.pending_logprobs += _logprobs(state, req, step.o.delta_token_ids, step.o.delta_logprobs)
            for e in events.feed(step.delta):
                yield e
            reason = step.finish or reason
        final = out
    reply = events.reply(reason)
    closing, response = events.finish(reply, _usage(state, final), lambda r: _with_extras(state, req, r, final))
    _keep(state, req, response, reply)
    for e in closing:
        yield e


def _logprobs(state: ServerState, req: ResponsesRequest, token_ids: list[int], entries: list) -> list[dict[str, Any]]:
    return logprob_items(token_ids, entries, req.chat.params.logprobs or 0, False, state.token_text)


def _with_extras(
    state: ServerState, req: ResponsesRequest, response: dict[str, Any], final: RequestOutput
) -> dict[str, Any]:
    """The finished response with what the request asked beyond OpenAI's defaults: every
    output token's logprobs on the message's output_text (include, as vLLM puts them), and
    vLLM's enable_response_messages: the prompt and the reply as raw text and token ids."""
    o = final.outputs[0]
    if o.logprobs is not None:
        lps = _logprobs(state, req, o.token_ids, o.logprobs)
        for item in response["output"]:
            if item["type"] == "message" and item["content"]:
                item["content"][0]["logprobs"] = lps
    if req.raw_messages:
        prompt = state.info.tokenizer.decode(final.prompt_token_ids, skip_special_tokens=False)
        response["input_messages"] = [_raw_message(prompt, final.prompt_token_ids)]
        response["output_messages"] = [_raw_message(o.text, o.token_ids)]
    return response


def _raw_message(text: str, token_ids: list[int]) -> dict[str, Any]:
    """vLLM's ResponseRawMessageAndToken (its token ids are the truth where text and ids differ)."""
    return {"type": "raw_message_tokens", "message": text, "tokens": list(token_ids)}


def _usage(state: ServerState, final: RequestOutput) -> dict[str, Any]:
    """Usage, with the think block's tokens as the engine counted them (0 where none was tracked)."""
    counts = token_counts(state, final)
    return usage(counts.prompt, counts.completion, counts.cached, counts.reasoning or 0)


def _keep(state: ServerState, req: ResponsesRequest, response: dict[str, Any], reply: Reply) -> None:
    """Store a finished response with its conversation, the reply's turn included."""
    if not req.store or response["status"] == "failed":
        return
    turn: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.calls:
        turn["tool_calls"] = [c.to_openai() for c in reply.calls]
    if reply.reasoning:
        turn["reasoning_content"] = reply.reasoning
    state.responses.put(req.owner, response, [*req.conversation, turn])


def _stored(request: Request, state: ServerState) -> tuple[str, dict[str, Any]]:
    rid = request.path_params["response_id"]
    for name in request.query_params:  # include, stream, starting_after: none is implemented
        raise APIError(f"the query parameter '{name[:64]}' is not supported", param=name[:64])
    item = state.responses.get(rid, state.owner(request))
    if item is None:
        raise APIError(
            f"Response with id '{rid[:128]}' not found.", 404, param="response_id", code="response_not_found"
        )
    return rid, item.response


async def retrieve_response(request: Request, state: ServerState) -> Response:
    return JSONResponse(_stored(request, state)[1])


async def delete_response(request: Request, state: ServerState) -> Response:
    rid, _ = _stored(request, state)
    state.responses.delete(rid, state.owner(request))
    return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})


async def cancel_response(request: Request, state: ServerState) -> Response:
    """Every stored response has finished (no background mode): returned as it is."""
    return JSONResponse(_stored(request, state)[1])
