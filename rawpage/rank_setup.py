"""What each rank decides and builds for itself at startup: its backend (the dtype), its
model (its shard of the weights), and how many KV blocks fit in its memory.

One build for every model the engine runs: the engine's own (rank 0, engine_setup.py),
each tensor-parallel worker's (ranks 1..P-1, distributed/worker.py) and the draft
model's (spec_decode/draft_model.py) all come from `build_rank`.
"""

from __future__ import annotations

import logging

import numpy as np

from rawpage.backends import cuda_available, get_backend
from rawpage.backends.base import Backend
from rawpage.config import ModelConfig
from rawpage.engine_args import EngineArgs, parse_kv_cache_scales
from rawpage.kv_cache_scales import calibrate_kv_cache_scales
from rawpage.loader import Checkpoint
from rawpage.lora.manager import LoRAManager
from rawpage.memory import DraftMemory, MemoryPlan, PoolLayout, plan_cpu_default, plan_fixed, profile_gpu
from rawpage.model_runner import kv_bytes_per_block
from rawpage.models.registry import build_model
from rawpage.models.sharding import TensorParallel
from rawpage.models.weight_source import Model
from rawpage.profile_run import profile_run
from rawpage.quantization.select import apply_quantization_flag

logger = logging.getLogger("rawpage")


def build_rank(ckpt: Checkpoint, backend: Backend, quantization: str | None, tp: TensorParallel | None = None):
    """The checkpoint's model on the backend, its Linear weights in the form --quantization
    asks (quantization/select.py); under tensor parallelism, `tp`'s shard of it."""
    model = build_model(ckpt.config, backend, apply_quantization_flag(ckpt.tensors, quantization), tp)
    backend.weights_loaded(list(model.linear_weights()))
    return model


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str) -> str | None:
    """--dtype auto: float32 on cpu and sim; on cuda bfloat16 for bfloat16 checkpoints, else float16."""
    if dtype == "half":
        return "float16"
    if dtype != "auto":
        return dtype
    if device in ("cuda", "auto") and cuda_available():
        return "bfloat16" if "bfloat16" in checkpoint_dtype else "float16"
    return None


def backend_for(args: EngineArgs, device: str, checkpoint_dtype: str) -> Backend:
    """The backend these flags ask for on `device` (the engine's, or a worker's), after
    which the flags that cannot apply to it each log their one line."""
    dtype = resolve_dtype(args.dtype, device, checkpoint_dtype)
    backend = get_backend(device, dtype, args.cpu_threads, args.cpu_kernels)
    args.log_inert_flags(backend)
    return backend


def plan_kv_cache(
    a: EngineArgs,
    model: Model,
    backend: Backend,
    max_num_batched_tokens: int,
    max_model_len: int,
    lora: LoRAManager | None = None,
    draft: Model | None = None,
) -> MemoryPlan:
    """How many KV blocks the pool gets: on the GPU, whatever --gpu-memory-utilization leaves
    after measuring a worst-case step; else --num-gpu-blocks-override or --kv-cache-memory.
    LoRA slots (already allocated) count with the weights; a draft model (already loaded)
    with its weights, and with its own pool of as many blocks, in the same budget."""
    plan = _plan_kv_cache(a, model, backend, max_num_batched_tokens, max_model_len, lora, draft)
    plan.weights_note = backend.weights_note()
    if lora is not None:
        plan.lora_bytes, plan.lora_text = lora.slot_bytes(), lora.describe()
    return plan


def _plan_kv_cache(
    a: EngineArgs,
    model: Model,
    backend: Backend,
    max_num_batched_tokens: int,
    max_model_len: int,
    lora: LoRAManager | None,
    draft: Model | None,
) -> MemoryPlan:
    fp8, half = setup_fp8_kv_cache(a, model, backend), setup_float16_kv_cache(a, backend, model.config.torch_dtype)
    itemsize = 1 if fp8 else 2 if half else backend.dtype.itemsize  # the draft's cache takes the same dtype
    per_block = kv_bytes_per_block(model.config, a.block_size, itemsize)
    weights = model.num_bytes() + (lora.slot_bytes() if lora is not None else 0)
    draft_mem = draft and DraftMemory(draft.num_bytes(), kv_bytes_per_block(draft.config, a.block_size, itemsize))
    dtype = "fp8" if fp8 else "float16" if half else "auto"
    layout = PoolLayout(per_block, a.block_size, max_model_len, kv_cache_window(model.config), dtype, draft_mem)
    if backend.memory is not None and not a.num_gpu_blocks_override and not a.kv_cache_memory:

        def worst_case() -> None:  # the draft runs passes of the same size, one model at a time
            for m in (model, draft):
                if m is not None:
                    profile_run(m, backend, max_num_batched_tokens, a.max_num_seqs, a.block_size, max_model_len)

        return profile_gpu(backend.memory, weights, worst_case, a.gpu_memory_utilization, layout)
    if a.num_gpu_blocks_override:
        budget = a.num_gpu_blocks_override * (per_block + (draft_mem.bytes_per_block if draft_mem else 0))
        return plan_fixed(budget, layout, weights, 0, "--num-gpu-blocks-override")
    if a.kv_cache_memory:
        return plan_fixed(a.kv_cache_memory, layout, weights)
    return plan_cpu_default(a.max_num_seqs, layout, weights)


def kv_cache_window(config: ModelConfig) -> int | None:
    """The sliding window out of which KV blocks may be released: only when every layer
    has one (a global layer, as in Gemma 2 and 3, reads every key of the context)."""
    windows = [config.layer_sliding_window(i) for i in range(config.num_layers)]
    return max(windows) if windows and all(windows) else None


def setup_fp8_kv_cache(a: EngineArgs, model, backend: Backend) -> bool:
    """--kv-cache-dtype fp8: give the backend its scales (set, or calibrated now, before the
    pool exists; the runner then allocates uint8 caches). False for a model-dtype cache."""
    if not a.fp8_kv_cache:
        return False
    scales = parse_kv_cache_scales(a.kv_cache_scales)
    if scales is None:
        scales = calibrate_kv_cache_scales(model, backend, a.block_size, model.config.vocab_size)
    backend.set_kv_scales(scales)
    logger.info("FP8 KV cache: k_scale %.4g, v_scale %.4g (%s)", scales[0], scales[1], a.kv_cache_scales)
    return True


def setup_float16_kv_cache(a: EngineArgs, backend: Backend, checkpoint_dtype: str) -> bool:
    """A float16 cache on the CPU: the runner allocates float16 caches (half the bytes of
    float32; attention reads them as float32). --kv-cache-dtype float16 asks for it, and
    `auto` takes it for a float16 checkpoint (every GGUF's; llama.cpp's cache is float16
    too) unless --dtype float32 asks for float32. False for a float32 cache."""
    auto = a.kv_cache_dtype == "auto" and backend.name == "cpu" and a.dtype != "float32"
    if not (a.kv_cache_dtype == "float16" or (auto and checkpoint_dtype == "float16")):
        return False
    if backend.name != "cpu":
        raise ValueError(
            f"--kv-cache-dtype float16 runs on --device cpu only, not {backend.name}: there the KV cache "
            "takes the model dtype (--kv-cache-dtype auto; --dtype float16 for a 16-bit one) or fp8"
        )
    backend.kv_cache_dtype = np.dtype(np.float16)
    return True
