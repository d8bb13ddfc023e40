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
from rawpage.sampling_params import SamplingParams
from rawpage.server.chat import NO_EFFECT_FIELDS
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import (
    APIError,
    Body,
    OutputOptions,
    check_prompt_logprobs,
    logprobs_count,
    output_options,
    prompt_logprobs_json,
    sampling_params,
    usage,
)
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
    prompts = await _prompts(body, state)
    body.mark_read("suffix")
    if body.data.get("suffix"):
        raise APIError("'suffix' is not supported", param="suffix")
    out = output_options(body, state.config)
    echo = bool(body.bool("echo", False))
    params = _sampling_params(body, state, out, echo)
    if body.int("best_of", None, 1) not in (None, params.n):
        raise APIError("'best_of' other than n is not supported", param="best_of")
    priority, salt = state.priority(body), state.cache_salt(body)
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
    fmt = _Formatter(state, rid, params.n, echo, prompts, out)
    fmt.model = lora.lora_name if lora else state.model_name
    if out.stream:
        return sse_response(_stream(fmt, streams), rid)
    finals = await unless_disconnected(request, final_outputs(streams))
    choices = [
        fmt.choice(i, out, o, o.text, o.token_ids, o.logprobs, final=True)
        for i, out in enumerate(finals)
        for o in out.outputs
    ]
    return JSONResponse(fmt.envelope(choices, fmt.usage(finals)), headers={"X-Request-Id": rid})


def _sampling_params(body: Body, state: ServerState, out: OutputOptions, echo: bool) -> SamplingParams:
    """logprobs (-1: the whole vocabulary, as in vLLM) and vLLM's prompt_logprobs; an echo
    with logprobs brings the prompt's logprobs too."""
    limit, vocab = state.info.max_logprobs, state.info.vocab_size
    logprobs = logprobs_count(body, "logprobs", limit, vocab)
    prompt_logprobs = logprobs_count(body, "prompt_logprobs", limit, vocab)
    check_prompt_logprobs(prompt_logprobs, out.stream)
    if prompt_logprobs is None and echo and logprobs is not None:
        prompt_logprobs = logprobs
    return sampling_params(
        body,
        body.int("max_tokens", state.config.max_tokens_default or 16, 1),
        logprobs,
        prompt_logprobs=prompt_logprobs,
        config=state.config,
        structured_outputs=structured_outputs_from(body),
    )


async def _stream(fmt: _Formatter, streams: list[AsyncIterator[RequestOutput]]):
    finals: dict[int, RequestOutput] = {}
    async with aclosing(merge(streams)) as merged:
        async for i, out in merged:
            for o in out.outputs:
                if fmt.has_news(i, o):
                    chunk = fmt.choice(
                        i, out, o, o.delta_text, o.delta_token_ids, o.delta_logprobs, final=o.finish_reason is not None
                    )
                    yield sse(fmt.envelope([chunk], fmt.running_usage(i, out)))
            if out.finished:
                finals[i] = out
    if fmt.out.include_usage:
        yield sse(fmt.envelope([], fmt.usage(list(finals.values()))))
    yield sse("[DONE]")


class _Formatter:
    """Builds OpenAI completion objects (and stream chunks) from engine outputs."""

    def __init__(self, state: ServerState, rid: str, n: int, echo: bool, prompts: list, out: OutputOptions) -> None:
        self.state, self.rid, self.n, self.echo, self.prompts, self.out = state, rid, n, echo, prompts, out
        self.created = int(time.time())
        self.model = state.model_name  # or the LoRA adapter the request named
        self._chars: dict[tuple[int, int], int] = {}  # characters sent so far, per choice
        self._finished: set[tuple[int, int]] = set()  # choices whose last chunk went out
        self._latest: dict[int, RequestOutput] = {}  # each prompt's latest output, for continuous usage

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
        first piece of each choice; vLLM's prompt_logprobs, prompt_token_ids and token_ids
        are always there (null unless asked), the prompt's only in a choice's first piece."""
        key = (i, o.index)
        first = key not in self._chars
        offset = self._chars.get(key, 0)
        lp_ids, lp_entries = list(token_ids), list(logprobs) if logprobs is not None else None
        if self.echo and first:
            text = self._prompt_text(i) + text
            if lp_entries is not None:
                lp_ids = out.prompt_token_ids + lp_ids
                lp_entries = list(out.prompt_logprobs or [None] * len(out.prompt_token_ids)) + lp_entries
        self._chars[key] = offset + len(text)
        with_ids = self.out.return_token_ids
        return {
            "index": i * self.n + o.index,
            "text": text,
            "logprobs": self._logprobs(lp_ids, lp_entries, offset) if lp_entries is not None else None,
            "finish_reason": o.finish_reason if final else None,
            "stop_reason": o.stop_reason if final else None,
            "token_ids": list(token_ids) if with_ids else None,
            "prompt_logprobs": prompt_logprobs_json(out.prompt_logprobs, self.state.token_text) if first else None,
            "prompt_token_ids": list(out.prompt_token_ids) if with_ids and first else None,
        }

    def _prompt_text(self, i: int) -> str:
        """The prompt as echo repeats it. A token-id prompt is decoded with its special
        tokens, as logprobs.tokens and text_offset count them."""
        prompt_text, prompt_ids = self.prompts[i]
        if prompt_text is not None:
            return prompt_text
        return self.state.info.tokenizer.decode(prompt_ids, skip_special_tokens=False)

    def _logprobs(self, token_ids: list[int], entries: list, offset: int) -> dict[str, Any]:
        tokens = [self._token(t) for t in token_ids]
        offsets = []
        for t in token_ids:
            offsets.append(offset)
            offset += len(self.state.token_text(t))
        return {
            "tokens": tokens,
            "token_logprobs": [max(e[t].logprob, -9999.0) if e else None for t, e in zip(token_ids, entries)],
            "top_logprobs": [{self._token(k): v.logprob for k, v in e.items()} if e else None for e in entries],
            "text_offset": offsets,
        }

    def _token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.out.tokens_as_ids else self.state.token_text(token_id)

    def running_usage(self, i: int, out: RequestOutput) -> dict[str, Any] | None:
        """stream_options.continuous_usage_stats: the usage so far, on every chunk."""
        if not self.out.continuous_usage:
            return None
        self._latest[i] = out
        return self.usage(list(self._latest.values()))

    def usage(self, finals: list[RequestOutput]) -> dict[str, Any]:
        cached = sum(f.num_cached_tokens for f in finals)
        return usage(
            sum(len(f.prompt_token_ids) for f in finals),
            sum(len(o.token_ids) for f in finals for o in f.outputs),
            cached if self.state.config.enable_prompt_tokens_details else None,
        )
