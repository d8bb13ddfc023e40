"""Flags of `rawpage serve` that are about HTTP rather than the engine, and ServerConfig,
the one place their defaults live. Each limit here is documented in the README."""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field


@dataclass
class ServerConfig:
    served_model_name: str | None = None
    api_keys: list[str] = field(default_factory=list)  # any one of them opens every route but /health
    metrics_public: bool = False  # /metrics without a key, for a scraper
    max_request_bytes: int = 4 << 20
    trust_request_chat_template: bool = False  # let requests bring their own Jinja template
    enable_prompt_tokens_details: bool = False  # report usage.prompt_tokens_details.cached_tokens
    allowed_origins: list[str] = field(default_factory=list)  # CORS is off unless this is set
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    max_prompts_per_request: int = 128  # entries of a /v1/completions 'prompt' list
    max_stop_strings: int = 16  # OpenAI allows 4
    max_stop_string_chars: int = 256
    max_tokens_default: int | None = None  # when a request names none; None: chat = the rest, completions = 16
    max_waiting_requests: int | None = None  # beyond it, 429 with Retry-After
    request_timeout: float | None = None  # seconds; a request running longer is aborted
    max_unread_tokens: int = 8192  # a stream whose client reads nothing for this many tokens is aborted
    preprocess_threads: int = 2  # chat templates and tokenization run here, off the event loop
    tool_call_parser: str | None = None  # hermes | llama3_json: reads calls out of tool_choice "auto" replies
    enable_auto_tool_choice: bool = False  # allow tool_choice "auto" (the OpenAI default when tools are given)
    reasoning_parser: str | None = None  # qwen3 | deepseek_r1: <think>…</think> -> reasoning_content

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in vars(args).items() if k in names and v is not None}
        keys = [k for arg in (getattr(args, "api_key", None) or []) for k in arg.split(",") if k]
        env_key = os.environ.get("RAWPAGE_API_KEY")
        given["api_keys"] = keys + ([env_key] if env_key and not keys else [])
        return cls(**given)


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_server_args(parser: argparse.ArgumentParser) -> None:
    d = ServerConfig()
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes the server to the network")
    g.add_argument("--port", type=int, default=8000, help="port to listen on")
    g.add_argument("--api-key", action="append",
                   help="require 'Authorization: Bearer <key>' on every route but /health; repeat the flag "
                        "(or separate with commas) for several keys; default: $RAWPAGE_API_KEY if set")  # fmt: skip
    g.add_argument("--metrics-public", action="store_true", help="serve /metrics without the API key")
    g.add_argument("--max-request-bytes", type=int, default=d.max_request_bytes,
                   help="reject request bodies larger than this")  # fmt: skip
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a 'chat_template' in requests (it is Jinja code, run in a sandbox with limits)")  # fmt: skip
    g.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="report usage.prompt_tokens_details.cached_tokens (it tells a client which prefixes "
                        "other requests cached; see SECURITY.md)")  # fmt: skip
    g.add_argument("--allowed-origins", type=_list,
                   help="CORS: comma-separated origins allowed, e.g. https://app.example or '*' (default: CORS off)")  # fmt: skip
    g.add_argument("--allowed-methods", type=_list, help="CORS: allowed methods (default: all)")
    g.add_argument("--allowed-headers", type=_list, help="CORS: allowed headers (default: all)")
    g.add_argument("--max-prompts-per-request", type=int, default=d.max_prompts_per_request,
                   help="most prompts in one /v1/completions request")  # fmt: skip
    g.add_argument("--max-stop-strings", type=int, default=d.max_stop_strings, help="most stop strings per request")
    g.add_argument("--max-stop-string-chars", type=int, default=d.max_stop_string_chars,
                   help="longest stop string, in characters")  # fmt: skip
    g.add_argument("--max-tokens-default", type=int,
                   help="max_tokens for requests that give none (default: chat: the rest of the context; "
                        "completions: 16)")  # fmt: skip
    g.add_argument("--max-waiting-requests", type=int,
                   help="requests allowed to wait for a slot; beyond it, 429 with Retry-After (default: no limit)")  # fmt: skip
    g.add_argument("--request-timeout", type=float,
                   help="seconds a request may run before it is aborted with finish_reason 'abort' (default: none)")  # fmt: skip
    g.add_argument("--max-unread-tokens", type=int, default=d.max_unread_tokens,
                   help="abort a stream whose client has left this many tokens unread")  # fmt: skip
    g.add_argument("--tool-call-parser", choices=["hermes", "llama3_json"],
                   help="how tool calls are read from a reply under tool_choice 'auto': hermes = "
                        "<tool_call>{...}</tool_call> (Qwen2.5/3, ChatML models); llama3_json = Llama 3.x JSON")  # fmt: skip
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accept tool_choice 'auto' and parse calls with --tool-call-parser (without it, 'auto' is a 400)")  # fmt: skip
    g.add_argument("--reasoning-parser", choices=["qwen3", "deepseek_r1"],
                   help="split <think>...</think> into message.reasoning_content; grammars start after it")  # fmt: skip
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
