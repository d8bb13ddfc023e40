"""POST /v1/completions: text in, text out, streaming or not."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.server.chat import NO_EFFECT_FIELDS
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import APIError, Body, sampling_params, usage
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, merge, sse, sse_response, unless_disconnected


async def _prompts(body: Body, state: ServerState) -> list[tuple[str | None, list[int]]]:
    """'prompt' may be a string, a list of strings, a list of token ids, or a list of lists;
    at most --max-prompts-per-request of them. Tokenization runs off the event loop."""
    body.mark_read("prompt")
    p = body.data.get("prompt")
    limit = state.config.max_prompts_per_request
    if isinstance(p, list) and p and not all(isinstance(x, int) for x in p) and len(p) > limit:
        raise APIError(
            f"'prompt' has {len(p)} prompts; the limit is {limit} (--max-prompts-per-request)", param="prompt"
        )
    if isinstance(p, str) and p:
        p = [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) and x for x in p):
            return list(zip(p, await state.encode(p)))
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [(None, p)]
        if all(isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in p):
            return [(None, x) for x in p]
    raise APIError("'prompt' must be a non-empty string, list of strings, or list of token ids", param="prompt")


async def create_completion(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    lora = state.check_model(body)
    max_logprobs = state.llm.args.max_logprobs
    prompts = await _prompts(body, state)
    body.mark_read("suffix")
    if body.data.get("suffix"):
        raise APIError("'suffix' is not supported", param="suffix")
    echo = body.bool("echo", False)
    logprobs = body.int("logprobs", None, 0, max_logprobs)
    max_tokens = body.int("max_tokens", state.config.max_tokens_default or 16, 1)
    params = sampling_params(
        body,
        max_tokens,
        logprobs,
        prompt_logprobs=logprobs if echo and logprobs is not None else None,
        config=state.config,
        structured_outputs=structured_outputs_from(body),
    )
    if body.int("best_of", None, 1) not in (None, params.n):
        raise APIError("'best_of' other than n is not supported", param="best_of")
    stream = body.bool("stream", False)
    stream_options = body.obj("stream_options")
    include_usage = stream_options.bool("include_usage", False) or state.config.enable_force_include_usage
    priority, salt = state.priority(body), state.cache_salt(body)
    stream_options.reject_unread()
    body.reject_unread(NO_EFFECT_FIELDS)
    await state.compile_grammar(params)
    for _, ids in prompts:
        state.validate_prompt(ids, params, "prompt")
    rid = state.request_id(request, "cmpl")
    tag = uuid.uuid4().hex[:8]
    state.engine.check_capacity(len(prompts))
    args = (params, priority, lora, state.owner(request))  # the same for every prompt
    streams = [
        state.engine.generate(f"{rid}#{i}#{tag}", {"prompt_token_ids": ids, "cache_salt": salt}, *args)
        for i, (_, ids) in enumerate(prompts)
    ]
    fmt = _Formatter(state, rid, params.n, echo, prompts)
    fmt.model = lora.lora_name if lora else state.model_name
    if stream:
        return sse_response(_stream(fmt, streams, include_usage), rid)
    finals = await unless_disconnected(request, final_outputs(streams))
    choices = [
        fmt.choice(i, out, o, o.text, o.token_ids, o.logprobs, final=True)
        for i, out in enumerate(finals)
        for o in out.outputs
    ]
    return JSONResponse(fmt.envelope(choices, fmt.usage(finals)), headers={"X-Request-Id": rid})


async def _stream(fmt: _Formatter, streams: list[AsyncIterator[RequestOutput]], include_usage: bool):
    finals: dict[int, RequestOutput] = {}
    async with aclosing(merge(streams)) as merged:
        async for i, out in merged:
            for o in out.outputs:
                if fmt.has_news(i, o):
                    chunk = fmt.choice(
                        i, out, o, o.delta_text, o.delta_token_ids, o.delta_logprobs, final=o.finish_reason is not None
                    )
                    yield sse(fmt.envelope([chunk], None))
            if out.finished:
                finals[i] = out
    if include_usage:
        yield sse(fmt.envelope([], fmt.usage(list(finals.values()))))
    yield sse("[DONE]")


class _Formatter:
    """Builds OpenAI completion objects (and stream chunks) from engine outputs."""

    def __init__(self, state: ServerState, rid: str, n: int, echo: bool, prompts: list) -> None:
        self.state, self.rid, self.n, self.echo, self.prompts = state, rid, n, echo, prompts
        self.created = int(time.time())
        self.model = state.model_name  # or the LoRA adapter the request named
        self._chars: dict[tuple[int, int], int] = {}  # characters sent so far, per choice
        self._finished: set[tuple[int, int]] = set()  # choices whose last chunk went out

    def has_news(self, i: int, o: CompletionOutput) -> bool:
        """Does this choice need a stream chunk now? New text or tokens, its finish, or
        (with echo) its very first piece."""
        key = (i, o.index)
        if key in self._finished:
            return False
        if o.finish_reason is not None:
            self._finished.add(key)
            return True
        return bool(o.delta_text or o.delta_token_ids) or (self.echo and key not in self._chars)

    def envelope(self, choices: list[dict], usage_: dict | None) -> dict[str, Any]:
        obj = {
            "id": self.rid,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_ is not None:
            obj["usage"] = usage_
        return obj

    def choice(
        self,
        i: int,
        out: RequestOutput,
        o: CompletionOutput,
        text: str,
        token_ids: list[int],
        logprobs: list | None,
        final: bool,
    ) -> dict[str, Any]:
        """Choice number i * n + o.index. With echo, the prompt (and its logprobs) leads the
        first piece of each choice."""
        key = (i, o.index)
        first = key not in self._chars
        offset = self._chars.get(key, 0)
        lp_ids, lp_entries = list(token_ids), list(logprobs) if logprobs is not None else None
        if self.echo and first:
            prompt_text, prompt_ids = self.prompts[i]
            text = (prompt_text if prompt_text is not None else self.state.llm.tokenizer.decode(prompt_ids)) + text
            if lp_entries is not None:
                lp_ids = out.prompt_token_ids + lp_ids
                lp_entries = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + lp_entries
        self._chars[key] = offset + len(text)
        return {
            "index": i * self.n + o.index,
            "text": text,
            "logprobs": self._logprobs(lp_ids, lp_entries, offset) if lp_entries is not None else None,
            "finish_reason": o.finish_reason if final else None,
            "stop_reason": o.stop_reason if final else None,
        }

    def _logprobs(self, token_ids: list[int], entries: list, offset: int) -> dict[str, Any]:
        tokens = [self.state.token_text(t) for t in token_ids]
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [e[t].logprob if e else None for t, e in zip(token_ids, entries)],
            "top_logprobs": [
                {self.state.token_text(k): v.logprob for k, v in e.items()} if e else None for e in entries
            ],
            "text_offset": offsets,
        }

    def usage(self, finals: list[RequestOutput]) -> dict[str, Any]:
        cached = sum(f.num_cached_tokens for f in finals)
        return usage(
            sum(len(f.prompt_token_ids) for f in finals),
            sum(len(o.token_ids) for f in finals for o in f.outputs),
            cached if self.state.config.enable_prompt_tokens_details else None,
        )
