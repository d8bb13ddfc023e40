"""Load a GGUF file: metadata -> ModelConfig, tensors -> HF names, dequantized to float32.

GGUF (llama.cpp's format) keeps everything in one file: hyperparameters under
`{arch}.*`, the tokenizer under `tokenizer.ggml.*`, and tensors in ggml's block
formats. We read it with the `gguf` package and dequantize at load time.
"""

from __future__ import annotations

import numpy as np

from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.loader.gguf_reader import GGUFTensorInfo, read_gguf
from rawpage.loader.tensors import TensorSource
from rawpage.ops.gguf_linear import GGUF_BLOCKS
from rawpage.quantization.weight import QuantizedWeight

SUPPORTED_TENSOR_TYPES = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"}
# Block formats that sim and cuda keep quantized on the device (ops/gguf_linear.py).
KEPT_QUANTIZED = set(GGUF_BLOCKS)
SUPPORTED_ARCHITECTURES = {"llama", "qwen2"}

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
}


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation, back to Hugging Face's rotary layout.

    This is the one place where the two layouts meet. Hugging Face's Llama rotates
    pairs (j, j + D/2) inside each head ("NeoX" style). llama.cpp rotates adjacent
    pairs (2j, 2j + 1) ("GPT-J" style), so when it converts a Llama checkpoint it
    reorders the rows of q_proj and k_proj within each head from
    [half, D/2] to [D/2, half]. We reorder them back, so every backend runs one
    rotary convention (NeoX) for every checkpoint. Qwen2 GGUFs are not permuted.

    w: (n_heads * D, in) weight or (n_heads * D,) bias, GGUF row order.
    """
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


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
        self.config = self._config()
        self.tensors = self._tensor_source()

    def _config(self) -> ModelConfig:
        m, a = self.meta, self.arch
        try:
            heads = int(m[f"{a}.attention.head_count"])
            dim = int(m[f"{a}.embedding_length"])
            kv_heads = m.get(f"{a}.attention.head_count_kv", heads)
            vocab = m.get(f"{a}.vocab_size") or len(m["tokenizer.ggml.tokens"])
            cfg = ModelConfig(
                architecture=a,
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
            )
        except KeyError as e:
            raise ModelLoadError(f"{self.path}: GGUF metadata lacks {e.args[0]!r}") from None
        return cfg

    def _tensor_source(self) -> TensorSource:
        from gguf import GGMLQuantizationType

        readers, quantized = {}, {}
        for t in self.tensor_infos:
            qtype = GGMLQuantizationType(t.ggml_type).name
            if qtype not in SUPPORTED_TENSOR_TYPES:
                raise UnsupportedModelError(
                    f"{self.path}: tensor {t.name!r} has GGUF type {qtype}, which rawpage "
                    f"does not dequantize (supported: {', '.join(sorted(SUPPORTED_TENSOR_TYPES))})"
                )
            name = self._hf_name(t.name)
            if name is not None:
                readers[name] = lambda t=t: self._read(t)
                if qtype in KEPT_QUANTIZED and len(t.shape) == 2:
                    quantized[name] = lambda t=t, qtype=qtype: self._read_blocks(t, qtype)
        return TensorSource(readers, quantized)

    def _hf_name(self, name: str) -> str | None:
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name]
        if name == "rope_freqs.weight":  # Llama 3 rope scaling, as frequency divisors
            return "rope_freqs"
        parts = name.split(".", 2)
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
            return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
        return None  # tensors we do not use (e.g. precomputed rope tables)

    def _read_blocks(self, t: GGUFTensorInfo, qtype: str) -> QuantizedWeight:
        """A matrix as its rows of blocks, copied out of the mapping: (rows, row_bytes) uint8."""
        raw = np.array(self._data[t.offset : t.offset + t.nbytes].reshape(t.shape[0], -1))
        return QuantizedWeight("gguf", (t.shape[0], t.shape[1]), self._unpermute(t.name, raw), qtype)

    def _unpermute(self, name: str, w: np.ndarray) -> np.ndarray:
        """Rows of q/k (float values or whole rows of blocks) back to Hugging Face's order."""
        if self.arch == "llama":
            if name.endswith(("attn_q.weight", "attn_q.bias")):
                return unpermute_qk(w, self.config.num_heads)
            if name.endswith(("attn_k.weight", "attn_k.bias")):
                return unpermute_qk(w, self.config.num_kv_heads)
        return w

    def _read(self, t: GGUFTensorInfo) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        rows = int(np.prod(t.shape[:-1], dtype=np.int64))
        raw = self._data[t.offset : t.offset + t.nbytes].reshape(rows, -1)  # (rows, bytes per row)
        w = dequantize(raw, GGMLQuantizationType(t.ggml_type)).astype(np.float32, copy=False)
        return self._unpermute(t.name, w.reshape(t.shape))
