"""What the engine decides once, at startup: the context length, the model with its
tensor-parallel workers, LoRA slots and draft model, the KV pool they agree on, the swap
space and the CUDA graph shapes. What each rank decides for itself (its dtype, its
shard, its KV blocks): rank_setup.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rawpage.backends.base import Backend
from rawpage.backends.cpu_malloc import release_freed_memory
from rawpage.config import ModelConfig
from rawpage.decode_graphs import graph_shapes
from rawpage.distributed.executor import ParallelModelRunner, TensorParallelGroup
from rawpage.engine_args import EngineArgs
from rawpage.loader import Checkpoint
from rawpage.lora.manager import LoRAManager
from rawpage.memory import GiB, MemoryPlan
from rawpage.model_runner import KVPool, ModelRunner
from rawpage.models.registry import supports_cuda_graphs
from rawpage.models.weight_source import Model
from rawpage.rank_setup import build_rank, plan_kv_cache
from rawpage.spec_decode.draft_model import load_draft_model

logger = logging.getLogger("rawpage")


def resolve_max_model_len(max_model_len: int | None, limit: int) -> int:
    """--max-model-len, or the model's context length; never beyond it."""
    want = max_model_len or limit
    if want > limit:
        raise ValueError(f"--max-model-len {want} exceeds the model's context length {limit}")
    return want


def num_swap_blocks(a: EngineArgs, bytes_per_block: int) -> int:
    """CPU blocks for swapped-out sequences: --swap-space GiB with --preemption-mode swap, else none."""
    if a.preemption_mode != "swap":
        return 0
    n = int(a.swap_space * GiB) // bytes_per_block
    logger.info("swap space: %d CPU blocks (%.2f GiB)", n, a.swap_space)
    return n


@dataclass
class LoadedModel:
    """What load_model brings up before the KV pool exists."""

    model: Model  # rank 0's (its shard, under tensor parallelism)
    memory: MemoryPlan  # the KV pool every rank fits
    workers: TensorParallelGroup | None  # ranks 1..P-1, or None at --tensor-parallel-size 1
    lora: LoRAManager | None  # the adapter slots, with --enable-lora
    draft: Model | None  # the draft model of --speculative-config


def load_model(
    a: EngineArgs, ckpt: Checkpoint, backend: Backend, max_num_batched_tokens: int, max_model_len: int
) -> LoadedModel:
    """The model on the backend, the plan of its KV pool, the tensor-parallel workers, the
    LoRA slots and the draft model. With --tensor-parallel-size P > 1 this process holds
    rank 0's shard, P - 1 spawned workers hold the others, and the pool is the smallest
    any rank fits. With --enable-lora the adapter slots, and with a draft model in
    --speculative-config that model (whole, on this rank), are loaded before the pool is sized."""
    config, group = ckpt.config, None
    if a.tensor_parallel_size > 1:
        group = TensorParallelGroup(a, backend.name, config, max_num_batched_tokens, max_model_len)
    model = build_rank(ckpt, backend, a.quantization, group and group.tp)
    model.limit_positions(max_model_len)
    release_freed_memory()  # the load's temporaries, freed but kept by malloc (cpu_malloc.py)
    lora = LoRAManager.from_args(a, model, backend)  # None without --enable-lora
    spec = a.speculative_config
    draft = load_draft_model(spec.model, backend, config.vocab_size, a.seed) if spec and spec.model else None
    plan = plan_kv_cache(a, model, backend, max_num_batched_tokens, max_model_len, lora, draft)
    return LoadedModel(model, plan if group is None else group.agree_on_pool(plan), group, lora, draft)


def decode_graph_shapes(a: EngineArgs, backend: Backend, config: ModelConfig) -> list[tuple[int, int]] | None:
    """The (batch size, query length) shapes to capture as graphs (CUDA graphs; on the CPU,
    recorded kernel calls): decode steps and, with speculative decoding, verification steps
    of k + 1 tokens a sequence, up to the backend's graph_max_batch; None: eager."""
    if not backend.supports_graphs or a.enforce_eager or not supports_cuda_graphs(config):
        return None
    if backend.name == "cpu" and a.tensor_parallel_size > 1:
        return None  # the ranks' collectives run on the host, outside any recording
    k = a.speculative_config.num_speculative_tokens if a.speculative_config else 0
    return graph_shapes(min(a.max_num_seqs, backend.graph_max_batch or a.max_num_seqs), k)


def make_runner(
    group: TensorParallelGroup | None,
    model: Model,
    backend: Backend,
    pool: KVPool,
    graph_shapes: list[tuple[int, int]] | None,
    max_model_len: int,
    lora: LoRAManager | None = None,
) -> ModelRunner:
    """The engine's ModelRunner; under tensor parallelism, one that drives the workers' too."""
    if group is None:
        return ModelRunner(model, backend, pool, graph_shapes, max_model_len, lora)
    group.start_runners(pool, graph_shapes)
    return ParallelModelRunner(group, model, backend, pool, graph_shapes, max_model_len)
