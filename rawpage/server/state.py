"""ServerState: what every handler needs — the engine, the model's name, the limits — and
the work a handler must not do on the event loop (templates, tokenization)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from rawpage.multimodal.chat_images import load_images, take_images
from rawpage.multimodal.image_input import ImageError, ImageInput
from rawpage.request_checks import CheckedPrompt
from rawpage.sampling_params import SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.server.async_engine import AsyncEngine
from rawpage.server.engine_info import EngineInfo
from rawpage.server.fair_executor import FairExecutor, QueueFull
from rawpage.server.metrics import ServerMetrics
from rawpage.server.protocol import APIError, Body
from rawpage.server.reasoning_seal import ReasoningSeal
from rawpage.server.request_body import INLINE_BYTES, decode, read_bytes
from rawpage.server.response_store import ResponseStore
from rawpage.server.tools import template_for_tools
from rawpage.text.chat_template import ChatTemplate, ChatTemplateError
from rawpage.text.fim import fim_prompt

T = TypeVar("T")
INLINE_PROMPT_IDS = 4096  # longer prompts (with their id lists) are checked (a pass over every id) off the event loop

# Whose preprocessing the running request's is, for its turn on the threads
# (fair_executor.py): its API key, or its client's address. Set by app.py's endpoint wrapper.
_queue_key: ContextVar[str | None] = ContextVar("rawpage_queue_key", default=None)


def key_id(key: str) -> str:
    """A short name for an API key that does not reveal it: what tenants are told apart by."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Caller:
    key_id: str | None  # key_id() of the key that opened the request; None on a server without keys
    admin: bool  # sees every tenant: the --admin-api-key, or anyone on a server without keys


@dataclass(frozen=True)
class RenderOptions:
    """How messages become a prompt. Chat takes these from vLLM's request fields
    (request.render_options); the Responses and Messages APIs use the defaults."""

    chat_template: str | None = None  # a request's own template text (--trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # leave the last message open: the model continues it
    add_special_tokens: bool = False  # the template already writes BOS and the like
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)  # over --mm-processor-kwargs, for its images


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    config: ServerConfig = field(default_factory=ServerConfig)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        # Decoding a large body, rendering a template or tokenizing 4 MB takes CPU time; on
        # the event loop it would stall every other client (and /health), so it runs here,
        # each caller in turn.
        c = self.config
        self._preprocess = FairExecutor(c.preprocess_threads, c.max_tokenizer_queue_per_key, "rawpage-preprocess")
        self.responses = ResponseStore(c.responses_store_max_items, c.responses_store_max_bytes, *c.store_quota())
        self.seal = ReasoningSeal(self.config.reasoning_secret)  # signs reasoning handed to clients

    @property
    def info(self) -> EngineInfo:
        """What handlers know of the loaded engine, or a 503 while it loads (or after it died)."""
        if self.engine.error is not None:
            raise APIError("the engine is not running; see the server log", 503, type="service_unavailable")
        if self.engine.info is None:
            raise APIError("the model is still loading; retry shortly", 503, type="service_unavailable")
        return self.engine.info

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the preprocessing threads, in the turn of the request's caller; a 429
        if the caller already has --max-tokenizer-queue-per-key jobs waiting there."""
        try:
            future = self._preprocess.submit(_queue_key.get(), fn, *args)
        except QueueFull:
            limit = self.config.max_tokenizer_queue_per_key
            raise APIError(
                f"this API key (or client address) has {limit} requests waiting for the tokenizer already "
                f"(--max-tokenizer-queue-per-key {limit}); retry when one has finished",
                429,
                type="rate_limit_error",
                headers={"Retry-After": "1"},
            ) from None
        return await asyncio.wrap_future(future)

    def queue_as(self, request: Request) -> None:
        """File this request's preprocessing under its caller: the key check_auth found, or
        the client's address (a server without keys, or a route without auth)."""
        client = request.client.host if request.client else None
        _queue_key.set(self.caller(request).key_id or client)

    def close(self) -> None:
        self._preprocess.shutdown()

    # --- access -------------------------------------------------------------------------
    def check_auth(self, request: Request, x_api_key: bool = False) -> Caller:
        """Who is calling, from 'Authorization: Bearer <key>' (or, where `x_api_key`, as
        Anthropic's clients send it, 'x-api-key: <key>'); a 401 if no key matches. It is
        kept on the request (request.state.caller) for the routes that show tenants apart."""
        keys = self.config.api_keys + ([self.config.admin_api_key] if self.config.admin_api_key else [])
        if not keys:
            caller = Caller(None, admin=True)  # no keys: a single user, who sees everything
        else:
            header = request.headers.get("authorization", "")
            given = (header[7:] if header.lower().startswith("bearer ") else "").encode()
            if not given and x_api_key:
                given = request.headers.get("x-api-key", "").encode()
            # Compare against every key, always, in constant time: no timing hint of which one nearly matched.
            ok = [hmac.compare_digest(given, k.encode()) for k in keys]
            if not any(ok):
                raise APIError("missing or invalid API key", 401, type="authentication_error", code="invalid_api_key")
            caller = Caller(key_id(given.decode()), admin=bool(self.config.admin_api_key) and ok[-1])
        request.state.caller = caller
        return caller

    @staticmethod
    def caller(request: Request) -> Caller:
        """The caller check_auth found (routes without auth: a keyless caller who sees nothing private)."""
        return getattr(request.state, "caller", Caller(None, admin=False))

    def owner(self, request: Request) -> str | None:
        return self.caller(request).key_id

    async def read_body(self, request: Request) -> Body:
        """The body as JSON, for a parse function (request.py) to read: the only read of it
        (request_body.py). Kept on the request, so that /invocations can look at it before
        its handler parses it."""
        data = getattr(request.state, "rawpage_body", None)
        if data is None:
            raw = await read_bytes(request, self.config.max_request_bytes, self.config.request_body_timeout)
            data = decode(raw) if len(raw) <= INLINE_BYTES else await self.off_loop(decode, raw)
            request.state.rawpage_body, request.state.rawpage_body_bytes = data, len(raw)
        return Body(data)

    async def parse(self, request: Request, parse: Callable[..., T], *args: Any) -> T:
        """The body parsed into its typed request, parse(body, self, *args): on the event
        loop for a small body, in the caller's turn on the preprocessing threads for a large
        one (a list of two million token ids takes a while to check)."""
        body = await self.read_body(request)
        if request.state.rawpage_body_bytes <= INLINE_BYTES:
            return parse(body, self, *args)
        return await self.off_loop(parse, body, self, *args)

    def request_id(self, request: Request, prefix: str) -> str:
        given = request.headers.get("x-request-id")
        return given if given and len(given) <= 128 and given.isprintable() else f"{prefix}-{uuid.uuid4().hex}"

    # --- preprocessing (off the event loop) ---------------------------------------------------
    async def encode(self, texts: list[str], add_special_tokens: bool = True, param: str = "prompt") -> list[list[int]]:
        tok = self.info.tokenizer
        for t in texts:
            self.check_text_length(t, param)
        return await self.off_loop(lambda: [tok.encode(t, add_special_tokens=add_special_tokens) for t in texts])

    def check_text_length(self, text: str, param: str) -> None:
        """A 400 before tokenizing a text that cannot fit in --max-model-len tokens: one with
        more characters than max_model_len tokens of the longest token's length can hold.
        (Tokenizing 4 MB of digits costs seconds of CPU only to be refused for length.)"""
        info = self.info
        if len(text) > info.max_prompt_chars:
            raise APIError(
                f"This model's maximum context length is {info.max_model_len} tokens. However, your request has "
                f"{len(text)} characters of input, more than {info.max_model_len} tokens can hold (the "
                f"tokenizer's longest token is {info.longest_token_chars} characters). Please reduce the length "
                "of the input, or raise --max-model-len.",
                param=param,
            )

    def fim_prompt(self, prefix: str, suffix: str, **kwargs: Any) -> tuple[list[int], bool]:
        """(token ids, truncated): the model's FIM prompt for a gap (text/fim.py's fim_prompt
        and its keywords), led by BOS where the model's tokenizer adds one. Blocking: call it off the loop."""
        tok, most = self.info.tokenizer, self.info.max_prompt_chars
        if kwargs.get("budget") is None:  # all of it must fit
            self.check_text_length(prefix + suffix, "prompt")
        else:  # truncated, each side keeps no more than fits: the rest need not be tokenized
            prefix, suffix = prefix[-most:], suffix[:most]
        bos = tok.bos_token_id if tok.encode("", add_special_tokens=True)[:1] == [tok.bos_token_id] else None
        encode = functools.partial(tok.encode, add_special_tokens=False)
        return fim_prompt(tok.fim, encode, prefix, suffix, bos=bos, **kwargs)

    async def render_chat_images(
        self,
        render: RenderOptions,
        messages: list[dict[str, Any]],
        param: str = "messages",
        tools: list[dict[str, Any]] | None = None,
    ) -> tuple[list[int], tuple[ImageInput, ...]]:
        """Messages (and tools) -> chat template -> token ids, and the messages' images decoded
        and preprocessed (their placeholders expanded into their soft tokens in the ids), all
        off the event loop."""
        info = self.info
        if render.mm_processor_kwargs:  # checked with no image too: kwargs that changed nothing would look applied
            try:
                info.images.inputs([], render.mm_processor_kwargs)
            except ImageError as e:
                raise APIError(str(e), param="mm_processor_kwargs") from None

        def work() -> tuple[list[int], tuple[ImageInput, ...]]:
            chosen = ChatTemplate(render.chat_template) if render.chat_template is not None else info.chat_template
            extra = {}
            if tools:  # a template that ignores the tools would drop them silently
                chosen, extra = template_for_tools(chosen or info.tokenizer.chat_template), {"tools": tools}
            kwargs = {**render.chat_template_kwargs, **extra}
            msgs, sources = take_images(messages)
            images = (
                info.images.inputs(load_images(sources, info.images), render.mm_processor_kwargs) if sources else []
            )
            text = info.tokenizer.apply_chat_template(
                msgs, render.add_generation_prompt, chat_template=chosen, **kwargs
            )
            text = open_final_message(text, messages[-1]) if render.continue_final_message else text
            self.check_text_length(text, param)
            text = info.images.expand_text(text, images)
            return info.tokenizer.encode(text, add_special_tokens=render.add_special_tokens), tuple(images)

        try:
            return await self.off_loop(work)
        except (ChatTemplateError, ValueError, TypeError) as e:
            raise APIError(str(e), param="chat_template" if render.chat_template is not None else param) from None

    async def check_prompt(
        self,
        ids: list[int],
        params: SamplingParams,
        param: str,
        priority: int = 0,
        cache_salt: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> CheckedPrompt:
        """The engine's one check of a request (EngineInfo.check_prompt), its grammar's compile
        awaited: a bad grammar, then a prompt that does not fit (blamed on `param`), is a 400
        before anything streams. The grammar is gated, validated in a child process and built
        on the compiler's own threads (rawpage/structured_output/grammar_compiler.py), never
        on the event loop nor on the template and tokenization threads.
        AsyncEngine.generate queues the CheckedPrompt, which the engine does not check again."""
        check = self.info.check_prompt
        lists = (params.stop_token_ids, params.logit_bias, params.allowed_token_ids)  # each id checked too
        if len(ids) + sum(len(x or ()) for x in lists) <= INLINE_PROMPT_IDS:
            checked = check(ids, params, priority, cache_salt, images)
        else:
            checked = await self.off_loop(check, ids, params, priority, cache_salt, images)
        if checked.grammar is not None:
            try:
                await asyncio.wrap_future(checked.grammar)
            except ValueError as e:
                raise APIError(str(e), param=getattr(e, "param", None)) from None
        e = checked.refusal
        if e is not None:
            raise APIError(str(e), param=param if e.param == "prompt" else e.param)
        return checked

    def token_text(self, token_id: int) -> str:
        return self.info.tokenizer.decode([token_id], skip_special_tokens=False)


def open_final_message(text: str, last: dict[str, Any]) -> str:
    """vLLM's continue_final_message (as transformers does it): cut the rendered prompt right
    after the last message's content, so the template's end-of-turn is gone and the model
    continues that message."""
    content = last.get("content") or ""
    if isinstance(content, list):  # with images: the text after them
        content = content[-1].get("text", "") if content else ""
    content = content.strip()
    at = text.rfind(content) if content else -1
    if at < 0:
        raise APIError(
            "continue_final_message: the last message's content does not appear in the rendered prompt",
            param="continue_final_message",
        )
    return text[: at + len(content)]
