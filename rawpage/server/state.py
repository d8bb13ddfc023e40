"""ServerState: what every handler needs — the engine, the model's name, the limits — and
the work a handler must not do on the event loop (templates, tokenization)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from rawpage.multimodal.chat_images import load_images, take_images
from rawpage.multimodal.image_input import ImageInput
from rawpage.request_checks import CheckedPrompt
from rawpage.sampling_params import SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.server.async_engine import AsyncEngine
from rawpage.server.engine_info import EngineInfo
from rawpage.server.metrics import ServerMetrics
from rawpage.server.protocol import APIError, Body, check_json
from rawpage.server.response_store import ResponseStore
from rawpage.server.tools import template_for_tools
from rawpage.text.chat_template import ChatTemplate, ChatTemplateError

T = TypeVar("T")


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


@dataclass
class ServerState:
    engine: AsyncEngine
    model_name: str
    metrics: ServerMetrics
    config: ServerConfig = field(default_factory=ServerConfig)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        # Rendering a template or tokenizing 4 MB takes CPU time; on the event loop it
        # would stall every other client (and /health), so it runs here.
        self._preprocess = ThreadPoolExecutor(self.config.preprocess_threads, thread_name_prefix="rawpage-preprocess")
        self.responses = ResponseStore(self.config.responses_store_max_items, self.config.responses_store_max_bytes)

    @property
    def info(self) -> EngineInfo:
        """What handlers know of the loaded engine, or a 503 while it loads (or after it died)."""
        if self.engine.error is not None:
            raise APIError("the engine is not running; see the server log", 503, type="service_unavailable")
        if self.engine.info is None:
            raise APIError("the model is still loading; retry shortly", 503, type="service_unavailable")
        return self.engine.info

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._preprocess, fn, *args)

    def close(self) -> None:
        self._preprocess.shutdown(wait=False, cancel_futures=True)

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
        """The body as JSON, for a parse function (request.py) to read: the only read of it.
        Kept on the request, so that /invocations can look at it before its handler parses it."""
        given = getattr(request.state, "rawpage_body", None)
        if given is not None:
            return Body(given)
        limit = self.config.max_request_bytes
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limit:
            raise APIError(f"request body of {size} bytes exceeds the limit of {limit}", 413)
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise APIError(f"request body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise APIError("the request body nests too deeply") from None
        check_json(data)
        request.state.rawpage_body = data
        return Body(data)

    def request_id(self, request: Request, prefix: str) -> str:
        given = request.headers.get("x-request-id")
        return given if given and len(given) <= 128 and given.isprintable() else f"{prefix}-{uuid.uuid4().hex}"

    # --- preprocessing (off the event loop) ---------------------------------------------------
    async def encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        tok = self.info.tokenizer
        return await self.off_loop(lambda: [tok.encode(t, add_special_tokens=add_special_tokens) for t in texts])

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

        def work() -> tuple[list[int], tuple[ImageInput, ...]]:
            chosen = ChatTemplate(render.chat_template) if render.chat_template is not None else info.chat_template
            extra = {}
            if tools:  # a template that ignores the tools would drop them silently
                chosen, extra = template_for_tools(chosen or info.tokenizer.chat_template), {"tools": tools}
            kwargs = {**render.chat_template_kwargs, **extra}
            msgs, sources = take_images(messages)
            images = info.images.inputs(load_images(sources, info.images)) if sources else []
            text = info.tokenizer.apply_chat_template(
                msgs, render.add_generation_prompt, chat_template=chosen, **kwargs
            )
            text = open_final_message(text, messages[-1]) if render.continue_final_message else text
            text = info.images.expand_text(text, len(images))
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
        checked = self.info.check_prompt(ids, params, priority, cache_salt, images)
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
