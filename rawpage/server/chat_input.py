"""Chat completion bodies, parsed once: /v1/chat/completions into a ChatCompletionRequest
and vLLM's /v1/chat/completions/batch into a BatchChatRequest (request.py). Every field
is read here or refused (Body.reject_unread); the handlers (chat.py, chat_batch.py)
read only the typed request.
"""

from __future__ import annotations

from typing import Any

from rawpage.multimodal.chat_images import image_source
from rawpage.multimodal.image_input import ImageError
from rawpage.sampling_params import SamplingParams
from rawpage.server.chat_reply import ReplyParser
from rawpage.server.guided import structured_outputs_from
from rawpage.server.protocol import (
    APIError,
    Body,
    OutputOptions,
    check_prompt_logprobs,
    logprob_token_ids,
    logprobs_count,
    output_options,
    sampling_params,
)
from rawpage.server.reasoning_input import chat_controls
from rawpage.server.request import (
    BatchChatRequest,
    ChatCompletionRequest,
    ChatRequest,
    cache_salt,
    constraint_for,
    default_max_tokens,
    parse_model,
    priority,
    prompt_truncation,
    reject_unread,
    render_options,
    reply_parser,
    served_name,
    tool_request,
)
from rawpage.server.state import Caller, ServerState
from rawpage.server.tools import prepare_tool_messages
from rawpage.structured_output import StructuredOutputsParams

_REFUSED_IN_BATCH = {
    "stream": "batch chat completions do not stream",
    "tools": "batch chat completions do not call tools",
    "use_beam_search": "batch chat completions do not beam-search",
}


def parse_messages(body: Body) -> list[dict[str, Any]]:
    body.mark_read("messages")
    msgs = body.data.get("messages")
    # Any role reaches the template, as in vLLM: a template may know roles OpenAI does not.
    if not isinstance(msgs, list) or not msgs:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise APIError(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text and images
            content = content_parts(content, f"messages[{i}].content")
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise APIError(
                f"messages[{i}].content must be a string or a list of parts",
                param=f"messages[{i}].content",
            )
        out.append({**m, "content": content})
    prepare_tool_messages(out)
    return out


def content_parts(parts: list[Any], where: str) -> str | list[dict[str, Any]]:
    """A message's content parts: its text joined, or, with images, the text and image_url
    parts in order (the chat template places each image: multimodal/chat_images.py)."""
    out = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            try:
                out.append({"type": "image_url", "image_url": {"url": image_source(part, f"{where}[{j}]")}})
            except ImageError as e:
                raise APIError(str(e), param=f"{where}[{j}]") from None
        else:
            raise APIError(f"{where}[{j}]: content parts must be text or image_url", param=f"{where}[{j}]")
    if any(p["type"] == "image_url" for p in out):
        return out
    return "".join(p["text"] for p in out)


def parse_chat_completion(body: Body, state: ServerState, rid: str, caller: Caller) -> ChatCompletionRequest:
    """A chat completion body -> its ChatCompletionRequest: every field read, the rest refused."""
    lora = parse_model(body, state, caller)
    messages = parse_messages(body)
    reply = reply_parser(state, tool_request(state, body), body.bool("include_reasoning", True))
    out = output_options(body, state.config)
    params = chat_sampling_params(body, state, out, output_constraint(body, reply))
    role, echo = role_and_echo(body, messages)
    render, params = chat_controls(body).resolve(state, render_options(body, state.config), params)
    cut = prompt_truncation(body, state, params, _max_tokens_name(body))
    chat = ChatRequest(
        rid, messages, params, reply, render, lora, priority(body, state), cache_salt(body), truncation=cut
    )
    reject_unread(body)
    return ChatCompletionRequest(chat, out, served_name(state, lora), role, echo)


def parse_batch_chat(body: Body, state: ServerState, rid: str, caller: Caller) -> BatchChatRequest:
    """vLLM's batch body: 'messages' is a list of conversations; every other field is
    chat's, the same for all of them (no streaming, tools, beam search or n > 1)."""
    lora = parse_model(body, state, caller)
    conversations = _conversations(body, state.config.max_prompts_per_request)
    body.mark_read(*_REFUSED_IN_BATCH)
    reply = reply_parser(state, None, body.bool("include_reasoning", True))
    out = output_options(body, state.config)
    params = chat_sampling_params(body, state, out, output_constraint(body, reply))
    roles = [role_and_echo(body, messages) for messages in conversations]
    render, params = chat_controls(body).resolve(state, render_options(body, state.config), params)
    model, prio, salt = served_name(state, lora), priority(body, state), cache_salt(body)
    cut = prompt_truncation(body, state, params, _max_tokens_name(body))
    reject_unread(body)
    chats = [
        ChatRequest(rid, messages, params, reply, render, lora, prio, salt, truncation=cut)
        for messages in conversations
    ]
    return BatchChatRequest(tuple(ChatCompletionRequest(c, out, model, *role) for c, role in zip(chats, roles)))


def _conversations(body: Body, limit: int) -> list[list[dict[str, Any]]]:
    """'messages' is a list of conversations, each checked as one chat's messages."""
    body.mark_read("messages")
    convs = body.data.get("messages")
    if not isinstance(convs, list) or not convs or not all(isinstance(c, list) and c for c in convs):
        raise APIError("'messages' must be a non-empty list of conversations (non-empty lists)", param="messages")
    if len(convs) > limit:
        raise APIError(
            f"'messages' has {len(convs)} conversations; the limit is {limit} (--max-prompts-per-request)",
            param="messages",
        )
    for name, why in _REFUSED_IN_BATCH.items():
        if body.data.get(name):
            raise APIError(why, param=name)
    if body.int("n", 1, 1) != 1:
        raise APIError("batch chat completions take n = 1 only", param="n")
    return [parse_messages(Body({"messages": c})) for c in convs]


def chat_sampling_params(
    body: Body, state: ServerState, out: OutputOptions, constraint: StructuredOutputsParams | None
) -> SamplingParams:
    """The chat request's sampling fields: logprobs (top_logprobs -1 is the whole vocabulary,
    as in vLLM), vLLM's prompt_logprobs and logprob_token_ids, and max_completion_tokens."""
    limit, vocab = state.info.max_logprobs, state.info.vocab_size
    want_logprobs = bool(body.bool("logprobs", False))
    top = logprobs_count(body, "top_logprobs", limit, vocab)
    if top and not want_logprobs:
        raise APIError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    chosen = logprob_token_ids(body, want_logprobs)
    prompt_logprobs = logprobs_count(body, "prompt_logprobs", limit, vocab)
    check_prompt_logprobs(prompt_logprobs, out.stream)
    if prompt_logprobs is None and body.bool("echo", False) and not out.stream:
        prompt_logprobs = top or 0  # vLLM: an echoed chat brings the prompt's logprobs
    max_tokens = body.int("max_completion_tokens", None, 1)
    legacy_max_tokens = body.int("max_tokens", default_max_tokens(state, None), 1)
    max_tokens = legacy_max_tokens if max_tokens is None else max_tokens
    logprobs = (top or 0) if want_logprobs else None  # with logprob_token_ids, those ids instead of the top N
    return sampling_params(
        body,
        max_tokens,
        logprobs,
        prompt_logprobs=prompt_logprobs,
        config=state.config,
        structured_outputs=constraint,
        logprob_token_ids=chosen,
        defaults=state.info.sampling_defaults,
    )


def _max_tokens_name(body: Body) -> str:
    """The field that set max_tokens, as vLLM names it in a truncation error."""
    return "max_completion_tokens" if body.data.get("max_completion_tokens") is not None else "max_tokens"


def role_and_echo(body: Body, messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The reply's role and what `echo` prepends, as vLLM decides them: the role is
    "assistant" after a generation prompt, else the last message's; echo repeats the last
    message's content when that message has the reply's role. With continue_final_message
    the template leaves that message open, so the model continues it."""
    generation_prompt = body.bool("add_generation_prompt", True)
    continue_final = body.bool("continue_final_message", False)
    if generation_prompt and continue_final:
        raise APIError(
            "'continue_final_message' needs 'add_generation_prompt': false (the template cannot both "
            "open a new message and leave the last one open)",
            param="continue_final_message",
        )
    role = "assistant" if generation_prompt else messages[-1]["role"]
    content = messages[-1]["content"]
    if isinstance(content, list):  # with images: echo its text
        content = "".join(p["text"] for p in content if p["type"] == "text")
    echo = content if body.bool("echo", False) and messages[-1]["role"] == role else ""
    return role, echo


def output_constraint(body: Body, reply: ReplyParser) -> StructuredOutputsParams | None:
    """The request's grammar: response_format / guided_* / structured_outputs, or the one a
    required or named tool_choice brings (request.constraint_for)."""
    return constraint_for(structured_outputs_from(body), "response_format or the guided_* fields", reply)
