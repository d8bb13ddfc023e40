"""The one decoder of every family: Llama, Qwen2, Qwen3, Mistral, Gemma 2/3, Phi-3,
Mixtral and Qwen3-MoE. Each family is a subclass in its own file that says how it
differs (weight names, norms, activation, experts); the forward pass is here, once,
on dense weights or the packed blocks a backend keeps (backend.keeps_quantized).

It names no collective: tensor parallelism builds a rank's model from its local config
and slice of the weights, then wraps four methods from outside (models/sharding.py).

Shapes: dim = hidden size, H/Hkv = query/KV heads, D = head dim, I = FFN hidden
size, E = experts, V = vocabulary, T = tokens in the batch, N = rows for logits.
Under tensor parallelism H, Hkv and I are this rank's (config is its local one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig
from rawpage.dtypes import from_float32, to_float32
from rawpage.forward_batch import ForwardBatch
from rawpage.models.moe import MoEWeights, moe_forward
from rawpage.models.rotary import mrope_cos_sin, rope_table
from rawpage.models.weight_source import CheckpointWeights, Part, WeightSource, progress
from rawpage.ops.attention_metadata import AttentionOptions
from rawpage.quantization.weight import QuantizedWeight


@dataclass
class DecoderLayer:
    """One layer's weights. Linear weights are shown (out, in), as checkpoints store them;
    backend.prepare_linear may keep them in another layout its GEMM prefers, or packed
    (a QuantizedWeight). The model only passes them to backend.linear."""

    input_norm: Array  # (dim,)
    qkv: Array  # ((H + 2 Hkv) * D, dim)   q, k, v fused into one GEMM
    qkv_bias: Array | None  # ((H + 2 Hkv) * D,)   Qwen2 (attention_bias)
    q_norm: Array | None  # (D,)   per-head RMSNorm of q before RoPE (Qwen3, Gemma 3)
    k_norm: Array | None  # (D,)
    o_proj: Array  # (dim, H * D)
    post_attn_norm: Array | None  # (dim,)   Gemma: normalizes the attention output
    pre_ffn_norm: Array  # (dim,)   Llama calls it post_attention_layernorm
    post_ffn_norm: Array | None  # (dim,)   Gemma: normalizes the MLP output
    gate_up: Array | None  # (2 I, dim)   [gate | up]; None in an MoE layer
    down: Array | None  # (dim, I)
    moe: MoEWeights | None  # router + experts; None in a dense layer
    attn_opts: AttentionOptions  # this layer's scale, sliding window (None = full) and soft cap
    rope: int  # index of this layer's rotary table in DecoderModel.cos_sin


class DecoderModel:
    """Llama's pre-norm decoder and the differences families ask for. A family
    subclass sets the class attributes below and names its weights."""

    norm_weight_offset = 0.0  # Gemma's RMSNorm scales by (1 + w): folded into w at load
    sandwich_norms = False  # Gemma: norms after attention and after the MLP as well
    scale_embedding = False  # Gemma: embeddings multiplied by sqrt(dim)
    qk_norm = False  # Qwen3, Gemma 3: RMSNorm over each head of q and k

    def __init__(
        self,
        config: ModelConfig,
        backend: Backend,
        tensors: Mapping[str, np.ndarray] | WeightSource,
    ) -> None:
        """tensors: a checkpoint's float32 tensors under Hugging Face names (read lazily,
        one weight at a time, so the host never holds a second copy of the model), or
        any other WeightSource (the loader's DummyWeights draws every weight on the device;
        models/sharding.py's ShardedWeights hands out one rank's slices)."""
        self.config, self.backend = config, backend
        c, b = config, backend
        self._weights = tensors if isinstance(tensors, WeightSource) else CheckpointWeights(tensors)
        V, dim = c.vocab_size, c.hidden_size

        embed = ("model.embed_tokens.weight", (V, dim))
        packed = self.load_packed([embed])  # the table as the checkpoint packs it, if the backend reads that
        if packed is not None and b.reads_packed_embedding:
            self.embed = b.prepare_linear(packed)  # (V, dim) as stored blocks, its rows read on lookup
        else:
            self.embed = self.load(embed)  # (V, dim)
        self.layers = [self._load_layer(i) for i in progress(range(c.num_layers), "loading weights")]
        self.norm = self.load_norm("model.norm.weight", dim)  # (dim,)
        if c.tie_word_embeddings or not self._weights.has("lm_head.weight"):
            # tied to the embedding: the same array (dense or packed), a re-laid copy, or the packed blocks
            same = packed is not None and b.reads_packed_embedding
            self.lm_head = self.embed if same else b.prepare_linear(packed if packed is not None else self.embed)
        else:
            self.lm_head = self.load_linear(("lm_head.weight", (V, dim)))
        # (max_pos, D) [cos | sin] per position, float32; Gemma 3's sliding layers have their own
        freq_factors = tensors["rope_freqs"] if self._weights.has("rope_freqs") else None  # GGUF's Llama 3
        tables = [rope_table(c, freq_factors=freq_factors)]
        if c.rope_local_theta is not None:
            tables.append(rope_table(c, c.rope_local_theta, None))
        self.cos_sin = [b.asarray(t, dtype=np.float32) for t in tables]
        self.expert_tokens = np.zeros((c.num_layers, max(c.num_experts, 1)), np.int64)  # MoE load, summed
        del self._weights  # the checkpoint is not held past loading

    # --- loading ---------------------------------------------------------------------
    def load(self, *parts: Part) -> Array:
        """One weight on the device: the named tensors, concatenated along dim 0."""
        return self._weights.load(self.backend, list(parts))

    def load_packed(self, parts: list[Part]) -> QuantizedWeight | None:
        """The weights as the checkpoint packs them, where the backend keeps that format."""
        w = self._weights
        return w.quantized(self.backend, parts) if isinstance(w, CheckpointWeights) else None

    def load_linear(self, *parts: Part) -> Array | QuantizedWeight:
        """A Linear weight (out, in) for backend.linear: packed (see load_packed), else dense."""
        packed = self.load_packed(list(parts))
        return self.backend.prepare_linear(packed if packed is not None else self.load(*parts))

    def load_norm(self, name: str, size: int) -> Array:
        w = self.load((name, (size,)))
        return self.affine(w, 1.0, self.norm_weight_offset) if self.norm_weight_offset else w

    def affine(self, x: Array, scale: float, offset: float = 0.0) -> Array:
        """x * scale + offset in float32, stored back in the backend's dtype (bfloat16 is
        stored as uint16 bits, so arithmetic on the raw array would be wrong)."""
        return from_float32(to_float32(x) * np.float32(scale) + np.float32(offset), self.backend.dtype)

    def attention_parts(self, p: str) -> list[Part]:
        """The q, k, v projections, fused in this order. Phi-3 overrides (one tensor)."""
        c = self.config
        return [
            (p + f"self_attn.{n}_proj.weight", (size, c.hidden_size))
            for n, size in zip("qkv", (c.q_size, c.kv_size, c.kv_size))
        ]

    def mlp_parts(self, p: str) -> list[Part]:
        """gate and up of a dense MLP, fused as [gate | up]. Phi-3 overrides (one tensor)."""
        inter, dim = self.config.intermediate_size, self.config.hidden_size
        return [(p + "mlp.gate_proj.weight", (inter, dim)), (p + "mlp.up_proj.weight", (inter, dim))]

    def moe_names(self, p: str) -> tuple[str, tuple[str, str, str]]:
        """MoE families: (prefix of the router `gate` and of `experts.{e}`, names of each
        expert's gate, up and down projections)."""
        raise NotImplementedError(f"{type(self).__name__} has no experts")

    def load_moe(self, p: str) -> MoEWeights:
        c = self.config
        dim, inter = c.hidden_size, c.moe_intermediate_size
        m, (gate, up, down) = self.moe_names(p)
        experts = [f"{m}experts.{e}." for e in range(c.num_experts)]
        return MoEWeights.build(
            self.backend,
            # (E, dim), kept dense as llama.cpp keeps it: a small matrix whose top-k picks the experts
            router=self.backend.prepare_linear(self.load((m + "gate.weight", (c.num_experts, dim)))),
            gate_up=[
                self.load_linear((x + gate + ".weight", (inter, dim)), (x + up + ".weight", (inter, dim)))
                for x in experts
            ],  # E x (2 I, dim)
            down=[self.load_linear((x + down + ".weight", (dim, inter))) for x in experts],  # E x (dim, I)
        )

    def _load_layer(self, i: int) -> DecoderLayer:
        c, p, dim = self.config, f"model.layers.{i}.", self.config.hidden_size
        gemma = self.sandwich_norms
        moe = self.load_moe(p) if c.layer_is_moe(i) else None
        window, attn = c.layer_sliding_window(i), self.attention_parts(p)
        bias = [(name.removesuffix("weight") + "bias", shape[:1]) for name, shape in attn]
        return DecoderLayer(
            input_norm=self.load_norm(p + "input_layernorm.weight", dim),
            qkv=self.load_linear(*attn),
            qkv_bias=self.load(*bias) if c.attention_bias else None,
            q_norm=self.load_norm(p + "self_attn.q_norm.weight", c.head_dim) if self.qk_norm else None,
            k_norm=self.load_norm(p + "self_attn.k_norm.weight", c.head_dim) if self.qk_norm else None,
            o_proj=self.load_linear((p + "self_attn.o_proj.weight", (dim, c.q_size))),
            post_attn_norm=self.load_norm(p + "post_attention_layernorm.weight", dim) if gemma else None,
            pre_ffn_norm=self.load_norm(
                p + ("pre_feedforward_layernorm" if gemma else "post_attention_layernorm") + ".weight", dim
            ),
            post_ffn_norm=self.load_norm(p + "post_feedforward_layernorm.weight", dim) if gemma else None,
            gate_up=None if moe else self.load_linear(*self.mlp_parts(p)),
            down=None if moe else self.load_linear((p + "mlp.down_proj.weight", (dim, c.intermediate_size))),
            moe=moe,
            attn_opts=AttentionOptions(
                scale=(c.query_pre_attn_scalar or c.head_dim) ** -0.5,  # Gemma scales by its own constant
                sliding_window=window,
                soft_cap=c.attn_logit_softcapping,
            ),
            rope=1 if window and c.rope_local_theta is not None else 0,
        )

    def limit_positions(self, n: int) -> None:
        """Keep the rotary tables' first n positions (--max-model-len): a sequence never
        reaches past them, and a 128k-context model's full tables are 32-64 MB."""
        self.cos_sin = [t[:n].copy() if len(t) > n else t for t in self.cos_sin]

    def linear_weights(self) -> Iterator[tuple[str, Array | QuantizedWeight]]:
        """(name, weight) of every Linear weight backend.linear multiplies (not the
        embedding table, which is looked up; MoE routers stay dense by design)."""
        for i, layer in enumerate(self.layers):
            names = ("qkv", "o_proj", "gate_up", "down")
            yield from ((f"layers.{i}.{n}", getattr(layer, n)) for n in names if getattr(layer, n) is not None)
            if layer.moe is not None:
                for e, (gate_up, down) in enumerate(zip(layer.moe.gate_up, layer.moe.down)):
                    yield f"layers.{i}.experts.{e}.gate_up", gate_up
                    yield f"layers.{i}.experts.{e}.down", down
        yield "lm_head", self.lm_head

    def num_bytes(self) -> int:
        """Bytes held by the weights (a tied LM head counted once)."""
        arrays = [self.embed, self.norm]
        for layer in self.layers:
            arrays += [a for a in vars(layer).values() if hasattr(a, "nbytes")]
            if layer.moe is not None:
                arrays += layer.moe.arrays()
        if self.lm_head is not self.embed:
            arrays.append(self.lm_head)
        return sum(int(a.nbytes) for a in arrays)

    # --- forward ---------------------------------------------------------------------
    def activation(self, gate_up: Array) -> Array:
        """(T, 2 I) [gate | up] -> (T, I)."""
        if self.config.hidden_act == "gelu_pytorch_tanh":
            return self.backend.gelu_tanh_and_mul(gate_up)
        return self.backend.silu_and_mul(gate_up)

    def forward(self, batch: ForwardBatch, kv_caches: list[tuple[Array, Array]]) -> Array:
        """Returns the final hidden states of the rows in batch.logits_indices: (N, dim)."""
        c, b = self.config, self.backend
        h = self.input_embeddings(batch)  # (T, dim)
        residual = None
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            # attention block: x = norm(h + residual); h = o_proj(attn(rope(q), rope(k), v))
            if residual is None:
                residual, x = h, b.rms_norm(h, layer.input_norm, c.rms_norm_eps)
            else:
                x, residual = b.fused_add_rms_norm(h, residual, layer.input_norm, c.rms_norm_eps)
            h = self.attention(layer, x, batch, kv_cache)  # (T, dim)
            # feed-forward block: h = down(act(gate(x)) * up(x)), or a mixture of such experts
            x, residual = b.fused_add_rms_norm(h, residual, layer.pre_ffn_norm, c.rms_norm_eps)
            h = self.feed_forward(i, layer, x)  # (T, dim)

        # Only the rows we sample from need the final norm and the (large) LM head.
        if not batch.samples_every_row:
            h, residual = h[batch.logits_indices], residual[batch.logits_indices]
        x, _ = b.fused_add_rms_norm(h, residual, self.norm, c.rms_norm_eps)
        return x  # (N, dim)

    def input_embeddings(self, batch: ForwardBatch) -> Array:
        """(T, dim): each token's embedding (Gemma: times sqrt(dim)); a batch's image rows
        take their images' soft tokens instead, unscaled (encoded where the batch was built:
        models/gemma.py, rawpage/multimodal/mm_batch.py)."""
        h = self.embed_tokens(batch.input_ids)  # (T, dim)
        h = self.affine(h, self.config.hidden_size**0.5) if self.scale_embedding else h
        if batch.mm is not None:
            h[self.backend.asarray(batch.mm.rows, np.int32)] = self.backend.asarray(batch.mm.embeds)  # (M, dim)
        return h

    def attention(self, layer: DecoderLayer, x: Array, batch: ForwardBatch, kv_cache: tuple[Array, Array]) -> Array:
        """x (T, dim) -> o_proj(paged attention over the cache after writing this step's K/V): (T, dim)."""
        c, b = self.config, self.backend
        T, (H, Hkv, D, eps) = batch.num_tokens, (c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps)
        k_cache, v_cache = kv_cache
        qkv = b.linear(x, layer.qkv, layer.qkv_bias)  # (T, (H + 2 Hkv) * D)
        q = qkv[:, : H * D].reshape(T, H, D)
        k = qkv[:, H * D : (H + Hkv) * D].reshape(T, Hkv, D)
        v = qkv[:, (H + Hkv) * D :].reshape(T, Hkv, D)
        if layer.q_norm is not None:  # per head, before the rotation
            q = b.rms_norm(q.reshape(T * H, D), layer.q_norm, eps).reshape(T, H, D)
            k = b.rms_norm(k.reshape(T * Hkv, D), layer.k_norm, eps).reshape(T, Hkv, D)
        self.rotate(q, k, batch, layer)
        b.write_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        o = b.paged_attention(q, k_cache, v_cache, batch.attn, layer.attn_opts)  # (T, H, D), images both ways
        h = self.project_out(o.reshape(T, H * D), layer.o_proj)  # (T, dim)
        return h if layer.post_attn_norm is None else b.rms_norm(h, layer.post_attn_norm, eps)

    def rotate(self, q: Array, k: Array, batch: ForwardBatch, layer: DecoderLayer) -> None:
        """RoPE on q (T, H, D) and k (T, Hkv, D) in place, at batch.positions; Qwen2.5-VL's
        M-RoPE in a step with image rows, at their (t, h, w) positions (batch.mm.positions,
        rawpage/multimodal/mrope.py), each row with its own table row."""
        b, mm = self.backend, batch.mm
        if mm is None or mm.positions is None:
            b.rope(batch.positions, q, k, self.cos_sin[layer.rope], True)
            return
        table = mrope_cos_sin(b.to_numpy(self.cos_sin[layer.rope]), mm.positions, self.config.mrope_section)  # (T, D)
        b.rope(b.asarray(np.arange(len(table), dtype=np.int32), np.int32), q, k, b.asarray(table, np.float32), True)

    def feed_forward(self, i: int, layer: DecoderLayer, x: Array) -> Array:
        """x (T, dim) -> down(act(gate(x)) * up(x)), or the routed experts' sum: (T, dim)."""
        c, b = self.config, self.backend
        if layer.moe is not None:
            h = self.experts(i, layer, x)
        else:
            h = self.project_out(self.activation(b.linear(x, layer.gate_up)), layer.down)
        return h if layer.post_ffn_norm is None else b.rms_norm(h, layer.post_ffn_norm, c.rms_norm_eps)

    # The four methods below are where tensor parallelism adds its collectives (models/
    # sharding.py wraps them on a rank's model); in one process each is what it says.
    def embed_tokens(self, ids: Array) -> Array:
        """ids (T,) -> (T, dim)."""
        return self.backend.embedding(ids, self.embed)

    def project_out(self, x: Array, w: Array | QuantizedWeight) -> Array:
        """x (T, K) -> (T, dim): o_proj and down, the Linear layers that write back to the residual stream."""
        return self.backend.linear(x, w)

    def experts(self, i: int, layer: DecoderLayer, x: Array) -> Array:
        """x (T, dim) -> the weighted sum of the experts layer i routes each token to: (T, dim)."""
        c = self.config
        return moe_forward(
            self.backend, x, layer.moe, c.num_experts_per_tok, c.norm_topk_prob, self.activation, self.expert_tokens[i]
        )

    def compute_logits(self, hidden: Array) -> Array | None:
        """(N, dim) -> (N, V) float32 logits (under tensor parallelism on rank 0 only, None
        elsewhere). Gemma 2 soft-caps them: cap * tanh(logits / cap)."""
        logits = self.backend.logits(hidden, self.lm_head)
        cap = self.config.final_logit_softcapping
        if cap:  # (np.tanh is a ufunc: on CuPy arrays it runs on the GPU)
            logits = from_float32(cap * np.tanh(to_float32(logits) / np.float32(cap)), self.backend.dtype)
        return logits
