"""The typed requests: each API's body is parsed once, by its parse function, into one
frozen value that its handler reads. No handler reads the body itself.

    /v1/chat/completions        chat_input.parse_chat_completion   ─► ChatCompletionRequest ┐
    /v1/chat/completions/batch  chat_input.parse_batch_chat        ─► BatchChatRequest      │ each holds
    /v1/responses               responses_input.parse_responses    ─► ResponsesRequest      ├ a ChatRequest
    /v1/messages                messages_input.parse_messages_request ─► MessagesRequest    ┘
    /v1/completions             completions_input.parse_completion ─► CompletionRequest
    /infill (llama-server's)    infill_input.parse_infill          ─► InfillRequest
    /tokenize, /detokenize, /v1/embeddings, the LoRA routes: their own small ones, below

Chat, Responses and Messages share the ChatRequest: the chat messages, the SamplingParams
with the output constraint (the grammar), the ReplyParser (tools and reasoning), the render
options, the LoRA adapter, priority and cache_salt; and the readers of the fields they
have in common (the model, the tools, the constraint, the render options, priority and
cache_salt) are here. Each API then adds only what is its own. Checks against the
engine (the prompt's length, token ids, the grammar) come later, once, in
ServerState.check_prompt.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rawpage.lora import LoRAAdapter, LoRARequest
from rawpage.pooling.pooler import PoolingParams
from rawpage.prompt_truncation import TRUNCATION_SIDES, PromptTruncation, resolve
from rawpage.sampling_params import SamplingParams
from rawpage.server.args import ServerConfig
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.protocol import APIError, Body, OutputOptions
from rawpage.server.reasoning import PARSERS as REASONING_PARSERS
from rawpage.server.state import Caller, RenderOptions, ServerState
from rawpage.server.tool_parsers.grammar import SpecialTokens
from rawpage.server.tools import ToolRequest, tool_request_from
from rawpage.structured_output import StructuredOutputsParams

# Fields both OpenAI and vLLM accept that change nothing here (README "Request fields").
NO_EFFECT_FIELDS = frozenset({"user", "safety_identifier"})

# The longest a string the server keeps (the Responses store) or repeats back (a response
# object, an error) may be, in characters: OpenAI's limit where it has one (SECURITY.md
# "What a request may leave behind"). `metadata`'s are OpenAI's too (responses_input.py).
STRING_LIMITS = {
    "user": 256,
    "safety_identifier": 64,  # OpenAI's
    "instructions": 256 << 10,  # a system prompt of ~64k tokens; more would not fit a context anyway
    "metadata.user_id": 256,  # Anthropic's
}


@dataclass(frozen=True)
class ChatRequest:
    """One generation request as the engine side of the server sees it, whichever API sent
    it: what chat_request.submit reads."""

    request_id: str  # the API's id (chatcmpl-..., resp_..., msg_...)
    messages: list[dict[str, Any]]  # OpenAI chat messages, checked (tools.prepare_tool_messages)
    params: SamplingParams  # with the grammar, if any (structured_outputs)
    reply: ReplyParser  # the tools and reasoning parser that read the text back
    render: RenderOptions = field(default_factory=RenderOptions)
    lora: LoRARequest | None = None
    priority: int = 0
    cache_salt: str | None = None
    param: str = "messages"  # the field a prompt error is blamed on ("input" for Responses)
    truncation: PromptTruncation | None = None  # vLLM's truncate_prompt_tokens, applied to the rendered prompt

    @property
    def tools(self) -> ToolRequest | None:
        return self.reply.tools


@dataclass(frozen=True)
class ChatCompletionRequest:
    """POST /v1/chat/completions (vLLM's ChatCompletionRequest): the chat, and how its reply is written."""

    chat: ChatRequest
    output: OutputOptions  # stream, usage, token ids: vLLM's extras
    model: str  # as the reply names it: the served name, or the LoRA adapter's
    role: str = "assistant"  # the reply's role (chat_input.role_and_echo)
    echo: str = ""  # what `echo` puts before the reply


@dataclass(frozen=True)
class BatchChatRequest:
    """POST /v1/chat/completions/batch: one ChatCompletionRequest per conversation, alike but
    for the messages, the role and the echo."""

    conversations: tuple[ChatCompletionRequest, ...]


@dataclass(frozen=True)
class CompletionRequest:
    """POST /v1/completions: prompts (texts to tokenize, or token ids) and one SamplingParams for all."""

    request_id: str
    prompts: tuple[str | list[int], ...]  # at most --max-prompts-per-request
    params: SamplingParams  # with the grammar, if any
    output: OutputOptions
    echo: bool
    model: str  # as the reply names it
    lora: LoRARequest | None = None
    priority: int = 0
    cache_salt: str | None = None
    truncation: PromptTruncation | None = None  # vLLM's truncate_prompt_tokens, applied to each prompt
    suffix: str | None = None  # fill-in-the-middle: each prompt is the code before the gap, this after it


@dataclass(frozen=True)
class InfillRequest:
    """POST /infill (llama-server's): the code around a gap, in the model's FIM prompt."""

    request_id: str
    prefix: str  # input_prefix: before the gap
    suffix: str  # input_suffix: after it
    prompt: str  # continues the prefix (the editor's line up to the cursor)
    extra: tuple[tuple[str, str], ...]  # input_extra: (filename, text) of other files, as context
    params: SamplingParams  # with the FIM stop tokens
    stream: bool
    n_indent: int  # stop at a later line indented less than this (0: off)
    t_max_predict_ms: int  # stop at a line end once generating took this long (0: off)
    response_fields: tuple[str, ...]  # only these fields ("a/b" reaches into objects); (): all
    return_tokens: bool


@dataclass(frozen=True)
class ResponsesRequest:
    """POST /v1/responses: the chat, and what the response object repeats and the store keeps."""

    chat: ChatRequest
    fields: dict[str, Any]  # the request's settings, as the response object echoes them (new_envelope)
    conversation: list[dict[str, Any]]  # chat messages without the instructions: what is stored
    owner: str | None  # the tenant whose store holds it
    model: str
    store: bool
    stream: bool
    raw_messages: bool = False  # vLLM's enable_response_messages: input_messages and output_messages
    encrypted_reasoning: bool = False  # include: ["reasoning.encrypted_content"] (reasoning_seal.py)


@dataclass(frozen=True)
class MessagesRequest:
    """POST /v1/messages (Anthropic's Messages API)."""

    chat: ChatRequest
    model: str  # as the reply names it: the served name, or the LoRA adapter's
    stream: bool
    omit_thinking: bool = False  # thinking.display "omitted": thinking blocks carry only their signature


@dataclass(frozen=True)
class TokenizeRequest:
    """POST /tokenize: a prompt, or messages rendered as chat renders them."""

    prompt: str | None
    messages: list[dict[str, Any]] | None  # given instead of a prompt
    render: RenderOptions
    add_special_tokens: bool  # the prompt's (a template writes its own)
    return_token_strs: bool


@dataclass(frozen=True)
class EmbeddingRequest:
    """POST /v1/embeddings: inputs (texts to tokenize, or token ids) and their pooling."""

    inputs: tuple[str | list[int], ...]
    add_special_tokens: bool  # vLLM's: the texts' (Qwen3-Embedding's closing EOS)
    params: PoolingParams
    encoding_format: str  # float or base64
    priority: int = 0


@dataclass(frozen=True)
class LoRAAdapterRequest:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter (path None)."""

    name: str
    path: str | None = None
    load_inplace: bool = False  # vLLM's: replace the adapter already known by this name


# --- the fields every API reads alike --------------------------------------------------------
def visible_adapters(state: ServerState, caller: Caller) -> dict[str, LoRAAdapter]:
    """The LoRA adapters a caller may see and use: the shared ones (owner None: --lora-modules,
    or loaded by the admin key) and its own; the admin key sees all (lora_routes.py)."""
    lora = state.engine.info.lora if state.engine.info is not None else None
    if lora is None:
        return {}
    return {n: a for n, a in list(lora.adapters.items()) if a.owner is None or caller.admin or a.owner == caller.key_id}


def parse_model(body: Body, state: ServerState, caller: Caller) -> LoRARequest | None:
    """The body's "model": the base model (None), or a LoRA adapter's name (its request).
    Another key's adapter is a 404, as if it did not exist."""
    name = body.str("model")
    adapters = visible_adapters(state, caller)
    adapter = adapters.get(name) if name is not None else None
    if adapter is not None:
        return LoRARequest(adapter.name, adapter.int_id, adapter.path)
    if name is not None and name not in (state.model_name, *state.config.model_aliases):
        raise APIError(
            f"the model '{name[:128]}' does not exist; this server serves '{state.model_name}'"
            + (f" and the LoRA adapters {sorted(adapters)}" if adapters else ""),
            404,
            param="model",
            type="not_found_error",
            code="model_not_found",
        )
    return None


def bounded_str(body: Body, name: str) -> str | None:
    """A string field with its STRING_LIMITS length (keyed by its full path), else a 400 naming it."""
    value, where = body.str(name), body.path + name
    limit = STRING_LIMITS[where]
    if value is not None and len(value) > limit:
        raise APIError(f"'{where}' has {len(value)} characters; the limit is {limit}", param=where)
    return value


def reject_unread(body: Body) -> None:
    """The end of a parse: the no-effect fields checked (a string, within its limit) and
    any other field nobody read refused."""
    for name in NO_EFFECT_FIELDS:
        bounded_str(body, name)
    body.reject_unread()


def served_name(state: ServerState, lora: LoRARequest | None) -> str:
    """The model a reply names: the LoRA adapter the request chose, else the served name."""
    return lora.lora_name if lora else state.model_name


def render_options(body: Body, config: ServerConfig) -> RenderOptions:
    """Chat's template fields (vLLM's). A request's own `chat_template` needs
    --trust-request-chat-template, and is always template text, never a path."""
    template = body.str("chat_template")
    if template is not None and not config.trust_request_chat_template:
        raise APIError(
            "this server does not accept a request 'chat_template'; the operator can allow it "
            "with --trust-request-chat-template",
            param="chat_template",
        )
    return RenderOptions(
        chat_template=template,
        chat_template_kwargs=body.dict("chat_template_kwargs"),
        add_generation_prompt=body.bool("add_generation_prompt", True),
        continue_final_message=body.bool("continue_final_message", False),
        add_special_tokens=body.bool("add_special_tokens", False),
        mm_processor_kwargs=body.dict("mm_processor_kwargs"),
    )


def default_max_tokens(state: ServerState, api_default: int | None) -> int | None:
    """max_tokens for a request that gives none: --max-tokens-default, else the model's
    max_new_tokens (--generation-config), else the API's own default."""
    return state.config.max_tokens_default or state.info.sampling_defaults.get("max_tokens") or api_default


def model_sampling_defaults(state: ServerState) -> dict[str, Any]:
    """The model's sampling defaults (--generation-config) but max_tokens, which
    default_max_tokens places: the SamplingParams keywords an API without those
    fields (Responses, Messages) passes on as they are."""
    return {k: v for k, v in state.info.sampling_defaults.items() if k != "max_tokens"}


def fim_params(state: ServerState, params: SamplingParams, param: str) -> SamplingParams:
    """A fill-in-the-middle request's params: the middle also ends at the model's FIM end
    tokens. A 400 that says so for a model without FIM tokens."""
    fim = state.info.tokenizer.fim
    if fim is None:
        raise APIError(
            f"the model '{state.model_name}' has no fill-in-the-middle tokens (such as <|fim_prefix|>, "
            "<fim_prefix>, <PRE> or <｜fim▁begin｜>), so it cannot fill a gap; serve a code model "
            "trained for it (Qwen2.5-Coder, CodeLlama, StarCoder2, DeepSeek-Coder)",
            param=param,
        )
    return dataclasses.replace(params, stop_token_ids=[*params.stop_token_ids, *fim.stop_token_ids])


def prompt_truncation(
    body: Body, state: ServerState, params: SamplingParams, max_tokens_param: str
) -> PromptTruncation | None:
    """vLLM's truncate_prompt_tokens (keep k tokens; -1: all that fit beside max_tokens) and
    truncation_side ("left", generation's default, keeps the prompt's end). None: no cut."""
    given, side = body.int("truncate_prompt_tokens", None, -1), truncation_side(body, "left")
    if given is None:
        return None
    room = state.info.max_model_len - (params.max_tokens or 0)
    try:
        return resolve(given, side, room, f"max_model_len - {max_tokens_param}")
    except ValueError as e:
        raise APIError(str(e), param="truncate_prompt_tokens") from None


def truncation_side(body: Body, default: str) -> str:
    """vLLM's truncation_side: "left" keeps a cut prompt's end, "right" its start."""
    side = body.str("truncation_side") or default
    if side not in TRUNCATION_SIDES:
        raise APIError(f"'truncation_side' must be 'left' or 'right', got {side[:32]!r}", param="truncation_side")
    return side


def cache_salt(body: Body) -> str | None:
    """vLLM's `cache_salt`: requests share cached KV blocks only within one salt (SECURITY.md)."""
    salt = body.str("cache_salt")
    if salt is not None and not 0 < len(salt) <= 256:
        raise APIError("'cache_salt' must be a string of 1 to 256 characters", param="cache_salt")
    return salt


def priority(body: Body, state: ServerState) -> int:
    """A request's `priority` counts only under --scheduling-policy priority; elsewhere a
    client could jump the queue with it, so it is refused."""
    value = body.int("priority", 0)
    if value and state.info.scheduling_policy != "priority":
        raise APIError("'priority' needs a server started with --scheduling-policy priority", param="priority")
    return value


def tool_request(state: ServerState, body: Body) -> ToolRequest | None:
    """A body's tools, tool_choice and parallel_tool_calls in chat's shapes, checked against the model's template."""
    return tool_request_from(body, state.config, state.info.template, SpecialTokens.of(state.info.tokenizer))


def reply_parser(state: ServerState, tools: ToolRequest | None, include_reasoning: bool = True) -> ReplyParser:
    """The ReplyParser for a request: its tools and the server's --reasoning-parser."""
    return ReplyParser(tools, REASONING_PARSERS.get(state.config.reasoning_parser or ""), include_reasoning)


def constraint_for(
    given: StructuredOutputsParams | None, given_name: str, reply: ReplyParser
) -> StructuredOutputsParams | None:
    """The request's grammar: the one it gave (`given_name` names that field), or the one a
    required or named tool_choice brings, never both; with a reasoning parser it applies outside <think>…</think>."""
    forced = reply.tools.constraint() if reply.tools else None
    if given is not None and reply.tools and reply.tools.choice == "auto":
        forced = None  # the request's own format decides its text; calls are then only parsed
    if given is not None and forced is not None:
        raise APIError(
            f'tool_choice "{reply.tools.choice}" already constrains the reply; drop {given_name}', param="tool_choice"
        )
    constraint = given or forced
    if constraint is not None and reply.reasoning is not None:
        constraint.reasoning = reply.reasoning.tags
    return constraint


def invocation_kind(body: Body) -> str:
    """SageMaker's /invocations: "chat" for a body with "messages", "completion" for one
    with "prompt" (vLLM tries its request types in that order)."""
    if "messages" in body.data:
        return "chat"
    if "prompt" in body.data:
        return "completion"
    raise APIError(
        "/invocations could not tell the request's type: give 'messages' (a chat completion) or 'prompt' (a completion)"
    )


def parse_lora_adapter(body: Body, state: ServerState, load: bool) -> LoRAAdapterRequest:
    """The LoRA routes' body: 'lora_name', and to load, 'lora_path' (where it lies is the
    route's to check). vLLM's clients may send lora_int_id to unload: the name decides."""
    if state.info.lora is None:
        raise APIError("LoRA adapters are off; start the server with --enable-lora", 400)
    name = body.str("lora_name")
    if not name:
        raise APIError("'lora_name' is required", param="lora_name")
    if len(name) > 128 or not name.isprintable():
        raise APIError("'lora_name' must be at most 128 printable characters", param="lora_name")
    if name == state.model_name:
        raise APIError(f"'{name}' is the base model's name", param="lora_name")
    if not load:
        body.reject_unread(frozenset({"lora_int_id"}))
        return LoRAAdapterRequest(name)
    path = body.str("lora_path")
    if not path:
        raise APIError("'lora_path' is required", param="lora_path")
    if len(path) > 4096:
        raise APIError("'lora_path' must be at most 4096 characters", param="lora_path")
    inplace = bool(body.bool("load_inplace", False))
    body.reject_unread()
    return LoRAAdapterRequest(name, path, inplace)
