"""POST /v1/chat/completions: messages -> chat template -> tokens -> engine -> message."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.server.chat_input import parse_chat_completion
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.chat_request import final_output, reply_steps, submit, token_counts
from rawpage.server.logprob_items import logprob_items
from rawpage.server.protocol import prompt_logprobs_json, usage
from rawpage.server.request import ChatCompletionRequest
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse, sse_response


async def create_chat_completion(request: Request, state: ServerState) -> Response:
    req = await state.parse(
        request, parse_chat_completion, state.request_id(request, "chatcmpl"), state.caller(request)
    )
    fmt = ChatFormatter(state, req)
    gen, reply = await submit(request, state, req.chat)
    if req.output.stream:
        return sse_response(_stream(fmt, gen, reply), req.chat.request_id)
    final = await final_output(request, gen)
    return JSONResponse(fmt.response(final, reply), headers={"X-Request-Id": req.chat.request_id})


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


async def _stream(fmt: ChatFormatter, gen: AsyncIterator[RequestOutput], reply: ReplyParser):
    final = None
    async for out, steps in reply_steps(gen, reply):
        for step in steps:
            o = step.o
            if step.first:  # the role comes first, on its own, as OpenAI does
                for chunk in fmt.opening(o.index, out):
                    yield sse(chunk)
            lp = fmt.logprobs(o.delta_token_ids, o.delta_logprobs) if o.delta_logprobs else None
            ids = fmt.out.return_token_ids and o.delta_token_ids  # as vLLM: every token's id goes out
            if step.delta or lp or ids or o.finish_reason:  # text held back (a tag, a call) sends nothing yet
                yield sse(fmt.chunk(o.index, step.delta or {"content": ""}, lp, out, o, step.finish))
        final = out
    if fmt.out.include_usage and final is not None:
        yield sse(fmt.envelope([], fmt.usage(final), "chat.completion.chunk"))
    yield sse("[DONE]")


class ChatFormatter:
    """Builds chat completion objects and stream chunks, with vLLM's extras (OutputOptions)."""

    def __init__(self, state: ServerState, req: ChatCompletionRequest) -> None:
        self.state, self.rid, self.out, self.created = state, req.chat.request_id, req.output, int(time.time())
        params = req.chat.params
        self.fixed_ids = params.logprob_token_ids is not None  # vLLM: the sampled token and these ids
        self.top_logprobs = params.logprobs or 0
        self.model = req.model  # the served name, or the LoRA adapter the request named
        self.role, self.echo = req.role, req.echo  # see chat_input.role_and_echo

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
        """A choice's first chunks: its role (and, as vLLM, prompt_token_ids), then what echo repeats.
        Their running usage (continuous_usage_stats) counts no completion tokens yet, as vLLM's:
        the tokens this step made arrive in the next chunk."""
        chunks = [self.chunk(index, {"role": self.role, "content": ""}, None, out)]
        if self.out.return_token_ids:
            chunks[0]["prompt_token_ids"] = list(out.prompt_token_ids)
        if self.echo:
            chunks.append(self.chunk(index, {"content": self.echo}, None, out))
        for c in chunks:
            if "usage" in c:
                counts = token_counts(self.state, out)
                c["usage"] = usage(counts.prompt, 0, counts.cached)
        return chunks

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
        return {"content": logprob_items(token_ids, entries, self.top_logprobs, self.fixed_ids, self.token)}

    def usage(self, final: RequestOutput) -> dict[str, Any]:
        counts = token_counts(self.state, final)
        return usage(counts.prompt, counts.completion, counts.cached, counts.reasoning)
