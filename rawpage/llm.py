"""LLM: offline batch generation, shaped like vLLM's so that code can switch.

from rawpage import LLM, SamplingParams
llm = LLM()                       # the embedded SmolLM2-135M-Instruct on the CPU
outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
print(outs[0].outputs[0].text)
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from rawpage.engine import PromptType
from rawpage.engine_args import EngineArgs
from rawpage.lora.adapter import LoRARequest
from rawpage.multimodal.chat_images import load_images, take_images
from rawpage.outputs import EmbeddingRequestOutput, RequestOutput
from rawpage.pooling.pooling_engine import embed, new_engine
from rawpage.request_checks import check_messages, check_params_type
from rawpage.sampling_params import SamplingParams

Conversation = list[dict[str, Any]]


class LLM:
    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        """Every engine flag is a keyword here in snake_case: device, dtype, max_model_len,
        max_num_seqs, max_num_batched_tokens, block_size, kv_cache_memory, seed, ..."""
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise TypeError(f"LLM() got unknown keyword(s) {sorted(unknown)}; see EngineArgs for the list")
        kwargs.setdefault("log_stats_interval", 0)
        self.engine = new_engine(EngineArgs(model=model, **kwargs))  # runner="pooling": an embedding engine
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The SamplingParams a prompt gets when none are given: the model's
        generation_config.json under --generation-config auto, else the neutral defaults."""
        return SamplingParams(**self.engine.sampling_defaults)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prompt prefix (LLMEngine.reset_prefix_cache): the next prompts
        compute all their blocks. True when nothing stays cached."""
        return self.engine.reset_prefix_cache(reset_running_requests)

    def generate(
        self,
        prompts: PromptType | list[PromptType],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs in prompt order.
        lora_request: one adapter for every prompt, or one (or None) per prompt."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.get_default_sampling_params()
        params = params if isinstance(params, list) else [params] * len(prompts)
        check_params_type(params)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        loras = lora_request if isinstance(lora_request, list) else [lora_request] * len(prompts)
        self.engine.grammars.wait_for(params)  # as the server does: a bad grammar raises here, at once
        ids = []
        try:
            for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras, strict=True)):
                rid = str(next(self._ids))
                self.engine.add_request(rid, prompt, p, priority=priority[i] if priority else 0, lora_request=lora)
                ids.append(rid)
        except ValueError:
            self.engine.abort_request(ids)
            self._drain()
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: Conversation | list[Conversation],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template to each conversation, then generate. mm_processor_kwargs:
        the image processor's values for these images, over --mm-processor-kwargs (vLLM's)."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        check_messages(convs)
        tok = self.engine.tokenizer
        template = chat_template or self.engine.chat_template  # Jinja text, or the engine's (--chat-template)
        prompts = []
        for c in convs:  # image parts (image_url, image_pil) become the model's placeholders and multi_modal_data
            messages, sources = take_images(c)
            text = tok.apply_chat_template(messages, add_generation_prompt, chat_template=template)
            images = load_images(sources, self.engine.images) if sources else []
            images = self.engine.images.inputs(images, mm_processor_kwargs) if images or mm_processor_kwargs else []
            text = self.engine.images.expand_text(text, images)  # each image's own number of soft tokens
            prompt = {"prompt_token_ids": tok.encode(text, add_special_tokens=False)}
            prompts.append({**prompt, "multi_modal_data": {"image": images}} if images else prompt)
        return self.generate(prompts, sampling_params, use_tqdm)

    def embed(self, prompts: PromptType | list[PromptType], **kwargs: Any) -> list[EmbeddingRequestOutput]:
        """One vector per prompt, in order (runner="pooling"); kwargs: pooling_params, use_tqdm, truncate_prompt_tokens"""
        return embed(self.engine, self._ids, prompts, **kwargs)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = _progress_bar(len(ids)) if use_tqdm else None
        start, generated = time.monotonic(), 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                generated += sum(len(o.delta_token_ids) for o in out.outputs)
                if out.finished:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
            if bar is not None:
                bar.set_postfix_str(f"{generated / max(1e-9, time.monotonic() - start):.1f} tok/s", refresh=False)
        if bar is not None:
            bar.close()
        self.engine.backend.idle()  # nothing left to run: the CPU gives back what the passes kept
        return [done[i] for i in ids if i in done]

    def _drain(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()


def _progress_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True)
