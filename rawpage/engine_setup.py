"""What the engine decides once, at startup: the dtype, the context length, and how
many KV blocks fit (measured on the GPU, from a fixed budget on the CPU)."""

from __future__ import annotations

import logging

from rawpage.backends import cuda_available
from rawpage.backends.base import Backend
from rawpage.engine_args import EngineArgs
from rawpage.lora.manager import LoRAManager
from rawpage.memory import DEFAULT_CPU_KV_CACHE, GiB, MemoryPlan, plan_fixed, profile_gpu
from rawpage.model_runner import kv_bytes_per_block
from rawpage.models.llama import LlamaModel
from rawpage.profile_run import profile_run

logger = logging.getLogger("rawpage")


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str) -> str | None:
    """--dtype auto: float32 on cpu and sim; on cuda bfloat16 for bfloat16 checkpoints, else float16."""
    if dtype == "half":
        return "float16"
    if dtype != "auto":
        return dtype
    if device in ("cuda", "auto") and cuda_available():
        return "bfloat16" if "bfloat16" in checkpoint_dtype else "float16"
    return None


def resolve_max_model_len(max_model_len: int | None, limit: int) -> int:
    """--max-model-len, or the model's context length; never beyond it."""
    want = max_model_len or limit
    if want > limit:
        raise ValueError(f"--max-model-len {want} exceeds the model's context length {limit}")
    return want


def plan_kv_cache(
    a: EngineArgs,
    model: LlamaModel,
    backend: Backend,
    max_num_batched_tokens: int,
    max_model_len: int,
    lora: LoRAManager | None = None,
) -> MemoryPlan:
    """How many KV blocks the pool gets: on the GPU, whatever --gpu-memory-utilization leaves
    after measuring a worst-case step; else --num-gpu-blocks-override or --kv-cache-memory.
    LoRA slots (already allocated) count with the weights."""
    plan = _plan_kv_cache(a, model, backend, max_num_batched_tokens, max_model_len, lora)
    if lora is not None:
        plan.lora_bytes, plan.lora_text = lora.slot_bytes(), lora.describe()
    return plan


def _plan_kv_cache(
    a: EngineArgs,
    model: LlamaModel,
    backend: Backend,
    max_num_batched_tokens: int,
    max_model_len: int,
    lora: LoRAManager | None,
) -> MemoryPlan:
    per_block = kv_bytes_per_block(model.config, a.block_size, backend.dtype.itemsize)
    weights = model.num_bytes() + (lora.slot_bytes() if lora is not None else 0)
    if backend.memory is not None and not a.num_gpu_blocks_override and not a.kv_cache_memory:

        def worst_case() -> None:
            profile_run(model, backend, max_num_batched_tokens, a.max_num_seqs, a.block_size)

        return profile_gpu(
            backend.memory, weights, worst_case, a.gpu_memory_utilization, per_block, a.block_size, max_model_len
        )
    if a.num_gpu_blocks_override:
        budget = a.num_gpu_blocks_override * per_block
        return plan_fixed(budget, per_block, a.block_size, max_model_len, weights, 0, "--num-gpu-blocks-override")
    budget = a.kv_cache_memory or DEFAULT_CPU_KV_CACHE
    return plan_fixed(budget, per_block, a.block_size, max_model_len, weights)


def num_swap_blocks(a: EngineArgs, bytes_per_block: int) -> int:
    """CPU blocks for swapped-out sequences: --swap-space GiB with --preemption-mode swap, else none."""
    if a.preemption_mode != "swap":
        return 0
    n = int(a.swap_space * GiB) // bytes_per_block
    logger.info("swap space: %d CPU blocks (%.2f GiB)", n, a.swap_space)
    return n
