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
from rawpage.server.prompt_input import parse_completion
from rawpage.server.protocol import OutputOptions, prompt_logprobs_json, usage
from rawpage.server.request import CompletionRequest
from rawpage.server.state import ServerState
from rawpage.server.streaming import final_outputs, merge, sse, sse_response, unless_disconnected


async def create_completion(request: Request, state: ServerState) -> Response:
    req = await state.parse(request, parse_completion, state.request_id(request, "cmpl"))
    prompts = await _tokenized(state, req)
    checked = [await state.check_prompt(ids, req.params, "prompt", req.priority, req.cache_salt) for _, ids in prompts]
    tag = uuid.uuid4().hex[:8]
    state.engine.check_capacity(len(prompts))
    owner = state.owner(request)
    streams = [state.engine.generate(f"{req.request_id}#{i}#{tag}", c, req.lora, owner) for i, c in enumerate(checked)]
    fmt = _Formatter(state, req, prompts)
    if req.output.stream:
        return sse_response(_stream(fmt, streams), req.request_id)
    finals = await unless_disconnected(request, final_outputs(streams))
    choices = [
        fmt.choice(i, out, o, o.text, o.token_ids, o.logprobs, final=True)
        for i, out in enumerate(finals)
        for o in out.outputs
    ]
    return JSONResponse(fmt.envelope(choices, fmt.usage(finals)), headers={"X-Request-Id": req.request_id})


async def _tokenized(state: ServerState, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
    """Each prompt as (its text, or None for token ids; its token ids), tokenized off the
    event loop. A truncated prompt (truncate_prompt_tokens) keeps no text: echo decodes what ran.
    With a suffix, each text is the code before a gap, in the model's FIM prompt, which a
    truncation trims around the gap (the prefix's start, the suffix's end), its FIM tokens kept."""
    texts = [p for p in req.prompts if isinstance(p, str)]
    if req.suffix is not None:
        fim, suffix, budget = state.fim_prompt, req.suffix, req.truncation.keep if req.truncation else None
        return list(zip(texts, await state.off_loop(lambda: [fim(t, suffix, budget=budget)[0] for t in texts])))
    prompts = list(zip(texts, await state.encode(texts))) if texts else [(None, ids) for ids in req.prompts]
    if req.truncation is None:
        return prompts
    cut = [(text, req.truncation.apply(ids)) for text, ids in prompts]
    return [(text if len(ids) == len(full) else None, ids) for (text, ids), (_, full) in zip(cut, prompts)]


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

    def __init__(self, state: ServerState, req: CompletionRequest, prompts: list[tuple[str | None, list[int]]]) -> None:
        self.state, self.rid, self.n, self.echo, self.prompts = state, req.request_id, req.params.n, req.echo, prompts
        self.out: OutputOptions = req.output
        self.created = int(time.time())
        self.model = req.model  # the served name, or the LoRA adapter the request named
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
