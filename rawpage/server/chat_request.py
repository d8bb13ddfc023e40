"""The one path every chat-shaped API takes through the server.

    /v1/chat/completions ─┐  parsed once (request.py)   ┌─► chat.completion / chunks
    /v1/responses ────────┼─► ChatRequest ─► submit ─► engine ─► reply_steps / final_output ─┼─► response / events
    /v1/messages ─────────┘  (messages, tools,          └─► message / events
                              constraint, params)

Each API parses its body into a typed request that holds a ChatRequest (request.py):
OpenAI chat messages (the chat template's input), the ToolRequest and reasoning parser
(in its ReplyParser), and SamplingParams that carry the grammar. From there the work is
the same for all: the template, the engine's one check of the request and its grammar's
compile (ServerState.check_prompt), the queue's limit, and reading tool calls and
reasoning back out of the text (chat_reply.py). Each API then only writes the Reply (or
the stream's deltas) in its own shape.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from rawpage.multimodal.image_input import ImageInput
from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.request_checks import CheckedPrompt
from rawpage.server.async_engine import RequestStream
from rawpage.server.chat_reply import ReplyParser, ReplyStream
from rawpage.server.request import ChatRequest
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, merge, unless_disconnected


async def prompt_ids(state: ServerState, chat: ChatRequest) -> tuple[list[int], tuple[ImageInput, ...]]:
    """The chat template over the messages (and the tools, unless tool_choice is "none"),
    cut to truncate_prompt_tokens where the request asks (vLLM cuts the rendered prompt too);
    and the messages' images, whose soft tokens the ids hold."""
    tools = chat.tools.template_tools() if chat.tools else None
    ids, images = await state.render_chat_images(chat.render, chat.messages, chat.param, tools)
    return (chat.truncation.apply(ids) if chat.truncation is not None else ids), images


async def checked_prompt(state: ServerState, chat: ChatRequest) -> tuple[CheckedPrompt, ReplyParser]:
    """Render, then the engine's one check of the request, its grammar compiled (a bad one
    is a 400 before anything streams); and the reply parser for this prompt (a think block
    the prompt left open, or not)."""
    ids, images = await prompt_ids(state, chat)
    reply = chat.reply.for_prompt(state.info.tokenizer, ids)
    params = chat.params
    if chat.tools and chat.tools.keeps_special_tokens():  # the format's tags are special tokens
        params = dataclasses.replace(params, skip_special_tokens=False)
    return await state.check_prompt(ids, params, chat.param, chat.priority, chat.cache_salt, images), reply


async def submit(request: Request, state: ServerState, chat: ChatRequest) -> tuple[RequestStream, ReplyParser]:
    """The checked prompt queued, unless the queue holds --max-waiting-requests already:
    the stream of its outputs, and the parser that reads them."""
    checked, reply = await checked_prompt(state, chat)
    state.engine.check_capacity(1)
    rid = f"{chat.request_id}#{uuid.uuid4().hex[:8]}"  # unique in the engine
    return state.engine.generate(rid, checked, chat.lora, state.owner(request)), reply


async def final_output(request: Request, gen: RequestStream) -> RequestOutput:
    """The request run to its end (aborted if the client leaves first)."""
    (final,) = await unless_disconnected(request, final_outputs([gen]))
    return final


@dataclass
class ReplyStep:
    """What one engine output adds to one choice, already split by the ReplyStream."""

    o: CompletionOutput
    delta: dict[str, Any]  # chat's delta shape: reasoning_content, content, tool_calls (entries as they grow)
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
    """Two deltas as one: text fields and tool_calls entries concatenate."""
    out = dict(a)
    for k, v in b.items():
        out[k] = out[k] + v if k in out and isinstance(v, (str, list)) else v
    return out


@dataclass
class TokenCounts:
    prompt: int
    completion: int
    cached: int | None  # only under --enable-prompt-tokens-details (it leaks other requests' prefixes)
    reasoning: int | None = None  # the think blocks' tokens, where the engine tracked them (thinking_budget.py)


def token_counts(state: ServerState, final: RequestOutput) -> TokenCounts:
    cached = final.num_cached_tokens if state.config.enable_prompt_tokens_details else None
    tracked = [o.reasoning_tokens for o in final.outputs if o.reasoning_tokens is not None]
    completion = sum(len(o.token_ids) for o in final.outputs)
    return TokenCounts(len(final.prompt_token_ids), completion, cached, sum(tracked) if tracked else None)
