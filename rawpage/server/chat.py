"""POST /v1/chat/completions: messages -> chat template -> tokens -> engine -> message."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.server.chat_reply import ReplyParser, ReplyStream
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import APIError, Body, sampling_params, usage
from rawpage.server.reasoning import PARSERS as REASONING_PARSERS
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, merge, sse, sse_response, unless_disconnected
from rawpage.server.tools import ToolRequest, prepare_tool_messages, tool_request_from
from rawpage.structured_output import StructuredOutputsParams

ROLES = ("system", "user", "assistant", "tool", "developer")


# Fields both OpenAI and vLLM accept that change nothing here (README "Request fields").
NO_EFFECT_FIELDS = frozenset({"user", "safety_identifier"})


def parse_messages(body: Body) -> list[dict[str, Any]]:
    body.mark_read("messages")
    msgs = body.data.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
        if m["role"] not in ROLES:
            raise APIError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m['role'][:32]!r}",
                param=f"messages[{i}].role",
            )
        content = m.get("content")
        if isinstance(content, list):  # content parts: we take text
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(
                        f"messages[{i}]: only text content parts are supported",
                        param=f"messages[{i}].content",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise APIError(
                f"messages[{i}].content must be a string or a list of parts",
                param=f"messages[{i}].content",
            )
        out.append({**m, "content": content})
    prepare_tool_messages(out)
    return out


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    lora = state.check_model(body)
    llm = state.llm
    messages = parse_messages(body)
    want_logprobs = body.bool("logprobs", False)
    top = body.int("top_logprobs", None, 0, llm.args.max_logprobs)
    if top is not None and not want_logprobs:
        raise APIError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    max_tokens = body.int("max_completion_tokens", None, 1)
    legacy_max_tokens = body.int("max_tokens", state.config.max_tokens_default, 1)
    max_tokens = legacy_max_tokens if max_tokens is None else max_tokens
    tools = tool_request_from(body, state.config)
    reply = ReplyParser(tools, REASONING_PARSERS.get(state.config.reasoning_parser or ""))
    constraint = output_constraint(body, tools, reply)
    params = sampling_params(
        body, max_tokens, (top or 0) if want_logprobs else None, config=state.config, structured_outputs=constraint
    )
    stream = body.bool("stream", False)
    stream_options = body.obj("stream_options")
    include_usage = stream_options.bool("include_usage", False) or state.config.enable_force_include_usage
    ids = await state.render_chat(body, messages, tools=tools.template_tools() if tools else None)
    stream_options.reject_unread()
    priority, salt = state.priority(body), state.cache_salt(body)
    body.reject_unread(NO_EFFECT_FIELDS)
    await state.compile_grammar(params)
    state.validate_prompt(ids, params, "messages")
    rid = state.request_id(request, "chatcmpl")
    prompt = {"prompt_token_ids": ids, "cache_salt": salt}
    state.engine.check_capacity(1)
    gen = state.engine.generate(f"{rid}#{uuid.uuid4().hex[:8]}", prompt, params, priority, lora, state.owner(request))
    fmt = _ChatFormatter(state, rid, top or 0)
    fmt.model = lora.lora_name if lora else state.model_name
    if stream:
        return sse_response(_stream(fmt, gen, include_usage, reply), rid)
    (final,) = await unless_disconnected(request, final_outputs([gen]))
    choices = [_choice(fmt, reply, o) for o in final.outputs]
    return JSONResponse(fmt.envelope(choices, fmt.usage(final), "chat.completion"), headers={"X-Request-Id": rid})


def _choice(fmt: _ChatFormatter, reply: ReplyParser, o: CompletionOutput) -> dict:
    """One finished choice of a non-streamed reply: its message (with tool calls and
    reasoning split out), logprobs and why it stopped."""
    message, finish = reply.message(o.text, o.finish_reason)
    return {
        "index": o.index,
        "message": message,
        "logprobs": fmt.logprobs(o.token_ids, o.logprobs) if o.logprobs is not None else None,
        "finish_reason": finish,
        "stop_reason": o.stop_reason,
    }


def output_constraint(body: Body, tools: ToolRequest | None, reply: ReplyParser) -> StructuredOutputsParams | None:
    """The request's grammar: response_format / guided_* / structured_outputs, or the one a
    required or named tool_choice brings; with a reasoning parser it starts after </think>."""
    constraint = structured_outputs_from(body)
    forced = tools.constraint() if tools else None
    if constraint is not None and forced is not None:
        raise APIError(
            f'tool_choice "{tools.choice}" already constrains the reply; drop response_format or the guided_* fields',
            param="tool_choice",
        )
    constraint = constraint or forced
    if constraint is not None and reply.reasoning is not None:
        constraint.after = reply.reasoning.end_tag
    return constraint


async def _stream(fmt: _ChatFormatter, gen: AsyncIterator[RequestOutput], include_usage: bool, reply: ReplyParser):
    final = None
    streams: dict[int, ReplyStream] = {}
    finished: set[int] = set()
    async with aclosing(merge([gen])) as merged:
        async for _, out in merged:
            for o in out.outputs:
                if o.index in finished:
                    continue
                if o.index not in streams:  # the role comes first, on its own, as OpenAI does
                    streams[o.index] = reply.stream()
                    yield sse(fmt.chunk(o.index, {"role": "assistant", "content": ""}, None, None))
                delta = streams[o.index].feed(o.delta_text)
                finish = None
                if o.finish_reason:
                    last, finish = streams[o.index].finish(o.finish_reason)
                    delta = _join(delta, last)
                lp = fmt.logprobs(o.delta_token_ids, o.delta_logprobs) if o.delta_logprobs else None
                if delta or lp or o.finish_reason:  # text held back (a tag, a call) sends nothing yet
                    yield sse(fmt.chunk(o.index, delta or {"content": ""}, lp, o, finish))
                if o.finish_reason:
                    finished.add(o.index)
            final = out
    if include_usage and final is not None:
        yield sse(fmt.envelope([], fmt.usage(final), "chat.completion.chunk"))
    yield sse("[DONE]")


def _join(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two deltas as one: text fields concatenate."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out and isinstance(v, str) else v
    return out


class _ChatFormatter:
    def __init__(self, state: ServerState, rid: str, top_logprobs: int) -> None:
        self.state, self.rid, self.created = state, rid, int(time.time())
        self.top_logprobs = top_logprobs
        self.model = state.model_name  # or the LoRA adapter the request named

    def envelope(self, choices: list[dict], usage_: dict | None, obj: str) -> dict[str, Any]:
        out = {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def chunk(
        self, index: int, delta: dict, logprobs: dict | None, o: CompletionOutput | None, finish: str | None = None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if finish:
            choice["stop_reason"] = o.stop_reason
        return self.envelope([choice], None, "chat.completion.chunk")

    def logprobs(self, token_ids: list[int], entries: list) -> dict[str, Any]:
        def item(tok: int, lp: float) -> dict[str, Any]:
            text = self.state.token_text(tok)
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

        content = []
        for tok, e in zip(token_ids, entries):
            top = sorted(
                (v.rank, t, v.logprob) for t, v in e.items() if v.rank is not None and v.rank <= self.top_logprobs
            )
            content.append({**item(tok, e[tok].logprob), "top_logprobs": [item(t, lp) for _, t, lp in top]})
        return {"content": content}

    def usage(self, final: RequestOutput) -> dict[str, Any]:
        return usage(
            len(final.prompt_token_ids),
            sum(len(o.token_ids) for o in final.outputs),
            final.num_cached_tokens if self.state.config.enable_prompt_tokens_details else None,
        )
