"""Load a GGUF file: metadata -> ModelConfig, tensors -> HF names, in their blocks.

GGUF (llama.cpp's format) keeps everything in one file: hyperparameters under
`{arch}.*`, the tokenizer under `tokenizer.ggml.*`, and tensors in ggml's block
formats. Every format of rawpage/quantization/gguf.py's table is kept in its blocks
for the backends that read them (each backend says which: keeps_quantized); any
tensor can also be read dequantized to float32 (the NumPy path, norms, biases).
"""

from __future__ import annotations

import numpy as np

from rawpage.config import ModelConfig, long_context
from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.loader.gguf_reader import GGUFTensorInfo, ggml_type_name, read_gguf
from rawpage.loader.tensors import TensorSource
from rawpage.quantization.gguf import GGUF_BLOCKS, gguf_dequantize_ref
from rawpage.quantization.weight import QuantizedWeight

# Block formats kept in their blocks (quantization/gguf.py FORMATS), and the float ones;
# F16 and BF16 matrices are offered as stored too (QuantizedWeight kinds "f16", "bf16").
KEPT_QUANTIZED = set(GGUF_BLOCKS)
STORED_16_BIT = {"F16": "f16", "BF16": "bf16"}
SUPPORTED_TENSOR_TYPES = KEPT_QUANTIZED | {"F32", "F16", "BF16"}
# llama with experts is Mixtral
SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "qwen2vl", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3"}

# GGUF tensor name -> Hugging Face name. `{i}` is the layer index.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# Phi-3 keeps q, k, v in one tensor and gate, up in another ([gate | up]), and so do we.
_PHI3_LAYER_NAMES = {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# Gemma's four norms a layer: ffn_norm is the one before the MLP, as in Llama.
_GEMMA_LAYER_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# Mixture of experts: GGUF stacks the experts of a layer in one (E, rows, cols) tensor;
# Hugging Face names each expert's matrix. family -> (router name, {GGUF stack: HF name}).
_MOE_NAMES = {
    "mixtral": (
        "block_sparse_moe.gate.weight",
        {
            "ffn_gate_exps.weight": "block_sparse_moe.experts.{e}.w1.weight",
            "ffn_up_exps.weight": "block_sparse_moe.experts.{e}.w3.weight",
            "ffn_down_exps.weight": "block_sparse_moe.experts.{e}.w2.weight",
        },
    ),
    "qwen3_moe": (
        "mlp.gate.weight",
        {
            "ffn_gate_exps.weight": "mlp.experts.{e}.gate_proj.weight",
            "ffn_up_exps.weight": "mlp.experts.{e}.up_proj.weight",
            "ffn_down_exps.weight": "mlp.experts.{e}.down_proj.weight",
        },
    ),
}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation, back to Hugging Face's rotary layout.

    This is the one place where the two layouts meet. Hugging Face's Llama rotates
    pairs (j, j + D/2) inside each head ("NeoX" style). llama.cpp rotates adjacent
    pairs (2j, 2j + 1) ("GPT-J" style), so when it converts a Llama checkpoint it
    reorders the rows of q_proj and k_proj within each head from
    [half, D/2] to [D/2, half]. We reorder them back, so every backend runs one
    rotary convention (NeoX) for every checkpoint. Qwen2 and Qwen3 GGUFs are not permuted.

    w: (n_heads * D, in) weight or (n_heads * D,) bias, GGUF row order.
    """
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# llama.cpp's {arch}.rope.scaling.yarn_* keys, and the rope_scaling names models/rotary.py reads
YARN_KEYS = [("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")]
YARN_KEYS += [("yarn_ext_factor", "extrapolation_factor"), ("yarn_attn_factor", "attn_factor")]


class GGUFCheckpoint:
    """An opened GGUF file: its config, its tensors (lazy) and its raw metadata."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.meta, self.tensor_infos, self._data = read_gguf(path)
        arch = self.meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{path}: unsupported GGUF architecture {arch!r}; rawpage runs "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        self.arch = arch
        self.family = {"qwen3moe": "qwen3_moe", "qwen2vl": "qwen2"}.get(arch, arch)  # qwen2vl: Qwen2 with M-RoPE
        if arch == "llama" and self.meta.get("llama.expert_count"):
            self.family = "mixtral"
        self.config = self._config()

    def _config(self) -> ModelConfig:
        m, a = self.meta, self.arch
        try:
            heads = int(m[f"{a}.attention.head_count"])
            dim = int(m[f"{a}.embedding_length"])
            kv_heads = m.get(f"{a}.attention.head_count_kv", heads)
            vocab = m.get(f"{a}.vocab_size") or len(m["tokenizer.ggml.tokens"])
            experts = int(m.get(f"{a}.expert_count", 0))
            cfg = ModelConfig(
                architecture=self.family,
                hidden_size=dim,
                num_layers=int(m[f"{a}.block_count"]),
                num_heads=heads,
                num_kv_heads=int(kv_heads),
                head_dim=int(m.get(f"{a}.attention.key_length", dim // heads)),
                intermediate_size=int(m[f"{a}.feed_forward_length"]),
                vocab_size=int(vocab),
                rms_norm_eps=float(m.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)),
                rope_theta=float(m.get(f"{a}.rope.freq_base", 10000.0)),
                max_position_embeddings=int(m.get(f"{a}.context_length", 4096)),
                tie_word_embeddings=not any(t.name == "output.weight" for t in self.tensor_infos),
                attention_bias=any(t.name.endswith("attn_q.bias") for t in self.tensor_infos),
                bos_token_id=m.get("tokenizer.ggml.bos_token_id"),
                eos_token_ids=[m["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in m else [],
                torch_dtype="float16",
                name=str(m.get("general.name", "")),
                num_experts=experts,
                num_experts_per_tok=int(m.get(f"{a}.expert_used_count", 0)),
                moe_intermediate_size=int(m.get(f"{a}.expert_feed_forward_length", m[f"{a}.feed_forward_length"])),
                norm_topk_prob=bool(m.get(f"{a}.expert_weights_norm", True)),
                mlp_only_layers=self._dense_layers(int(m[f"{a}.block_count"])) if experts else [],
            )
            self._rope_scaling(cfg)
            if a == "qwen2vl":  # [t, h, w, 0]: the frequency pairs of each M-RoPE position
                cfg.mrope_section = [int(x) for x in m[f"{a}.rope.dimension_sections"]][:3]
            if self.family in ("gemma2", "gemma3"):
                self._gemma_config(cfg)
            if self.family == "phi3":
                self._phi3_config(cfg)
        except KeyError as e:
            raise ModelLoadError(f"{self.path}: GGUF metadata lacks {e.args[0]!r}") from None
        return cfg

    def _gemma_config(self, cfg: ModelConfig) -> None:
        """What a Gemma GGUF says, or leaves to llama.cpp's code, about Gemma's differences."""
        m, a, n = self.meta, self.arch, cfg.num_layers
        cfg.hidden_act = "gelu_pytorch_tanh"
        cfg.sliding_window = m.get(f"{a}.attention.sliding_window")
        pattern = m.get(f"{a}.attention.sliding_window_pattern", 2 if a == "gemma2" else 6)
        if isinstance(pattern, list):  # one flag per layer: true = sliding
            cfg.layer_types = ["sliding_attention" if x else "full_attention" for x in pattern]
        else:
            cfg.layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        cfg.attn_logit_softcapping = m.get(f"{a}.attn_logit_softcapping")
        cfg.final_logit_softcapping = m.get(f"{a}.final_logit_softcapping")
        # query_pre_attn_scalar is not in the file. llama.cpp scales by head_dim**-0.5, except
        # for the 27B models (46 and 62 layers), whose config has hidden / heads instead.
        big = (a, n) in (("gemma2", 46), ("gemma3", 62))
        cfg.query_pre_attn_scalar = cfg.hidden_size / cfg.num_heads if big else cfg.head_dim
        if a == "gemma3":
            cfg.rope_local_theta = float(m.get(f"{a}.rope.freq_base_swa", 10000.0))  # the sliding layers' base

    def _rope_scaling(self, cfg: ModelConfig) -> None:
        """{arch}.rope.scaling.*: linear, or YaRN with its original length and (newer
        converters) its betas and factors. Llama 3's scaling comes as the rope_freqs
        tensor instead, and Phi-3's LongRoPE as two tensors (_phi3_config)."""
        m, a = self.meta, self.arch
        kind = m.get(f"{a}.rope.scaling.type")
        factor = m.get(f"{a}.rope.scaling.factor") or (
            1 / m[f"{a}.rope.scale_linear"] if f"{a}.rope.scale_linear" in m else None
        )
        if kind in (None, "none") and factor is None or kind == "longrope":
            return
        if kind not in (None, "linear", "yarn"):
            raise UnsupportedModelError(f"{self.path}: unsupported {a}.rope.scaling.type {kind!r} (linear, yarn)")
        if not factor or factor == 1.0:
            return
        if kind != "yarn":
            cfg.rope_scaling = {"rope_type": "linear", "factor": float(factor)}
            return
        if m.get(f"{a}.rope.scaling.yarn_log_multiplier"):
            raise UnsupportedModelError(f"{self.path}: YaRN with a yarn_log_multiplier (DeepSeek's) is not supported")
        rs = {"rope_type": "yarn", "factor": float(factor)}
        if f"{a}.rope.scaling.original_context_length" in m:
            rs["original_max_position_embeddings"] = int(m[f"{a}.rope.scaling.original_context_length"])
        given = {ours: float(m[f"{a}.rope.scaling.{k}"]) for k, ours in YARN_KEYS if f"{a}.rope.scaling.{k}" in m}
        rs.update({k: v for k, v in given.items() if v >= 0})  # llama.cpp's -1: its default
        cfg.rope_scaling, cfg.max_position_embeddings = long_context(rs, cfg.max_position_embeddings)

    def _phi3_config(self, cfg: ModelConfig) -> None:
        """Phi-3's window, and its LongRoPE factors, which llama.cpp stores as two tensors."""
        m, a = self.meta, self.arch
        cfg.sliding_window = m.get(f"{a}.attention.sliding_window")
        infos = {t.name: t for t in self.tensor_infos}
        if "rope_factors_long.weight" in infos:
            cfg.rope_scaling = {
                "rope_type": "longrope",
                "short_factor": self._read(infos["rope_factors_short.weight"]).tolist(),
                "long_factor": self._read(infos["rope_factors_long.weight"]).tolist(),
                "original_max_position_embeddings": int(m[f"{a}.rope.scaling.original_context_length"]),
                "attention_factor": m.get(f"{a}.rope.scaling.attn_factor"),
            }

    def _dense_layers(self, n_layers: int) -> list[int]:
        """Layers of an MoE model that have no router, hence a dense MLP."""
        routed = {t.name.split(".")[1] for t in self.tensor_infos if t.name.endswith("ffn_gate_inp.weight")}
        return [i for i in range(n_layers) if str(i) not in routed]

    def tensor_source(self) -> TensorSource:
        """The tensors under Hugging Face names, read lazily from the file. Not kept on
        self: its readers hold self, and a cycle would keep the file mapped (and resident)
        until the garbage collector ran; without one, the mapping goes with the last reader."""
        readers, quantized, kinds = {}, {}, {}
        for t in self.tensor_infos:
            qtype = ggml_type_name(t.ggml_type)
            if qtype not in SUPPORTED_TENSOR_TYPES:
                raise UnsupportedModelError(
                    f"{self.path}: tensor {t.name!r} has GGUF type {qtype}, which rawpage does not read "
                    f"(it reads {', '.join(sorted(SUPPORTED_TENSOR_TYPES))}; llama-quantize can "
                    f"requantize the file to one of them, e.g. Q4_K_M)"
                )
            if t.name.endswith("_exps.weight"):  # one reader per expert, each of its own rows
                for e in range(t.shape[0]):
                    name = self._hf_expert_name(t.name, e)
                    readers[name] = lambda t=t, e=e: self._read(t, e)
                    if qtype in KEPT_QUANTIZED or qtype in STORED_16_BIT:
                        quantized[name] = lambda t=t, qtype=qtype, e=e: self._read_stored(t, qtype, e)
                        kinds[name] = STORED_16_BIT.get(qtype, "gguf")
                continue
            name = self._hf_name(t.name)
            if name is not None:
                readers[name] = lambda t=t: self._read(t)
                if (qtype in KEPT_QUANTIZED or qtype in STORED_16_BIT) and len(t.shape) == 2:
                    quantized[name] = lambda t=t, qtype=qtype: self._read_stored(t, qtype)
                    kinds[name] = STORED_16_BIT.get(qtype, "gguf")
        return TensorSource(readers, quantized, kinds)

    def _hf_expert_name(self, name: str, e: int) -> str:
        _, layer, stack = name.split(".", 2)
        if self.family not in _MOE_NAMES or stack not in _MOE_NAMES[self.family][1]:
            raise UnsupportedModelError(f"{self.path}: expert tensor {name!r} in a {self.arch!r} GGUF is not supported")
        return f"model.layers.{layer}." + _MOE_NAMES[self.family][1][stack].format(e=e)

    def _hf_name(self, name: str) -> str | None:
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name]
        if name == "rope_freqs.weight":  # Llama 3 rope scaling, as frequency divisors
            return "rope_freqs"
        parts = name.split(".", 2)
        if parts[0] != "blk" or len(parts) != 3:
            return None
        layer, rest = parts[1], parts[2]
        family_names = {"phi3": _PHI3_LAYER_NAMES, "gemma2": _GEMMA_LAYER_NAMES, "gemma3": _GEMMA_LAYER_NAMES}
        hf = family_names.get(self.family, {}).get(rest) or _LAYER_NAMES.get(rest)
        if rest == "ffn_gate_inp.weight" and self.family in _MOE_NAMES:
            hf = _MOE_NAMES[self.family][0]  # the router
        if hf is not None:
            return f"model.layers.{layer}.{hf}"
        return None  # tensors we do not use (e.g. precomputed rope tables)

    def _read_stored(self, t: GGUFTensorInfo, qtype: str, expert: int | None = None) -> QuantizedWeight:
        """A matrix as stored: its rows of blocks (rows, row_bytes) uint8, or an F16 /
        BF16 one's (rows, cols) uint16 bits; of a stacked (E, rows, cols) expert tensor,
        one expert's rows. A view of the mapping (q and k of Llama: a copy, unpermuted):
        the backend's prepare_linear makes what it keeps (panels, an upload, a dense copy)."""
        rows, e = t.shape[-2], expert or 0
        raw = self._data[t.offset : t.offset + t.nbytes].reshape(int(np.prod(t.shape[:-1])), -1)
        raw = self._unpermute(t.name, raw[e * rows : (e + 1) * rows])
        if qtype in STORED_16_BIT:
            return QuantizedWeight(STORED_16_BIT[qtype], (rows, t.shape[-1]), raw.view(np.uint16))
        return QuantizedWeight("gguf", (rows, t.shape[-1]), raw, qtype)

    def _unpermute(self, name: str, w: np.ndarray) -> np.ndarray:
        """Rows of q/k (float values or whole rows of blocks) back to Hugging Face's order."""
        if self.arch == "llama":
            if name.endswith(("attn_q.weight", "attn_q.bias")):
                return unpermute_qk(w, self.config.num_heads)
            if name.endswith(("attn_k.weight", "attn_k.bias")):
                return unpermute_qk(w, self.config.num_kv_heads)
        return w

    def _read(self, t: GGUFTensorInfo, expert: int | None = None) -> np.ndarray:
        """The tensor in float32; of a stacked (E, rows, cols) expert tensor, one expert's matrix."""
        w = read_float32(self._data, t, expert)
        if self.family in ("gemma2", "gemma3") and t.name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's norms as the 1 + w they scale by
        return self._unpermute(t.name, w)  # llama.cpp permutes Llama's (and Mixtral's) q and k rows


_FLOAT_READERS = {  # (rows, bytes) uint8 -> (rows, values) float32, new arrays
    "F32": lambda raw: raw.view("<f4").astype(np.float32),
    "F16": lambda raw: raw.view("<f2").astype(np.float32),
    "BF16": lambda raw: (raw.view("<u2").astype(np.uint32) << 16).view(np.float32),
}


def read_float32(data: np.ndarray, t: GGUFTensorInfo, expert: int | None = None) -> np.ndarray:
    """A GGUF tensor (data: the file's data section) in float32, a copy; of a stacked
    (E, rows, cols) expert tensor, one expert's matrix."""
    qtype = ggml_type_name(t.ggml_type)
    if qtype not in SUPPORTED_TENSOR_TYPES:
        raise UnsupportedModelError(f"tensor {t.name!r} has GGUF type {qtype}, which rawpage does not read")
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    raw = data[t.offset : t.offset + t.nbytes].reshape(rows, -1)  # (rows, bytes per row)
    shape = t.shape
    if expert is not None:
        n = t.shape[1]
        raw, shape = raw[expert * n : (expert + 1) * n], t.shape[1:]
    if qtype in KEPT_QUANTIZED:  # our own reference dequantizer (held to gguf's in the tests)
        w = gguf_dequantize_ref(raw, qtype, (raw.shape[0], shape[-1]))
    else:  # F32, F16, BF16 (little-endian); a copy, never a view of the mapping (a norm
        # that views it keeps the whole file mapped, and resident, while the model lives)
        w = _FLOAT_READERS[qtype](np.ascontiguousarray(raw))
    return w.reshape(shape)
