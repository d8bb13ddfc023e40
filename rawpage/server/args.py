"""Flags of `rawpage serve` that are about HTTP rather than the engine, and ServerConfig,
the one place their defaults live. Each limit here is documented in the README."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field

from rawpage.engine_args import parse_bytes
from rawpage.flags import add_flag, add_flags, flag, given_flags
from rawpage.server.tool_parsers import TOOL_PARSERS


def _list(text: str) -> list[str]:
    """'a, b' or vLLM's JSON form '["a", "b"]'."""
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r} ({e})") from None
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise argparse.ArgumentTypeError(f"not a JSON list of strings: {text!r}")
        return items
    return [x.strip() for x in text.split(",") if x.strip()]


@dataclass
class ServerConfig:
    """Each `flag(...)` field is also a `rawpage serve` flag (rawpage/flags.py)."""

    host: str = flag("127.0.0.1", "address to bind; 0.0.0.0 exposes the server to the network")
    port: int = flag(8000, "port to listen on")
    uds: str | None = flag(None, "listen on this unix domain socket instead of --host and --port")
    root_path: str = flag("", "the path prefix a proxy serves this server under (ASGI root_path), e.g. /llm")
    served_model_name: str | None = None  # an engine flag (EngineArgs)
    model_aliases: list[str] = field(default_factory=list)  # --served-model-name's names after the first
    api_keys: list[str] = field(default_factory=list)  # any one of them opens every route but /health (--api-key)
    admin_api_key: str | None = None  # sees every tenant in the engine view and /metrics (--admin-api-key)
    metrics_public: bool = flag(False, "serve /metrics without the API key")
    max_request_bytes: int = flag(
        4 << 20, "reject request bodies larger than this, e.g. 8MiB", type=parse_bytes, default_text="4MiB"
    )
    trust_request_chat_template: bool = flag(
        False, "accept a 'chat_template' in requests (it is Jinja code, run in a sandbox with limits)"
    )
    enable_prompt_tokens_details: bool = flag(
        False,
        "report usage.prompt_tokens_details.cached_tokens (it tells "
        "a client which prefixes other requests cached; see SECURITY.md)",
    )
    allowed_origins: list[str] = flag(
        help="CORS: origins allowed, comma-separated or a JSON list, e.g. https://app.example or '*'",
        type=_list,
        factory=list,
        default_text="CORS off",
    )
    allowed_hosts: list[str] = flag(
        help="Host names served besides 127.0.0.1, localhost, [::1] and --host, comma-separated, or '*' for any; "
        "other Host headers get a 421 (DNS rebinding; see SECURITY.md)",
        type=_list,
        factory=list,
        default_text="none; any Host with --host 0.0.0.0",
    )
    allowed_methods: list[str] = flag(
        help="CORS: allowed methods", type=_list, factory=lambda: ["*"], default_text="all"
    )
    allowed_headers: list[str] = flag(
        help="CORS: allowed headers", type=_list, factory=lambda: ["*"], default_text="all"
    )
    allow_credentials: bool = flag(False, "CORS: let the allowed origins send credentials (cookies, Authorization)")
    ssl_keyfile: str | None = flag(None, "serve https: the TLS private key file (PEM), with --ssl-certfile")
    ssl_certfile: str | None = flag(None, "serve https: the TLS certificate file (PEM), with --ssl-keyfile")
    ssl_ca_certs: str | None = flag(None, "CA certificates that client certificates are checked against (PEM)")
    ssl_cert_reqs: int = flag(
        0, "client certificates: 0 = not asked for, 1 = checked if sent, 2 = required (Python's ssl.CERT_*)"
    )
    responses_store_max_items: int = flag(
        1000, "most responses /v1/responses keeps for previous_response_id (least recently used go first; in memory)"
    )
    responses_store_max_bytes: int = flag(
        64 << 20,
        "most bytes of JSON /v1/responses keeps for previous_response_id, e.g. 256MiB (in memory: a restart empties it)",
        type=parse_bytes,
        default_text="64MiB",
    )
    responses_store_max_items_per_key: int | None = flag(
        None,
        "most stored responses one API key may hold; beyond, its own least recently used go (never another key's)",
        default_text="max-items ÷ API keys",
    )
    responses_store_max_bytes_per_key: int | None = flag(
        None,
        "most bytes of stored responses one API key may hold, e.g. 8MiB",
        type=parse_bytes,
        default_text="max-bytes ÷ API keys",
    )
    max_prompts_per_request: int = flag(128, "most prompts in one /v1/completions request")
    max_stop_strings: int = flag(16, "most stop strings per request (OpenAI allows 4)")
    max_stop_string_chars: int = flag(256, "longest stop string, in characters")
    max_tokens_default: int | None = flag(
        None, "max_tokens for requests that give none", default_text="chat: the rest of the context; completions: 16"
    )
    max_waiting_requests: int | None = flag(
        None, "requests allowed to wait for a slot; beyond it, 429 with Retry-After", default_text="no limit"
    )
    request_timeout: float | None = flag(
        None, "seconds a request may run before it is aborted with finish_reason 'abort'", default_text="none"
    )
    request_header_timeout: float = flag(
        10.0, "seconds a client has to send a whole request head; then its connection is closed (slowloris)"
    )
    request_body_timeout: float = flag(
        30.0,
        "seconds a client has to send a whole request body after its head; then a 408 and the connection closed",
    )
    timeout_keep_alive: float = flag(5.0, "seconds an idle keep-alive connection is kept open between requests")
    h11_max_incomplete_event_size: int = flag(
        16 << 10,
        "largest request head (request line and headers) accepted, e.g. 64KiB",
        type=parse_bytes,
        default_text="16KiB",
    )
    max_unread_tokens: int = flag(8192, "abort a stream whose client has left this many tokens unread")
    shutdown_timeout: float = flag(
        10.0,
        "on SIGTERM or Ctrl-C, seconds to let running streams finish before they are ended with finish_reason 'abort'",
    )
    max_event_streams_per_key: int = flag(4, "open /v1/engine/events streams one API key may hold; beyond, 429")
    allow_runtime_lora_updating: bool = flag(
        False,
        "serve /v1/load_lora_adapter and /v1/unload_lora_adapter; loads read only inside --lora-dir, which this "
        "needs (vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING=True without --lora-dir: any folder, as in vLLM)",
    )
    admin_only_lora_updating: bool = flag(
        False,
        "only the --admin-api-key may load and unload LoRA adapters at run time; what it loads, every key may use",
    )
    runtime_lora_anywhere: bool = False  # $VLLM_ALLOW_RUNTIME_LORA_UPDATING without --lora-dir: vLLM's way
    lora_dir: str | None = flag(
        None,
        "the folder runtime LoRA loads may read: a lora_path must resolve (links followed) inside it; "
        "a relative one is taken from it",
        default_text="none",
    )
    disable_log_requests: bool = flag(False, "no log line per request")
    disable_uvicorn_access_log: bool = flag(False, "no uvicorn access-log line per HTTP request")
    preprocess_threads: int = 2  # chat templates and tokenization run here, off the event loop
    max_tokenizer_queue_per_key: int = flag(
        256,
        "requests one API key (or, without keys, one client address) may have waiting for the chat template "
        "and tokenizer threads, which serve the keys in turn; beyond, 429",
    )
    web: bool = flag(True, "serve the built-in web page at / (chat playground and live KV-cache view)")
    tool_call_parser: str | None = flag(
        None,
        "how tool calls are read from a reply under tool_choice 'auto' (vLLM's names): hermes = "
        "<tool_call>{...}</tool_call> (Qwen2.5/3, ChatML models); llama3_json, llama4_json = Llama JSON; mistral = "
        "[TOOL_CALLS]; deepseek_v3; qwen3_coder = <function=...> XML; pythonic, llama4_pythonic = [f(a=1)] "
        "(without it, read off the chat template where that is unambiguous)",
        choices=list(TOOL_PARSERS),
        default_text="none",
    )
    tool_call_grammar: bool = flag(
        True,
        "under tool_choice 'auto', a grammar that starts at the parser's call tag holds each call to a declared "
        "tool with arguments valid for its schema (free text stays free); --no-tool-call-grammar: parse only",
    )
    enable_auto_tool_choice: bool = flag(
        False,
        "accept tool_choice 'auto' and parse calls with --tool-call-parser (without either flag, 'auto' works "
        "when the chat template's tool format is known, e.g. rawpage's ChatML tools template; otherwise a 400)",
    )
    return_tokens_as_token_ids: bool = flag(
        False, "name tokens in logprobs 'token_id:N' (a request's return_tokens_as_token_ids overrides it)"
    )
    enable_server_load_tracking: bool = flag(False, "count requests in flight, for GET /load")
    enable_tokenizer_info_endpoint: bool = flag(
        False, "serve GET /tokenizer_info (it shows the chat template and special tokens)"
    )
    server_dev_mode: bool = flag(
        False, "serve vLLM's development route POST /reset_prefix_cache (also $VLLM_SERVER_DEV_MODE=1), for benchmarks"
    )
    reasoning_parser: str | None = flag(
        None,
        "split <think>...</think> into message.reasoning_content; grammars start after it",
        choices=["qwen3", "deepseek_r1"],
        default_text="none",
    )
    enable_force_include_usage: bool = flag(
        False,
        "every stream carries usage on each chunk and ends with a usage chunk, as if stream_options asked for "
        "include_usage and continuous_usage_stats (vLLM's)",
    )
    reasoning_budget: int = flag(
        -1,
        "tokens a model may think (inside <think>...</think>) before the end tag is forced, for requests that set "
        "no budget or effort: -1 unlimited, 0 no thinking (llama-server's flag)",
    )
    reasoning_secret: str | None = flag(
        None,
        "the key that signs reasoning handed back to clients (Responses encrypted_content, Messages thinking "
        "signatures); replicas behind one address must share it; prefer $RAWPAGE_REASONING_SECRET (argv is visible)",
        default_text="$RAWPAGE_REASONING_SECRET or random per start",
    )
    log_level: str = flag("info", "log level", choices=["debug", "info", "warning", "error"])
    uvicorn_log_level: str | None = flag(
        None,
        "uvicorn's log level",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        default_text="--log-level",
    )

    def store_quota(self) -> tuple[int, int]:
        """Each key's share of the response store: the flags, else an equal share of the
        whole for each key the server knows (the admin's included), so that the shares
        add up to no more than the whole."""
        keys = max(1, len(set(self.api_keys)) + bool(self.admin_api_key))
        items = self.responses_store_max_items_per_key
        nbytes = self.responses_store_max_bytes_per_key
        return (
            self.responses_store_max_items // keys if items is None else items,
            self.responses_store_max_bytes // keys if nbytes is None else nbytes,
        )

    def __post_init__(self) -> None:
        if self.allow_runtime_lora_updating and not self.lora_dir and not self.runtime_lora_anywhere:
            raise ValueError(
                "--allow-runtime-lora-updating needs --lora-dir, the folder that runtime loads may read adapters "
                "from (vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING=True alone lets loads read any folder the server "
                "can: see SECURITY.md)"
            )
        if self.admin_only_lora_updating and not self.admin_api_key:
            raise ValueError("--admin-only-lora-updating needs --admin-api-key (or $RAWPAGE_ADMIN_API_KEY)")
        if bool(self.ssl_keyfile) != bool(self.ssl_certfile):
            raise ValueError("https needs both --ssl-keyfile and --ssl-certfile")
        if self.reasoning_budget < -1:
            raise ValueError(f"--reasoning-budget {self.reasoning_budget}: -1 (unlimited), 0 or a number of tokens")
        if self.max_tokenizer_queue_per_key < 1 or self.request_body_timeout <= 0:
            raise ValueError("--max-tokenizer-queue-per-key must be at least 1, --request-body-timeout above 0")
        if self.ssl_cert_reqs not in (0, 1, 2):
            raise ValueError(f"--ssl-cert-reqs {self.ssl_cert_reqs}: 0, 1 or 2")

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerConfig:
        given = given_flags(cls, args)
        keys = [k for arg in (getattr(args, "api_key", None) or []) for k in arg.split(",") if k]
        # vLLM's VLLM_API_KEY too: an operator moving from vLLM must not end up unprotected.
        env_key = os.environ.get("RAWPAGE_API_KEY") or os.environ.get("VLLM_API_KEY")
        given["api_keys"] = keys + ([env_key] if env_key and not keys else [])
        for env, name in VLLM_SWITCHES.items():
            if os.environ.get(env, "").strip().lower() in ("1", "true"):
                given.setdefault(name, True)
        given["reasoning_secret"] = getattr(args, "reasoning_secret", None) or os.environ.get(
            "RAWPAGE_REASONING_SECRET"
        )
        if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower() in ("1", "true"):
            # vLLM's own switch with no --lora-dir: loads read any folder, as vLLM's do (SECURITY.md)
            given["runtime_lora_anywhere"] = not given.get("lora_dir")
        given["admin_api_key"] = getattr(args, "admin_api_key", None) or os.environ.get("RAWPAGE_ADMIN_API_KEY") or None
        return cls(**given)


# vLLM's environment switches for server flags: set to 1 or true, each turns its flag on.
VLLM_SWITCHES = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "allow_runtime_lora_updating",
    "VLLM_SERVER_DEV_MODE": "server_dev_mode",
}

# The flags most people need, first in --help (with --model: see cli.py).
FIRST_FLAGS = ("host", "port")


def add_server_args(parser: argparse.ArgumentParser, first: argparse._ArgumentGroup | None = None) -> None:
    """The server's flags; --host, --port and --api-key go in `first` (a group listed before the rest)."""
    first = first or parser.add_argument_group("server")
    for name in FIRST_FLAGS:
        add_flag(first, ServerConfig, name)
    _add_api_key(first)
    add_flags(parser.add_argument_group("server"), ServerConfig, skip=FIRST_FLAGS)


def _add_api_key(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--api-key",
        action="append",
        help="require 'Authorization: Bearer <key>' on every route but /health and the web page's static files "
        "(the page asks for the key); repeat the flag "
        "(or separate with commas) for several keys (default: $RAWPAGE_API_KEY, else $VLLM_API_KEY, if set)",
    )
    g.add_argument(
        "--admin-api-key",
        help="a key that also sees every tenant's requests in /v1/engine/events and is the only one "
        "that opens /metrics; other keys see only their own requests (default: $RAWPAGE_ADMIN_API_KEY if set)",
    )
