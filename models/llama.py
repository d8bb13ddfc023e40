"""The Llama family (Llama 2/3, SmolLM, Qwen2) as one forward pass over backend ops.

Reads top to bottom in the order of the math. Every weight carries its shape;
dim = hidden size, H/Hkv = query/KV heads, D = head dim, I = FFN hidden size,
V = vocabulary, T = tokens in the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig, rope_inv_freq
from rawpage.errors import ModelLoadError
from rawpage.forward_batch import ForwardBatch
from rawpage.models.sharding import ShardedWeights, TensorParallel
from rawpage.models.weight_source import WeightSource
from rawpage.ops.attention_metadata import AttentionOptions
from rawpage.ops.rope import cos_sin_cache
from rawpage.quantization.weight import QuantizedWeight, concat_rows


@dataclass
class LayerWeights:
    """One decoder layer. Linear weights are shown (out, in), as checkpoints store them;
    backend.prepare_linear may keep them in another layout its GEMM prefers, or packed
    (a QuantizedWeight). The model only passes them to backend.linear."""

    input_norm: Array  # (dim,)
    qkv: Array  # ((H + 2 Hkv) * D, dim)   q, k, v projections fused into one GEMM
    qkv_bias: Array | None  # ((H + 2 Hkv) * D,)  Qwen2 only
    o_proj: Array  # (dim, H * D)
    post_norm: Array  # (dim,)
    gate_up: Array  # (2 I, dim)   gate and up projections fused: [gate | up]
    down: Array  # (dim, I)


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        tensors: Mapping[str, np.ndarray] | WeightSource,
        tp: TensorParallel | None = None,
    ) -> None:
        """tensors: a checkpoint's float32 tensors under Hugging Face names (read lazily,
        one weight at a time, so the host never holds a second copy of the model), or
        any other WeightSource (the loader's DummyWeights draws every weight on the device).
        tp: this rank's shard of a tensor-parallel model (models/sharding.py); its config
        then has this rank's H, Hkv and I, and its vocabulary rows are tp's."""
        self.tp = tp
        self.config = config if tp is None else tp.layout.local_config()
        self.backend = backend
        c, b = self.config, backend
        if tp is not None:
            self._weights: Any = ShardedWeights(tensors, tp.layout)
        else:
            self._weights = tensors if isinstance(tensors, WeightSource) else _CheckpointWeights(tensors)
        V = c.vocab_size if tp is None else tp.layout.vocab_rows  # a rank's rows: Vp
        embed = ("model.embed_tokens.weight", (V, c.hidden_size))
        packed = self._packed([embed])  # the table as the checkpoint packs it, if the backend reads that
        if packed is not None and b.reads_packed_embedding:
            self.embed = b.prepare_linear(packed)  # (V, dim) as stored blocks, its rows read on lookup
        else:
            self.embed = self._load(embed)  # (V, dim)
        self.layers = [self._load_layer(i) for i in _progress(range(c.num_layers), "loading weights")]
        self.attn_opts = AttentionOptions(scale=c.head_dim**-0.5)  # every layer's: full attention, no cap
        self.norm = self._load(("model.norm.weight", (c.hidden_size,)))  # (dim,)
        if c.tie_word_embeddings or not self._weights.has("lm_head.weight"):
            # tied to the embedding: the same array (dense or packed), a re-laid copy, or the packed blocks
            same = packed is not None and b.reads_packed_embedding
            self.lm_head = self.embed if same else b.prepare_linear(packed if packed is not None else self.embed)
        else:
            self.lm_head = self._linear(("lm_head.weight", (V, c.hidden_size)))
        freq_factors = tensors["rope_freqs"] if self._weights.has("rope_freqs") else None
        inv_freq = rope_inv_freq(c, freq_factors)
        # (max_pos, D): [cos | sin] per position, float32 whatever the model dtype
        self.cos_sin = b.asarray(cos_sin_cache(inv_freq, c.max_position_embeddings), dtype=np.float32)
        del self._weights  # the checkpoint is not held past loading

    def _load(self, *parts: tuple[str, tuple[int, ...]]) -> Array:
        """One weight on the device: the named tensors, concatenated along dim 0."""
        return self._weights.load(self.backend, list(parts))

    def _packed(self, parts: list[tuple[str, tuple[int, ...]]]) -> QuantizedWeight | None:
        """The weights as the checkpoint packs them, where the backend reads that format."""
        w = self._weights
        return w.quantized(self.backend, parts) if isinstance(w, _CheckpointWeights) else None

    def _linear(self, *parts: tuple[str, tuple[int, ...]]) -> Array | QuantizedWeight:
        """A Linear weight (out, in) for backend.linear: packed (see _packed), else dense."""
        packed = self._packed(list(parts))
        return self.backend.prepare_linear(packed if packed is not None else self._load(*parts))

    def _load_layer(self, i: int) -> LayerWeights:
        c, p = self.config, f"model.layers.{i}."
        dim, q, kv, inter = c.hidden_size, c.q_size, c.kv_size, c.intermediate_size
        attn = [(p + f"self_attn.{n}_proj.weight", (size, dim)) for n, size in zip("qkv", (q, kv, kv))]
        bias = [(p + f"self_attn.{n}_proj.bias", (size,)) for n, size in zip("qkv", (q, kv, kv))]
        return LayerWeights(
            input_norm=self._load((p + "input_layernorm.weight", (dim,))),
            qkv=self._linear(*attn),
            qkv_bias=self._load(*bias) if c.attention_bias else None,
            o_proj=self._linear((p + "self_attn.o_proj.weight", (dim, q))),
            post_norm=self._load((p + "post_attention_layernorm.weight", (dim,))),
            gate_up=self._linear((p + "mlp.gate_proj.weight", (inter, dim)), (p + "mlp.up_proj.weight", (inter, dim))),
            down=self._linear((p + "mlp.down_proj.weight", (dim, inter))),
        )

    def num_bytes(self) -> int:
        """Bytes held by the weights (a tied LM head counted once)."""
        arrays = [self.embed, self.norm] + [a for layer in self.layers for a in vars(layer).values() if a is not None]
        if self.lm_head is not self.embed:
            arrays.append(self.lm_head)
        return sum(int(a.nbytes) for a in arrays)

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[Array, Array]]) -> Array:
        """Returns the final hidden states of the rows in batch.logits_indices: (N, dim)."""
        c, b = self.config, self.backend
        T = batch.num_tokens
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim

        tp = self.tp  # tensor parallel: heads and FFN columns are this rank's; sums all-reduced
        h = b.embedding(batch.input_ids, self.embed) if tp is None else tp.embedding(b, batch.input_ids, self.embed)
        residual = None  # h: (T, dim)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            # attention block: x = norm(h + residual); h = o_proj(attn(rope(q), rope(k), v))
            if residual is None:
                residual, x = h, b.rms_norm(h, layer.input_norm, c.rms_norm_eps)
            else:
                x, residual = b.fused_add_rms_norm(h, residual, layer.input_norm, c.rms_norm_eps)
            qkv = b.linear(x, layer.qkv, layer.qkv_bias)  # (T, (H + 2 Hkv) * D)
            q = qkv[:, : H * D].reshape(T, H, D)
            k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
            v = qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D)
            b.rope(batch.positions, q, k, self.cos_sin, True)
            b.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
            o = b.paged_attention(q, k_cache, v_cache, batch.attn, self.attn_opts)  # (T, H, D)
            h = b.linear(o.reshape(T, H * D), layer.o_proj)  # (T, dim)
            h = h if tp is None else tp.all_reduce(h)  # row-parallel: partial sums over head groups

            # feed-forward block (SwiGLU): h = down(silu(gate(x)) * up(x))
            x, residual = b.fused_add_rms_norm(h, residual, layer.post_norm, c.rms_norm_eps)
            gate_up = b.linear(x, layer.gate_up)  # (T, 2 I)
            h = b.linear(b.silu_and_mul(gate_up), layer.down)  # (T, dim)
            h = h if tp is None else tp.all_reduce(h)  # row-parallel: partial sums over FFN columns

        # Only the rows we sample from need the final norm and the (large) LM head.
        h, residual = h[batch.logits_indices], residual[batch.logits_indices]
        x, _ = b.fused_add_rms_norm(h, residual, self.norm, c.rms_norm_eps)
        return x  # (N, dim)

    def compute_logits(self, hidden: Array) -> Array | None:
        """(N, dim) -> (N, V) float32 logits; under tensor parallelism, on rank 0 only
        (each rank computes its vocabulary rows, rank 0 gathers them), None elsewhere."""
        logits = self.backend.logits(hidden, self.lm_head)
        return logits if self.tp is None else self.tp.gather_logits(logits)


class _CheckpointWeights:
    """Fetches tensors by name from a checkpoint, checking each exists and has the shape
    the config implies, and uploads each weight to the backend as soon as it is built."""

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.tensors = tensors

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise ModelLoadError(f"checkpoint has no tensor {name!r}")
        t = self.tensors[name]
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name!r} has shape {tuple(t.shape)}, but the config implies {shape}")
        return t

    def quantized(self, backend: Backend, parts: list[tuple[str, tuple[int, ...]]]) -> QuantizedWeight | None:
        """The named Linear weights fused as packed, if the checkpoint packs every one of
        them in one format that the backend keeps quantized; else None (load them dense)."""
        source = getattr(self.tensors, "quantized", None)
        if source is None or not backend.keeps_quantized:
            return None
        packed = [source(name) for name, _ in parts]
        if any(p is None or p.kind not in backend.keeps_quantized for p in packed):
            return None
        for p, (name, shape) in zip(packed, parts):
            if p.shape != shape:
                raise ModelLoadError(f"tensor {name!r} has shape {p.shape}, but the config implies {shape}")
        return concat_rows(packed)

    def load(self, backend: Backend, parts: list[tuple[str, tuple[int, ...]]]) -> Array:
        arrays = [self.get(name, shape) for name, shape in parts]
        return backend.asarray(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))


def _progress(items: range, desc: str) -> Iterable[int]:
    """A progress bar over the layers when stderr is a terminal (tqdm decides), else none."""
    try:
        from tqdm import tqdm
    except ImportError:  # a bare GPU image: no bar
        return items
    return tqdm(items, desc=desc, unit="layer", disable=None, leave=False)
