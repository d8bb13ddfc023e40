"""Tensor parallelism (Megatron style), applied to a model from outside it, as gpt-fast's
tp.py does: which slice of each weight a rank holds, and `apply_tensor_parallel`, which
wraps the model's methods that need a collective. models/decoder.py names none.

With P ranks, rank r holds
    q_proj rows     of query heads [r H/P, (r+1) H/P)            column-parallel
    k/v_proj rows   of KV heads [r Hkv/P, ...) when Hkv >= P;     column-parallel
                    else KV head r Hkv // P, replicated on P/Hkv ranks
    qkv_proj rows   (Phi-3's fused [q | k | v]) its q, k and v rows, each sliced as above
    o_proj columns  of its query heads                            row-parallel -> all-reduce
    gate/up rows    [r I/P, (r+1) I/P)                            column-parallel
    gate_up_proj    (Phi-3's fused [gate | up]) its gate rows and its up rows
    down columns    [r I/P, (r+1) I/P)                            row-parallel -> all-reduce
    each expert     gate/up rows and down columns as a dense MLP's, of moe_intermediate_size
    embed/lm_head   vocabulary rows [r Vp, (r+1) Vp), Vp = ceil(V/P), zero-padded
and every norm (Gemma's four, the per-head q/k norms), the MoE router and the rope factors
whole, as is a vision-language model's image encoder, which rank 0 alone holds. So
attention and the MLP (or the experts, whose weighted sum is linear in their down
projections) run on local heads and columns with no communication until the two
all-reduces per layer; the embedding is one masked lookup and one all-reduce; the
logits are gathered on rank 0, the only rank that samples.

On the CPU (ShardLayout.exact) o_proj and down are cut by output rows instead, [r dim/P,
(r+1) dim/P) of every input: their input is gathered whole, each rank computes its dim/P
outputs, and those are gathered, so every number is one rank's bits. A row-parallel sum
is not: its partial sums add in another order, and the CPU's GGUF kernels, which round
each activation to int8, turn that float rounding into other tokens within a few dozen
(tests/test_tensor_parallel.py PARTED). Four gathers a layer for two all-reduces cost
little on the host's pipes; cuda keeps Megatron's. Experts are all-reduced in both.

A rank's model is built from `local_config` (its H, Hkv, I and Vp) and `ShardedWeights`,
which slices each checkpoint tensor as it is read, so no process ever holds the whole
model; `apply_tensor_parallel` then wraps it. One process uses none of this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig
from rawpage.errors import UnsupportedModelError
from rawpage.models.decoder import DecoderModel
from rawpage.models.weight_source import CheckpointWeights, Part, WeightSource
from rawpage.quantization.weight import QuantizedWeight, RowStack, concat_rows

# A vision-language model's image encoder (its SigLIP tower's q/k/v_proj end as the decoder's do).
IMAGE_ENCODER_PREFIXES = ("vision_tower.", "multi_modal_projector.", "visual.")  # Gemma 3's, Qwen2.5-VL's


class Communicator(Protocol):
    """Collectives over the ranks of one model (rawpage/distributed/communicator.py)."""

    rank: int
    world_size: int

    def all_reduce(self, x: Array) -> Array:
        """The elementwise sum of x over all ranks, on every rank (same shape and dtype)."""
        ...

    def all_gather(self, x: Array) -> Array:
        """(N, C) on each rank -> (N, P C) on every rank, rank order along the last dim."""
        ...

    def gather(self, x: Array) -> Array | None:
        """(N, C) on each rank -> (N, P C) on rank 0, rank order along the last dim; None elsewhere."""
        ...


def check_shardable(config: ModelConfig, size: int, exact: bool = False) -> None:
    """Refuse, before anything loads, a model that cannot be split over `size` ranks."""
    c = config
    problems = []
    if c.num_heads % size:
        problems.append(f"num_heads={c.num_heads} is not a multiple of it")
    if c.num_kv_heads % size and size % c.num_kv_heads:
        problems.append(f"num_kv_heads={c.num_kv_heads} neither divides it nor is a multiple of it")
    if c.intermediate_size % size:
        problems.append(f"intermediate_size={c.intermediate_size} is not a multiple of it")
    if c.num_experts and c.moe_intermediate_size % size:
        problems.append(f"moe_intermediate_size={c.moe_intermediate_size} is not a multiple of it")
    if exact and c.hidden_size % size:
        problems.append(f"hidden_size={c.hidden_size} is not a multiple of it")
    if problems:
        raise UnsupportedModelError(
            f"--tensor-parallel-size {size} cannot split {c.name or c.architecture}: {'; '.join(problems)}"
        )


@dataclass(frozen=True)
class ShardLayout:
    """Rank `rank` of `size`: which heads, FFN columns and vocabulary rows it holds."""

    config: ModelConfig  # the whole model's
    rank: int
    size: int
    exact: bool = False  # o_proj and down cut by output rows and gathered (the module docstring)

    @classmethod
    def on(cls, device: str, config: ModelConfig, rank: int, size: int) -> ShardLayout:
        """The layout ranks take on `device`: exact on the CPU (its kernels round activations
        to int8, and its collectives are the host's pipes), Megatron's elsewhere."""
        return cls(config, rank, size, exact=device == "cpu")

    @property
    def num_heads(self) -> int:  # H / P
        return self.config.num_heads // self.size

    @property
    def num_kv_heads(self) -> int:  # Hkv / P, or 1 replicated head when Hkv < P
        return max(self.config.num_kv_heads // self.size, 1)

    @property
    def kv_head_start(self) -> int:
        return self.rank * self.config.num_kv_heads // self.size

    @property
    def vocab_rows(self) -> int:  # Vp = ceil(V / P): each rank's rows, the last one zero-padded
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_rows

    def local_config(self) -> ModelConfig:
        """The config a rank's model is built from: its heads, FFN columns and vocabulary rows."""
        c = self.config
        return dataclasses.replace(
            c,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            intermediate_size=c.intermediate_size // self.size,
            moe_intermediate_size=c.moe_intermediate_size // self.size,
            vocab_size=self.vocab_rows,
        )

    def gathered(self, name: str) -> bool:
        """Is `name` cut by output rows and gathered (exact layout: o_proj and a dense down)?"""
        if name.startswith(IMAGE_ENCODER_PREFIXES) or ".experts." in name:  # Qwen2.5-VL's ViT has a down_proj
            return False
        return self.exact and name.endswith(("o_proj.weight", "down_proj.weight"))

    def held_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape this rank holds of the weight a model built from local_config asks for
        as `shape`: the same, but (out, K/P) -> (out/P, K) where gathered."""
        return (shape[0] // self.size, shape[1] * self.size) if self.gathered(name) else shape

    def split(self, name: str) -> tuple[str, list[tuple[int, int]]]:
        """How this rank cuts the checkpoint tensor `name`: ("rows", [(start, stop), ...]),
        its rows in those ranges, fused in order; ("columns", [(start, stop)]); ("vocab",
        [(start, stop)]), rows zero-padded past the vocabulary; or ("whole", [])."""
        c = self.config
        if name.startswith(IMAGE_ENCODER_PREFIXES):  # rank 0's alone, whole (models/registry.py)
            return "whole", []
        # Phi-3's fused tensors first: "qkv_proj" ends like "v_proj", "gate_up_proj" like "up_proj".
        if name.endswith("qkv_proj.weight"):  # [q | k | v] rows
            return "rows", [self._query(0), self._kv(c.q_size), self._kv(c.q_size + c.kv_size)]
        if name.endswith("gate_up_proj.weight"):  # [gate | up] rows
            return "rows", [self._ffn(0, c.intermediate_size), self._ffn(c.intermediate_size, c.intermediate_size)]
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            return "rows", [self._query(0)]
        if name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            return "rows", [self._kv(0)]
        if self.gathered(name):  # [r dim/P, (r+1) dim/P) of the outputs
            n = c.hidden_size // self.size
            return "rows", [(self.rank * n, (self.rank + 1) * n)]
        if name.endswith("o_proj.weight"):
            return "columns", [self._query(0)]
        inter = c.moe_intermediate_size if ".experts." in name else c.intermediate_size
        if name.endswith(("gate_proj.weight", "up_proj.weight", ".w1.weight", ".w3.weight")):  # w1, w3: Mixtral's
            return "rows", [self._ffn(0, inter)]
        if name.endswith(("down_proj.weight", ".w2.weight")):
            return "columns", [self._ffn(0, inter)]
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return "vocab", [(self.vocab_start, self.vocab_start + self.vocab_rows)]
        return "whole", []  # norms, routers, rope_freqs: every rank holds them whole

    def shard(self, name: str, full: np.ndarray) -> np.ndarray:
        """This rank's slice of the checkpoint tensor `name` (full shape)."""
        how, ranges = self.split(name)
        if how == "rows":
            return full[slice(*ranges[0])] if len(ranges) == 1 else np.concatenate([full[a:b] for a, b in ranges])
        if how == "columns":
            return full[:, slice(*ranges[0])]
        if how == "vocab":
            rows = full[slice(*ranges[0])]
            pad = self.vocab_rows - rows.shape[0]
            return np.concatenate([rows, np.zeros((pad, *rows.shape[1:]), rows.dtype)]) if pad else rows
        return full

    def shard_packed(self, name: str, full: QuantizedWeight) -> QuantizedWeight | None:
        """shard() on packed blocks, or None where the cut splits a block (QuantizedWeight.
        columns) or pads the vocabulary (the last rank's zero rows): that weight loads dense."""
        how, ranges = self.split(name)
        if how == "rows":
            return concat_rows([full.rows(a, b) for a, b in ranges])
        if how == "columns":
            return full.columns(*ranges[0])
        if how == "vocab":
            start, stop = ranges[0]
            return full.rows(start, stop) if stop <= full.shape[0] else None
        return full

    def _query(self, offset: int) -> tuple[int, int]:
        """The rows (H/P D of H D) of this rank's query heads, past `offset`."""
        n = self.num_heads * self.config.head_dim
        return offset + self.rank * n, offset + (self.rank + 1) * n

    def _kv(self, offset: int) -> tuple[int, int]:
        """The rows of the KV heads this rank's query heads read, past `offset`."""
        D = self.config.head_dim
        return offset + self.kv_head_start * D, offset + (self.kv_head_start + self.num_kv_heads) * D

    def _ffn(self, offset: int, inter: int) -> tuple[int, int]:
        """This rank's FFN rows [r I/P, (r+1) I/P), past `offset`."""
        n = inter // self.size
        return offset + self.rank * n, offset + (self.rank + 1) * n


class ShardedWeights(CheckpointWeights):
    """A checkpoint's full tensors handed out as one rank's slices: each is read, sliced
    and dropped, packed where the backend keeps its format (shard_packed), else dense.
    The model asks with its local shapes, which CheckpointWeights checks (as held_shape
    says this rank holds them)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], layout: ShardLayout) -> None:
        super().__init__(tensors)
        self.layout = layout

    def cut(self, name: str, full: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self.layout.shard(name, full))

    def cut_packed(self, name: str, full: QuantizedWeight) -> QuantizedWeight | None:
        return self.layout.shard_packed(name, full)

    def load(self, backend: Backend, parts: list[Part]) -> Array:
        return super().load(backend, [(n, self.layout.held_shape(n, s)) for n, s in parts])

    def quantized(self, backend: Backend, parts: list[Part]) -> QuantizedWeight | RowStack | None:
        return super().quantized(backend, [(n, self.layout.held_shape(n, s)) for n, s in parts])


class DrawnShard:
    """Weights without a checkpoint (the loader's DummyWeights) drawn at the shapes this
    rank holds: nothing to cut."""

    def __init__(self, source: WeightSource, layout: ShardLayout) -> None:
        self.source, self.layout = source, layout

    def has(self, name: str) -> bool:
        return self.source.has(name)

    def load(self, backend: Backend, parts: list[Part]) -> Array:
        return self.source.load(backend, [(n, self.layout.held_shape(n, s)) for n, s in parts])


@dataclass(frozen=True)
class TensorParallel:
    """One rank of a tensor-parallel model: its layout and its communicator."""

    layout: ShardLayout
    comm: Communicator

    def weights(self, tensors: Mapping[str, np.ndarray] | WeightSource) -> WeightSource:
        """The checkpoint as this rank reads it, each tensor sliced as it is read (or, without
        one, each weight drawn at the shape the rank holds)."""
        if isinstance(tensors, WeightSource):
            return DrawnShard(tensors, self.layout)
        return ShardedWeights(tensors, self.layout)


def apply_tensor_parallel(model: DecoderModel, tp: TensorParallel) -> None:
    """Make a rank's model, built from local_config and tp.weights, compute the whole
    model's hidden states on every rank and its logits on rank 0: four of its methods get
    their collective, as gpt-fast's _apply_tp_Transformer hooks its modules. The forward
    pass is the one-process one; it runs on this rank's heads, columns and rows."""
    lay, comm, m = tp.layout, tp.comm, model
    embed_tokens, project_out, experts, compute_logits = m.embed_tokens, m.project_out, m.experts, m.compute_logits

    def vocab_parallel_embedding(ids: Array) -> Array:
        """ids (T,) -> (T, dim): each rank looks up the ids in its vocabulary rows (zeros
        for the others), and the all-reduce adds the one nonzero row per token."""
        local = ids - lay.vocab_start
        mine = (local >= 0) & (local < lay.vocab_rows)  # (T,) bool
        h = embed_tokens(local * mine)  # (T, dim); other ranks' ids read row 0
        return comm.all_reduce(h * mine[:, None].astype(h.dtype))  # 0/1: exact even on bfloat16 bits

    def row_parallel(x: Array, w: Array | QuantizedWeight) -> Array:
        """x (T, K/P) -> (T, dim): this rank's share of the sum over K, summed over ranks."""
        return comm.all_reduce(project_out(x, w))

    def gathered(x: Array, w: Array | QuantizedWeight) -> Array:
        """x (T, K/P) -> (T, dim): x gathered (T, K), this rank's dim/P outputs, gathered."""
        return comm.all_gather(project_out(comm.all_gather(x), w))

    def gathered_logits(hidden: Array) -> Array | None:
        """(N, dim) -> (N, V) on rank 0 (each rank's Vp columns, the padding cut off); None elsewhere."""
        full = comm.gather(compute_logits(hidden))
        return None if full is None else full[:, : lay.config.vocab_size]

    model.embed_tokens = vocab_parallel_embedding
    model.project_out = gathered if lay.exact else row_parallel
    model.experts = lambda *args: comm.all_reduce(experts(*args))  # each rank's share of every expert
    model.compute_logits = gathered_logits
    model.config = dataclasses.replace(model.config, vocab_size=lay.config.vocab_size)  # its logits' width
    model.tp = tp  # for setup that must agree over ranks (kv_cache_scales.py); the forward pass never reads it
