"""EngineInfo: all that the server's handlers know of the loaded engine.

The engine thread builds it once the model has loaded (AsyncEngine). Handlers read the
tokenizer, the template and the limits from it, and have the engine check each request
once with its check_prompt, which reads only settings fixed at startup (and LoRAInfo, a
read-only view of the adapters the engine thread keeps). Everything else goes through AsyncEngine:
requests (generate, encode, abort), adapters (add_lora, remove_lora), and the snapshots
its engine-thread observers take after each step (engine_view.py, metrics.py).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rawpage.engine import LLMEngine
from rawpage.lora import LoRAAdapter, LoRARequest
from rawpage.lora.adapter import load_adapter
from rawpage.lora.manager import LoRAManager
from rawpage.multimodal.prompt_images import PromptImages
from rawpage.pooling.pooler import PoolingParams
from rawpage.pooling.pooling_engine import PoolingEngine
from rawpage.request_checks import CheckedPrompt
from rawpage.text.chat_template import ChatTemplate
from rawpage.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class LoRAInfo:
    """What handlers know of --enable-lora's adapters. Only the engine thread changes them
    (AsyncEngine.add_lora, remove_lora); handlers read them and read new ones from disk."""

    adapters: Mapping[str, LoRAAdapter]  # known by name: a read-only view the engine thread keeps current
    read: Callable[[LoRARequest], LoRAAdapter]  # a folder, checked against the model (any thread)
    next_id: Callable[[], int]  # an id no known adapter has

    @classmethod
    def of(cls, manager: LoRAManager) -> LoRAInfo:
        read = functools.partial(load_adapter, config=manager.config, max_rank=manager.max_rank)
        return cls(types.MappingProxyType(manager.adapters), read, manager.next_id)


class EngineInfo:
    def __init__(self, engine: LLMEngine) -> None:
        """Engine thread, once the engine has loaded."""
        self.tokenizer: Tokenizer = engine.tokenizer
        self.chat_template: ChatTemplate | None = engine.chat_template  # --chat-template; None: the tokenizer's own
        self.max_model_len: int = engine.max_model_len
        # A longer text than this cannot fit in max_model_len tokens (Tokenizer.longest_token_chars).
        self.longest_token_chars: int = engine.tokenizer.longest_token_chars
        self.max_prompt_chars: int = self.max_model_len * self.longest_token_chars
        self.vocab_size: int = engine.model_config.vocab_size
        self.max_logprobs: int = engine.args.max_logprobs  # --max-logprobs
        # --generation-config: SamplingParams keywords for the fields a request leaves out
        self.sampling_defaults: dict[str, Any] = engine.sampling_defaults
        self.max_num_batched_tokens: int = engine.scheduler.config.max_num_batched_tokens  # a step's tokens
        self.scheduling_policy: str = engine.args.scheduling_policy  # --scheduling-policy: "fcfs" or "priority"
        self.runner: str = engine.args.runner  # --runner: "generate" (chat, completions) or "pooling" (embeddings)
        self.lora: LoRAInfo | None = LoRAInfo.of(engine.lora) if engine.lora is not None else None  # --enable-lora
        # The engine's one check of a request (ids, params, priority, cache_salt): a CheckedPrompt whose
        # refusal (InvalidRequestError naming the field) says if it could not run to the end, and whose
        # grammar is compiling off the engine thread (grammar_compiler.py). AsyncEngine.generate queues it.
        self.check_prompt: Callable[..., CheckedPrompt] = engine.check_prompt  # (..., images: the placed ImageInputs)
        self.images: PromptImages = engine.images  # a prompt's images: decoded, checked, placed
        # A pooling engine's check of one input: the ids it will pool (truncated where asked).
        pooling = isinstance(engine, PoolingEngine)
        self.check_input: Callable[[list[int], PoolingParams], list[int]] | None = (
            engine.check_input if pooling else None
        )

    @property
    def template(self) -> ChatTemplate | None:
        """The chat template a request renders with, unless it brings its own."""
        return self.chat_template or self.tokenizer.chat_template
