"""POST /infill: llama-server's fill-in-the-middle endpoint, in its response shape.

    {"input_prefix": "def add(a, b):\\n", "input_suffix": "\\n\\nprint(add(1, 2))\\n",
     "input_extra": [{"filename": "util.py", "text": "..."}], "prompt": "    return",
     "n_predict": 64, "n_indent": 4, "t_max_predict_ms": 500, "stream": false}
    -> {"content": " a + b", "stop": true, "stop_type": "eos", "tokens_predicted": 4,
        "tokens_evaluated": 31, "truncated": false, "timings": {...}, ...}

Streamed, each piece is `data: {"content": ..., "stop": false, ...}` and the last one
the full object above with "content": "" (llama-server's non-OpenAI stream; no [DONE]).
The editors' two stops are llama-server's: n_indent ends the middle at a later line
indented less than that, t_max_predict_ms at a line end once generating took that long.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rawpage.outputs import RequestOutput
from rawpage.server.infill_input import parse_infill
from rawpage.server.request import InfillRequest
from rawpage.server.state import ServerState
from rawpage.server.streaming import sse, sse_response, unless_disconnected


async def create_infill(request: Request, state: ServerState) -> Response:
    req = await state.parse(request, parse_infill, state.request_id(request, "infill"))
    limit = state.info.max_model_len
    budget = limit - (req.params.max_tokens or limit // 4)  # the prompt's room: llama-server trims to fit

    def build() -> tuple[list[int], bool, str]:
        ids, truncated = state.fim_prompt(
            req.prefix, req.suffix, prompt=req.prompt, extra=req.extra, budget=budget, repo_level=True
        )
        return ids, truncated, state.info.tokenizer.decode(ids, skip_special_tokens=False)

    ids, truncated, prompt_text = await state.off_loop(build)
    checked = await state.check_prompt(ids, req.params, "input_prefix")
    state.engine.check_capacity(1)
    stream = state.engine.generate(f"{req.request_id}#0#{uuid.uuid4().hex[:8]}", checked, None, state.owner(request))
    middle = _Middle(state, req, len(ids), truncated, prompt_text)
    if req.stream:
        return sse_response(_events(middle, stream), req.request_id)
    await unless_disconnected(request, _drain(middle.pieces(stream)))
    return JSONResponse(middle.final(streamed=False), headers={"X-Request-Id": req.request_id})


async def _drain(pieces: AsyncIterator[tuple[str, list[int]]]) -> None:
    async with aclosing(pieces) as it:
        async for _ in it:
            pass


async def _events(middle: _Middle, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
    async with aclosing(middle.pieces(stream)) as pieces:
        async for text, tokens in pieces:
            yield sse(middle.partial(text, tokens))
    yield sse(middle.final(streamed=True))


class _Middle:
    """The middle as it arrives, cut where llama-server's editor stops cut it, and the
    objects llama-server answers with."""

    def __init__(
        self, state: ServerState, req: InfillRequest, prompt_tokens: int, truncated: bool, prompt: str = ""
    ) -> None:
        self.state, self.req, self.prompt_tokens, self.truncated = state, req, prompt_tokens, truncated
        self.prompt = prompt  # the FIM prompt as text, special tokens spelled out
        self.text, self.tokens = "", []  # the middle so far, and its token ids
        self.stop_type, self.stopping_word = "none", ""
        self.cached = 0  # prompt tokens the prefix cache served
        self.start = time.monotonic()
        self.first: float | None = None  # when the first token came: the prompt's time ends there
        self.line = 0  # where the first line not yet checked for n_indent starts (after a newline)

    async def pieces(self, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[tuple[str, list[int]]]:
        """(new text, new token ids) per engine output, until the engine finishes or an editor
        stop cuts; leaving early closes the stream, which aborts the request."""
        async with aclosing(stream) as outs:
            async for out in outs:
                o = out.outputs[0]
                self.cached = out.num_cached_tokens
                if self.first is None and o.token_ids:
                    self.first = time.monotonic()
                text, cut = self._add(o.delta_text)
                self.tokens += o.delta_token_ids
                if text or o.delta_token_ids:
                    yield text, list(o.delta_token_ids)
                if cut:
                    self.stop_type = "limit"
                    return
                if o.finish_reason is not None:
                    self._finish(o.finish_reason, o.stop_reason)
                    return

    def _add(self, delta: str) -> tuple[str, bool]:
        """Append delta; (the part of it to send, whether an editor stop ends the middle here)."""
        before = len(self.text)
        self.text += delta
        cut = self._indent_cut()
        if cut is not None:
            self.text = self.text[:cut]
            return self.text[before:], True
        late = self.req.t_max_predict_ms and (time.monotonic() - self.start) * 1000 > self.req.t_max_predict_ms
        return delta, bool(late and "\n" in self.text)

    def _indent_cut(self) -> int | None:
        """n_indent: where a line after the first starts with less indentation (its first
        other character; the indentation itself stays), or None."""
        if not self.req.n_indent:
            return None
        while (nl := self.text.find("\n", self.line)) != -1:
            pos = start = nl + 1
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos == len(self.text):  # the indentation is not known yet
                return None
            if pos - start < self.req.n_indent:
                return pos
            self.line = start
        return None

    def _finish(self, reason: str, stop_reason: int | str | None) -> None:
        if reason == "length":
            self.stop_type = "limit"
        elif reason == "stop":
            self.stop_type = "word" if isinstance(stop_reason, str) else "eos"
            self.stopping_word = stop_reason if isinstance(stop_reason, str) else ""

    def partial(self, text: str, tokens: list[int]) -> dict[str, Any]:
        return {
            "index": 0,
            "content": text,
            "tokens": tokens if self.req.return_tokens else [],
            "stop": False,
            "id_slot": 0,
            "tokens_predicted": len(self.tokens),
            "tokens_evaluated": self.prompt_tokens,
        }

    def final(self, streamed: bool) -> dict[str, Any]:
        p = self.req.params
        obj = {
            "index": 0,
            "content": "" if streamed else self.text,
            "tokens": [] if streamed or not self.req.return_tokens else self.tokens,
            "id_slot": 0,
            "stop": True,
            "model": self.state.model_name,
            "tokens_predicted": len(self.tokens),
            "tokens_evaluated": self.prompt_tokens,
            "generation_settings": {
                "n_predict": p.max_tokens or -1,
                "temperature": p.temperature,
                "top_k": p.top_k,
                "top_p": p.top_p,
                "min_p": p.min_p,
                "repeat_penalty": p.repetition_penalty,
                "seed": p.seed if p.seed is not None else -1,
                "stop": p.stop,
                "n_indent": self.req.n_indent,
                "t_max_predict_ms": self.req.t_max_predict_ms,
            },
            "prompt": self.prompt,
            "has_new_line": "\n" in self.text,
            "truncated": self.truncated,
            "stop_type": self.stop_type,
            "stopping_word": self.stopping_word,
            "tokens_cached": self.prompt_tokens + len(self.tokens),
            "timings": self._timings(),
        }
        return _pick(obj, self.req.response_fields)

    def _timings(self) -> dict[str, float]:
        now = time.monotonic()
        first = self.first or now
        prompt_n, predicted_n = self.prompt_tokens - self.cached, len(self.tokens)
        prompt_ms, predicted_ms = (first - self.start) * 1000, (now - first) * 1000
        return {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / max(predicted_n, 1),
            "predicted_per_second": 1000 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0,
        }


def _pick(obj: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """llama-server's response_fields: only these, keyed by their path ("timings/prompt_n")."""
    if not fields:
        return obj
    out = {}
    for path in fields:
        value: Any = obj
        for key in path.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[path] = value
    return out
