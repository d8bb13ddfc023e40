"""POST /v1/chat/completions: messages -> chat template -> tokens -> engine -> message."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.sampling_params import SamplingParams
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.chat_request import (
    ChatRequest,
    constraint_for,
    final_output,
    reply_parser,
    reply_steps,
    submit,
    token_counts,
    tool_request,
)
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import (
    APIError,
    Body,
    OutputOptions,
    check_prompt_logprobs,
    logprob_token_ids,
    logprobs_count,
    output_options,
    prompt_logprobs_json,
    sampling_params,
    usage,
)
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse, sse_response
from rawpage.server.tools import prepare_tool_messages
from rawpage.structured_output import StructuredOutputsParams

# Fields both OpenAI and vLLM accept that change nothing here (README "Request fields").
NO_EFFECT_FIELDS = frozenset({"user", "safety_identifier"})


def parse_messages(body: Body) -> list[dict[str, Any]]:
    body.mark_read("messages")
    msgs = body.data.get("messages")
    # Any role reaches the template, as in vLLM: a template may know roles OpenAI does not.
    if not isinstance(msgs, list) or not msgs:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
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
    chat, fmt = parse_chat_request(body, state, state.request_id(request, "chatcmpl"))
    gen = await submit(request, state, chat)
    if fmt.out.stream:
        return sse_response(_stream(fmt, gen, chat.reply), chat.request_id)
    final = await final_output(request, gen)
    return JSONResponse(fmt.response(final, chat.reply), headers={"X-Request-Id": chat.request_id})


def parse_chat_request(body: Body, state: ServerState, rid: str) -> tuple[ChatRequest, ChatFormatter]:
    """A chat completion body -> the ChatRequest (every field read, the rest refused) and
    the formatter that writes its reply in chat's shape."""
    lora = state.check_model(body)
    messages = parse_messages(body)
    reply = reply_parser(state, tool_request(state, body), body.bool("include_reasoning", True))
    out = output_options(body, state.config)
    params = chat_sampling_params(body, state, out, output_constraint(body, reply))
    fmt = ChatFormatter(state, rid, out, params)
    fmt.role, fmt.echo = role_and_echo(body, messages)
    fmt.model = lora.lora_name if lora else state.model_name
    chat = ChatRequest(
        rid, messages, params, reply, state.render_options(body), lora, state.priority(body), state.cache_salt(body)
    )
    body.reject_unread(NO_EFFECT_FIELDS)
    return chat, fmt


def chat_sampling_params(
    body: Body, state: ServerState, out: OutputOptions, constraint: StructuredOutputsParams | None
) -> SamplingParams:
    """The chat request's sampling fields: logprobs (top_logprobs -1 is the whole vocabulary,
    as in vLLM), vLLM's prompt_logprobs and logprob_token_ids, and max_completion_tokens."""
    limit, vocab = state.info.max_logprobs, state.info.vocab_size
    want_logprobs = bool(body.bool("logprobs", False))
    top = logprobs_count(body, "top_logprobs", limit, vocab)
    if top and not want_logprobs:
        raise APIError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    chosen = logprob_token_ids(body, want_logprobs)
    prompt_logprobs = logprobs_count(body, "prompt_logprobs", limit, vocab)
    check_prompt_logprobs(prompt_logprobs, out.stream)
    if prompt_logprobs is None and body.bool("echo", False) and not out.stream:
        prompt_logprobs = top or 0  # vLLM: an echoed chat brings the prompt's logprobs
    max_tokens = body.int("max_completion_tokens", None, 1)
    legacy_max_tokens = body.int("max_tokens", state.config.max_tokens_default, 1)
    max_tokens = legacy_max_tokens if max_tokens is None else max_tokens
    logprobs = (len(chosen) if chosen else top or 0) if want_logprobs else None
    return sampling_params(
        body,
        max_tokens,
        logprobs,
        prompt_logprobs=prompt_logprobs,
        config=state.config,
        structured_outputs=constraint,
        logprob_token_ids=chosen,
    )


def role_and_echo(body: Body, messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The reply's role and what `echo` prepends, as vLLM decides them: the role is
    "assistant" after a generation prompt, else the last message's; echo repeats the last
    message's content when that message has the reply's role. With continue_final_message
    the template leaves that message open, so the model continues it."""
    generation_prompt = body.bool("add_generation_prompt", True)
    continue_final = body.bool("continue_final_message", False)
    if generation_prompt and continue_final:
        raise APIError(
            "'continue_final_message' needs 'add_generation_prompt': false (the template cannot both "
            "open a new message and leave the last one open)",
            param="continue_final_message",
        )
    role = "assistant" if generation_prompt else messages[-1]["role"]
    echo = messages[-1]["content"] if body.bool("echo", False) and messages[-1]["role"] == role else ""
    return role, echo


def chat_choice(fmt: ChatFormatter, reply: ReplyParser, o: CompletionOutput) -> dict:
    """One finished choice of a non-streamed reply: its message (with tool calls and
    reasoning split out), logprobs and why it stopped."""
    message, finish = reply.message(o.text, o.finish_reason)
    message["role"] = fmt.role
    if fmt.echo:
        message["content"] = fmt.echo + (message["content"] or "")
    return {
        "index": o.index,
        "message": message,
        "logprobs": fmt.logprobs(o.token_ids, o.logprobs) if o.logprobs is not None else None,
        "finish_reason": finish,
        "stop_reason": o.stop_reason,
        "token_ids": list(o.token_ids) if fmt.out.return_token_ids else None,
    }


def output_constraint(body: Body, reply: ReplyParser) -> StructuredOutputsParams | None:
    """The request's grammar: response_format / guided_* / structured_outputs, or the one a
    required or named tool_choice brings (chat_request.constraint_for)."""
    return constraint_for(structured_outputs_from(body), "response_format or the guided_* fields", reply)


async def _stream(fmt: ChatFormatter, gen: AsyncIterator[RequestOutput], reply: ReplyParser):
    final = None
    async for out, steps in reply_steps(gen, reply):
        for step in steps:
            o = step.o
            if step.first:  # the role comes first, on its own, as OpenAI does
                for chunk in fmt.opening(o.index, out):
                    yield sse(chunk)
            lp = fmt.logprobs(o.delta_token_ids, o.delta_logprobs) if o.delta_logprobs else None
            if step.delta or lp or o.finish_reason:  # text held back (a tag, a call) sends nothing yet
                yield sse(fmt.chunk(o.index, step.delta or {"content": ""}, lp, out, o, step.finish))
        final = out
    if fmt.out.include_usage and final is not None:
        yield sse(fmt.envelope([], fmt.usage(final), "chat.completion.chunk"))
    yield sse("[DONE]")


class ChatFormatter:
    """Builds chat completion objects and stream chunks, with vLLM's extras (OutputOptions)."""

    def __init__(self, state: ServerState, rid: str, out: OutputOptions, params: SamplingParams) -> None:
        self.state, self.rid, self.out, self.created = state, rid, out, int(time.time())
        chosen = params.logprob_token_ids
        self.top_logprobs = len(chosen) if chosen else params.logprobs or 0
        self.model = state.model_name  # or the LoRA adapter the request named
        self.role, self.echo = "assistant", ""  # see role_and_echo

    def envelope(self, choices: list[dict], usage_: dict | None, obj: str) -> dict[str, Any]:
        out = {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage_ is not None:
            out["usage"] = usage_
        return out

    def response(self, final: RequestOutput, reply: ReplyParser) -> dict[str, Any]:
        """The whole reply; vLLM's prompt_logprobs and prompt_token_ids are always there (null unless asked)."""
        out = self.envelope([chat_choice(self, reply, o) for o in final.outputs], self.usage(final), "chat.completion")
        out["prompt_logprobs"] = prompt_logprobs_json(final.prompt_logprobs, self.state.token_text)
        out["prompt_token_ids"] = list(final.prompt_token_ids) if self.out.return_token_ids else None
        return out

    def opening(self, index: int, out: RequestOutput) -> list[dict[str, Any]]:
        """A choice's first chunks: its role (and, as vLLM, prompt_token_ids), then what echo repeats."""
        first = self.chunk(index, {"role": self.role, "content": ""}, None, out)
        if self.out.return_token_ids:
            first["prompt_token_ids"] = list(out.prompt_token_ids)
        return [first, self.chunk(index, {"content": self.echo}, None, out)] if self.echo else [first]

    def chunk(
        self,
        index: int,
        delta: dict,
        logprobs: dict | None,
        out: RequestOutput,
        o: CompletionOutput | None = None,
        finish: str | None = None,
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if finish:
            choice["stop_reason"] = o.stop_reason
        if self.out.return_token_ids:
            choice["token_ids"] = list(o.delta_token_ids) if o is not None else []
        usage_ = self.usage(out) if self.out.continuous_usage else None
        return self.envelope([choice], usage_, "chat.completion.chunk")

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.out.tokens_as_ids else self.state.token_text(token_id)

    def logprobs(self, token_ids: list[int], entries: list) -> dict[str, Any]:
        def item(tok: int, lp: float) -> dict[str, Any]:
            text = self.token(tok)
            return {"token": text, "logprob": max(lp, -9999.0), "bytes": list(text.encode("utf-8"))}

        content = []
        for tok, e in zip(token_ids, entries):
            top = sorted(
                (v.rank, t, v.logprob) for t, v in e.items() if v.rank is not None and v.rank <= self.top_logprobs
            )
            content.append({**item(tok, e[tok].logprob), "top_logprobs": [item(t, lp) for _, t, lp in top]})
        return {"content": content}

    def usage(self, final: RequestOutput) -> dict[str, Any]:
        counts = token_counts(self.state, final)
        return usage(counts.prompt, counts.completion, counts.cached)
