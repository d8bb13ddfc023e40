"""Tiny random Llama-family models, written to disk as a Hugging Face folder and as a GGUF.

Everything here is written independently of rawpage's loaders: the GGUF side
applies llama.cpp's q/k permutation itself and uses the `gguf` package's writer,
so loading both files and comparing logits tests the readers end to end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Hello world! Numbers 0123456789 and symbols #$%&*().",
    "日本語のテキストと中文字符 with emoji 😀🎉🚀 and accents: café, naïve, Ünïcödé.",
    "    indented code:\n\tdef f(x):\n\t\treturn x * 2\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5-Coder's fill-in-the-middle tokens (train_tokenizer(fim=True))
FIM_SPECIAL = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(vocab_size: int = 400, fim: bool = False) -> Tokenizer:
    """A small byte-level BPE, GPT-2 style, with chat special tokens at ids 0..2 (and with
    fim, Qwen2.5-Coder's FIM tokens at ids 3..8)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL + (FIM_SPECIAL if fim else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT, trainer)
    return tok


# The shapes of conftest's tiny_model_dir Llama (4 layers, dim 128), shared by the
# fixtures that write it in another format.
TINY_LLAMA = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
)


def tiny_config(arch: str = "llama", **overrides) -> dict:
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 400,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    cfg.update(overrides)
    return cfg


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 weights, scaled so activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    dim, inter, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = (
        cfg["num_attention_heads"] * cfg["head_dim"],
        cfg["num_key_value_heads"] * cfg["head_dim"],
    )

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, dim), "model.norm.weight": 1 + 0.1 * w(dim)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = w(V, dim)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * w(dim)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * w(dim)
        t[p + "self_attn.q_proj.weight"] = w(q, dim)
        t[p + "self_attn.k_proj.weight"] = w(kv, dim)
        t[p + "self_attn.v_proj.weight"] = w(kv, dim)
        t[p + "self_attn.o_proj.weight"] = w(dim, q)
        t[p + "mlp.gate_proj.weight"] = w(inter, dim)
        t[p + "mlp.up_proj.weight"] = w(inter, dim)
        t[p + "mlp.down_proj.weight"] = w(dim, inter)
        if cfg["model_type"] == "qwen2":
            for name, n in (("q", q), ("k", kv), ("v", kv)):
                t[p + f"self_attn.{name}_proj.bias"] = w(n)
    return t


def write_hf_folder(folder: str, cfg: dict, tensors: dict, tok: Tokenizer, shards: int = 1) -> str:
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    names = sorted(tensors)
    for s in range(shards):
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, os.path.join(folder, f"model-{s + 1:05d}-of-{shards:05d}.safetensors"))
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "chat_template": CHAT_TEMPLATE}, f)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.7, "top_p": 0.9, "eos_token_id": 2}, f)
    return folder


def write_bf16_safetensors(path: str, tensors: dict) -> None:
    """Every tensor as BF16 (truncated), one file: safetensors.numpy cannot write
    bfloat16, so the file is built by hand."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        bits = (t.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncate to bf16
        header[name] = {
            "dtype": "BF16",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + bits.nbytes],
        }
        blobs.append(bits.tobytes())
        offset += bits.nbytes
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf q/k permutation: [half, D/2] -> [D/2, half] rows per head."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # Phi-3
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3: [gate | up]
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
}
_GGUF_GEMMA_LAYER = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
# Hugging Face names each expert's matrices; GGUF stacks a layer's experts: (E, rows, cols).
_GGUF_EXPERTS = {
    "w1": "ffn_gate_exps",
    "gate_proj": "ffn_gate_exps",
    "w3": "ffn_up_exps",
    "up_proj": "ffn_up_exps",
    "w2": "ffn_down_exps",
    "down_proj": "ffn_down_exps",
}


def write_gguf(
    path: str,
    cfg: dict,
    tensors: dict,
    tok: Tokenizer,
    qtype: str = "F32",
    rope_freqs: np.ndarray | None = None,
    raw: dict | None = None,
    extra_metadata: Callable[[Any], None] | None = None,
    control: tuple[str, ...] = (),
    chat_template: str = CHAT_TEMPLATE,
) -> str:
    """Write the model as llama.cpp would: permuted q/k (llama), matrices in `qtype`,
    each layer's experts stacked (Mixtral is `llama` with experts). extra_metadata(writer)
    adds keys of its own (YaRN's, FIM token ids); control: more tokens typed as control
    (special) ones, as Gemma 3's image tokens are.

    raw: {gguf tensor name: (uint8 blocks, ggml type name)} written as given instead."""
    import gguf

    arch = {"mixtral": "llama", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3"}.get(
        cfg["model_type"], cfg["model_type"]
    )
    w = gguf.GGUFWriter(path, arch)
    gemma = arch.startswith("gemma")
    if gemma:  # llama.cpp keeps these in the metadata, and stores each norm as the 1 + w it scales by
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern(cfg.get("sliding_window_pattern", 2))
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if (cfg.get("rope_scaling") or {}).get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
        tensors = {n: t + 1.0 if n.endswith("norm.weight") else t for n, t in tensors.items()}
    if arch == "phi3":  # LongRoPE: the factors as tensors, the lengths in the metadata
        rs = cfg["rope_scaling"]
        w.add_sliding_window(cfg["sliding_window"])
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
        w.add_tensor("rope_factors_long.weight", np.array(rs["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rs["short_factor"], np.float32))
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if "norm_topk_prob" in cfg:
            w.add_expert_weights_norm(cfg["norm_topk_prob"])
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_name("tiny")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(tok.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp's name (it refuses "gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL or t in FIM_SPECIAL or t in control else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)
    if extra_metadata is not None:
        extra_metadata(w)
    q_type = getattr(gguf.GGMLQuantizationType, qtype)
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name, t in tensors.items():
        if ".experts." in name:  # model.layers.{i}.<moe>.experts.{e}.<proj>.weight
            i, e, proj = name.split(".")[2], int(name.split(".")[-3]), name.split(".")[-2]
            stacks.setdefault(f"blk.{i}.{_GGUF_EXPERTS[proj]}.weight", {})[e] = t
            continue
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers.") :].split(".", 1)
            gname = f"blk.{i}.{(_GGUF_GEMMA_LAYER if gemma else {}).get(rest) or _GGUF_LAYER[rest]}"
            if arch == "llama" and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                heads = cfg["num_attention_heads"] if "q_proj" in rest else cfg["num_key_value_heads"]
                t = llama_cpp_permute(t, heads)
        else:
            gname = {
                "model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight",
            }[name]
        if raw and gname in raw:
            blocks, raw_type = raw[gname]
            w.add_tensor(gname, blocks, raw_dtype=getattr(gguf.GGMLQuantizationType, raw_type))
        elif t.ndim == 2 and qtype != "F32":
            w.add_tensor(gname, gguf.quants.quantize(t, q_type), raw_dtype=q_type)
        else:
            w.add_tensor(gname, t)
    for gname, by_expert in stacks.items():
        stack = np.stack([by_expert[e] for e in sorted(by_expert)])  # (E, rows, cols)
        if qtype == "F32" or stack.shape[-1] % gguf.GGML_QUANT_SIZES[q_type][0]:
            w.add_tensor(gname, stack)  # rows that are not whole blocks stay float, as llama.cpp leaves them
        else:  # each row's blocks, as llama.cpp quantizes a stacked expert tensor
            w.add_tensor(gname, gguf.quants.quantize(stack, q_type), raw_dtype=q_type)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# A Qwen3-style reasoning template: the prompt opens the think block (as Qwen3-Thinking's
# does) unless enable_thinking is false, when it closes it (as hybrid Qwen3's does); an
# earlier turn's reasoning_content is written back inside its block.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
THINK_TAGS = ["<think>", "</think>"]


def write_thinking_model(folder: str, template: str = THINKING_TEMPLATE) -> str:
    """A tiny random Llama whose vocabulary has <think> and </think> as single tokens (added,
    not special: decoded text keeps them, as Qwen3's does), with a Qwen3-style template."""
    from tokenizers import AddedToken

    tok = train_tokenizer()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    cfg = tiny_config(**{**TINY_LLAMA, "vocab_size": 416})
    write_hf_folder(folder, cfg, random_tensors(cfg, seed=3), tok)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "chat_template": template}, f)
    return folder
