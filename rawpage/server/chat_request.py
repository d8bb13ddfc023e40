"""The one path every chat-shaped API takes through the server.

    /v1/chat/completions ─┐  parse its own body        ┌─► chat.completion / chunks
    /v1/responses ────────┼─► ChatRequest ─► submit ─► engine ─► reply_steps / final_output ─┼─► response / events
    /v1/messages ─────────┘  (messages, tools,          └─► message / events
                              constraint, params)

Each API translates its request into a ChatRequest: OpenAI chat messages (the chat
template's input), the ToolRequest and reasoning parser (in its ReplyParser), and
SamplingParams that carry the grammar. From there the work is the same for all:
the template, the grammar compile, the prompt checks, the engine's queue and limits,
and reading tool calls and reasoning back out of the text (chat_reply.py). Each API
then only writes the Reply (or the stream's deltas) in its own shape.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from rawpage.lora import LoRARequest
from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.sampling_params import SamplingParams
from rawpage.server.async_engine import RequestStream
from rawpage.server.chat_reply import ReplyParser, ReplyStream
from rawpage.server.protocol import APIError, Body
from rawpage.server.reasoning import PARSERS as REASONING_PARSERS
from rawpage.server.state import RenderOptions, ServerState
from rawpage.server.streaming import final_outputs, merge, unless_disconnected
from rawpage.server.tools import ToolRequest, tool_request_from
from rawpage.structured_output import StructuredOutputsParams


@dataclass
class ChatRequest:
    """One generation request as the engine side of the server sees it, whichever API sent it."""

    request_id: str  # the API's id (chatcmpl-..., resp_..., msg_...)
    messages: list[dict[str, Any]]  # OpenAI chat messages, checked (tools.prepare_tool_messages)
    params: SamplingParams  # with the grammar, if any (structured_outputs)
    reply: ReplyParser  # the tools and reasoning parser that read the text back
    render: RenderOptions = field(default_factory=RenderOptions)
    lora: LoRARequest | None = None
    priority: int = 0
    cache_salt: str | None = None
    param: str = "messages"  # the field a prompt error is blamed on ("input" for Responses)
    engine_request_id: str = ""  # set by submit: request_id plus a suffix, unique in the engine

    @property
    def tools(self) -> ToolRequest | None:
        return self.reply.tools


def tool_request(state: ServerState, body: Body) -> ToolRequest | None:
    """A body's tools, tool_choice and parallel_tool_calls in chat's shapes, checked against the model's template."""
    return tool_request_from(body, state.config, state.info.template)


def reply_parser(state: ServerState, tools: ToolRequest | None, include_reasoning: bool = True) -> ReplyParser:
    """The ReplyParser for a request: its tools and the server's --reasoning-parser."""
    return ReplyParser(tools, REASONING_PARSERS.get(state.config.reasoning_parser or ""), include_reasoning)


def constraint_for(
    given: StructuredOutputsParams | None, given_name: str, reply: ReplyParser
) -> StructuredOutputsParams | None:
    """The request's grammar: the one it gave (`given_name` names that field), or the one a
    required or named tool_choice brings, never both; with a reasoning parser it applies outside <think>…</think>."""
    forced = reply.tools.constraint() if reply.tools else None
    if given is not None and forced is not None:
        raise APIError(
            f'tool_choice "{reply.tools.choice}" already constrains the reply; drop {given_name}', param="tool_choice"
        )
    constraint = given or forced
    if constraint is not None and reply.reasoning is not None:
        constraint.reasoning = reply.reasoning.tags
    return constraint


async def prompt_ids(state: ServerState, chat: ChatRequest) -> list[int]:
    """The chat template over the messages (and the tools, unless tool_choice is "none")."""
    tools = chat.tools.template_tools() if chat.tools else None
    return await state.render_chat(chat.render, chat.messages, chat.param, tools)


async def submit(request: Request, state: ServerState, chat: ChatRequest) -> RequestStream:
    """Render, compile the grammar (a bad one is a 400 before anything streams), check the
    prompt against the context and the queue against --max-waiting-requests, and queue it."""
    ids = await prompt_ids(state, chat)
    chat.reply = chat.reply.for_prompt(state.info.tokenizer, ids)  # a think block the prompt left open, or not
    await state.compile_grammar(chat.params)
    state.validate_prompt(ids, chat.params, chat.param)
    state.engine.check_capacity(1)
    chat.engine_request_id = f"{chat.request_id}#{uuid.uuid4().hex[:8]}"
    prompt = {"prompt_token_ids": ids, "cache_salt": chat.cache_salt}
    return state.engine.generate(
        chat.engine_request_id, prompt, chat.params, chat.priority, chat.lora, state.owner(request)
    )


async def final_output(request: Request, gen: RequestStream) -> RequestOutput:
    """The request run to its end (aborted if the client leaves first)."""
    (final,) = await unless_disconnected(request, final_outputs([gen]))
    return final


@dataclass
class ReplyStep:
    """What one engine output adds to one choice, already split by the ReplyStream."""

    o: CompletionOutput
    delta: dict[str, Any]  # chat's delta shape: reasoning_content, content, tool_calls (at the end)
    first: bool  # the choice's first step: where an API opens its message
    finish: str | None  # the reply's finish reason, on the choice's last step


async def reply_steps(
    gen: AsyncIterator[RequestOutput], reply: ReplyParser
) -> AsyncIterator[tuple[RequestOutput, list[ReplyStep]]]:
    """Each engine output with the steps of its unfinished choices. The stream holds back
    only text that may be a tag or a call, so the steps add up to what `reply.parse` says
    of the whole text: streamed and non-streamed replies agree."""
    streams: dict[int, ReplyStream] = {}
    finished: set[int] = set()
    async with aclosing(merge([gen])) as merged:
        async for _, out in merged:
            steps = []
            for o in out.outputs:
                if o.index in finished:
                    continue
                first = o.index not in streams
                stream = streams.setdefault(o.index, reply.stream())
                delta, finish = stream.feed(o.delta_text), None
                if o.finish_reason:
                    last, finish = stream.finish(o.finish_reason)
                    delta = _join(delta, last)
                    finished.add(o.index)
                steps.append(ReplyStep(o, delta, first, finish))
            yield out, steps


def _join(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two deltas as one: text fields concatenate."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out and isinstance(v, str) else v
    return out


@dataclass
class TokenCounts:
    prompt: int
    completion: int
    cached: int | None  # only under --enable-prompt-tokens-details (it leaks other requests' prefixes)


def token_counts(state: ServerState, final: RequestOutput) -> TokenCounts:
    cached = final.num_cached_tokens if state.config.enable_prompt_tokens_details else None
    return TokenCounts(len(final.prompt_token_ids), sum(len(o.token_ids) for o in final.outputs), cached)
