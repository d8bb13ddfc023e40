"""A tiny random Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration), as a Hugging Face
folder laid out as Qwen/Qwen2.5-VL-3B-Instruct is on the Hub: the text part under
model.* (its config at the top level, rope_scaling {"type": "mrope", ...}), the ViT and
merger under visual.*, a preprocessor_config.json (Qwen2VLImageProcessor's min_pixels /
max_pixels) and a tokenizer with Qwen's vision tokens.

Sizes are chosen so that the recorded images exercise the processor and the ViT: 4-pixel
patches merged 2 x 2 (so sides are multiples of 8), a max_pixels that one image is
scaled down to, window attention over 2 x 2 merged tokens (16 pixels) with windows cut
short at the edges, and two of the four blocks attending over the whole image.

Written without rawpage's code (weights drawn with NumPy from a seed, per tensor name);
tools/make_golden_vlm.py --family qwen2_5_vl records transformers' outputs of this very
folder into tests/data/golden_qwen25vl.json.
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from tests.tiny_families import hub_tensors
from tests.tiny_models import SPECIAL, tiny_config, train_tokenizer
from tests.tiny_vlm import close_mmproj, open_mmproj, write_vlm_folder

IMAGE_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|image_pad|>"]  # ids 396 .. 399
VISION_START, VISION_END, VIDEO_PAD, IMAGE_PAD = 396, 397, 398, 399

# Qwen2.5-VL's template, shortened: an image part becomes <|vision_start|><|image_pad|><|vision_end|>,
# whose <|image_pad|> the processor (and rawpage) repeats once per soft token of that image.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VISION = {
    "model_type": "qwen2_5_vl",
    "depth": 4,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "hidden_act": "silu",
    "in_channels": 3,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 16,  # 16 / 4 / 2 = windows of 2 x 2 merged tokens
    "fullatt_block_indexes": [1, 3],
    "tokens_per_second": 2,
    "out_hidden_size": 64,
}
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
    "min_pixels": 256,
    "max_pixels": 1600,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}  # the keys the Hub's Qwen2.5-VL preprocessor_config.json has: bicubic, rescale and normalize by default


def qwen_vl_config() -> dict:
    text = tiny_config("qwen2", rms_norm_eps=1e-6, pad_token_id=0, max_position_embeddings=256)
    del text["head_dim"]  # Qwen2.5-VL's config has none: hidden_size / heads = 16
    return {
        **text,
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},  # sums to 16 / 2
        "use_sliding_window": False,
        "sliding_window": 256,
        "max_window_layers": 2,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "vision_config": dict(VISION),
        "image_token_id": IMAGE_PAD,
        "video_token_id": VIDEO_PAD,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
    }


def text_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """The Qwen2 text part under model.* and lm_head, with the q, k, v biases Qwen2 has."""
    D = cfg["hidden_size"] // cfg["num_attention_heads"]
    t = hub_tensors({**cfg, "model_type": "qwen2", "head_dim": D}, seed)
    for i in range(cfg["num_hidden_layers"]):
        H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        for n, heads in (("q", H), ("k", Hkv), ("v", Hkv)):
            name = f"model.layers.{i}.self_attn.{n}_proj.bias"
            t[name] = (0.1 * _draw(seed, name, (heads * D,))).astype(np.float32)
    return t


def _draw(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(shape)


def vision_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Hub-named float32 weights of the ViT and the patch merger (visual.*)."""
    v = cfg["vision_config"]
    h, inter, p, tp = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
    unit = h * v["spatial_merge_size"] ** 2
    t: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (h, 3, tp, p, p),
        "visual.merger.ln_q.weight": (h,),
        "visual.merger.mlp.0.weight": (unit, unit),
        "visual.merger.mlp.0.bias": (unit,),
        "visual.merger.mlp.2.weight": (v["out_hidden_size"], unit),
        "visual.merger.mlp.2.bias": (v["out_hidden_size"],),
    }
    for i in range(v["depth"]):
        q = f"visual.blocks.{i}."
        t[q + "norm1.weight"], t[q + "norm2.weight"] = (h,), (h,)
        t[q + "attn.qkv.weight"], t[q + "attn.qkv.bias"] = (3 * h, h), (3 * h,)
        t[q + "attn.proj.weight"], t[q + "attn.proj.bias"] = (h, h), (h,)
        for n in ("gate_proj", "up_proj"):
            t[q + f"mlp.{n}.weight"], t[q + f"mlp.{n}.bias"] = (inter, h), (inter,)
        t[q + "mlp.down_proj.weight"], t[q + "mlp.down_proj.bias"] = (h, inter), (h,)
    out = {}
    for name, shape in sorted(t.items()):
        x = _draw(seed, name, shape)
        if len(shape) >= 2:
            x = x / np.sqrt(np.prod(shape[1:]))
        elif name.endswith("bias"):
            x = 0.1 * x
        else:  # RMSNorm weights, near 1
            x = 0.1 * x + 1.0
        out[name] = x.astype(np.float32)
    return out


def qwen_vl_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    return {**text_tensors(cfg, seed), **vision_tensors(cfg, seed)}


def qwen_vl_tokenizer():
    tok = train_tokenizer(396)
    tok.add_special_tokens(IMAGE_TOKENS)
    assert [tok.token_to_id(t) for t in IMAGE_TOKENS] == [VISION_START, VISION_END, VIDEO_PAD, IMAGE_PAD]
    return tok


def write_qwen_vl(folder: str, seed: int = 0) -> str:
    """The tiny Qwen2.5-VL as a Hugging Face folder."""
    cfg = qwen_vl_config()
    tok_cfg = {"bos_token": None, "eos_token": SPECIAL[2], "chat_template": CHAT_TEMPLATE}
    return write_vlm_folder(folder, cfg, qwen_vl_tensors(cfg, seed), qwen_vl_tokenizer(), tok_cfg, PREPROCESSOR)


# the metadata convert_hf_to_gguf.py --mmproj writes for Qwen2.5-VL (MmprojModel's and
# Qwen2VLVisionModel's set_gguf_parameters), besides general.* (name, file type, type)
MMPROJ_KEYS = {
    "clip.has_vision_encoder",
    "clip.projector_type",
    "clip.use_silu",
    *(
        "clip.vision." + k
        for k in (
            "projection_dim image_size patch_size embedding_length feed_forward_length block_count "
            "attention.head_count image_mean image_std attention.layer_norm_epsilon n_wa_pattern"
        ).split()
    ),
}


def write_qwen_vl_gguf(folder: str, seed: int = 0, mmproj_type: str = "F32") -> tuple[str, str]:
    """The tiny Qwen2.5-VL as llama.cpp's convert_hf_to_gguf.py writes it: a qwen2vl text
    GGUF (qwen2vl.rope.dimension_sections [2, 3, 3, 0], the vision tokens as control tokens)
    and, with --mmproj, a clip GGUF of projector type qwen2.5vl_merger: q, k, v split out of
    qkv, the Conv3d as two Conv2d time slices (v.patch_embd.weight, .weight.1), names from
    gguf's own tensor map, matrices (and, in F16, the patch embedding) in mmproj_type. The
    mmproj holds exactly the keys the converter writes (MMPROJ_KEYS), so not this tiny model's
    16-pixel window nor its min/max_pixels: clip.cpp (and rawpage) take 112-pixel windows and
    8..4096 tokens an image for those. Returns (model.gguf, mmproj.gguf)."""
    import gguf

    from tests.tiny_models import write_gguf

    os.makedirs(folder, exist_ok=True)
    cfg = qwen_vl_config()
    text = {**cfg, "model_type": "qwen2vl"}
    model = write_gguf(
        os.path.join(folder, "model.gguf"),
        text,
        text_tensors(cfg, seed),
        qwen_vl_tokenizer(),
        extra_metadata=lambda w: w.add_rope_dimension_sections([*cfg["rope_scaling"]["mrope_section"], 0]),
        control=tuple(IMAGE_TOKENS),
        chat_template=CHAT_TEMPLATE,
    )
    path = os.path.join(folder, "mmproj.gguf")
    v = cfg["vision_config"]
    vision_keys = {  # clip.vision.* (and clip.use_silu), by the writer's add_vision_<what>, as the converter
        "projection_dim": cfg["hidden_size"],
        "image_size": 560,  # the converter's default for a config without one; images take their own size
        "patch_size": v["patch_size"],
        "embedding_length": v["hidden_size"],
        "feed_forward_length": v["intermediate_size"],
        "block_count": v["depth"],
        "head_count": v["num_heads"],
        "image_mean": PREPROCESSOR["image_mean"],
        "image_std": PREPROCESSOR["image_std"],
        "attention_layernorm_eps": cfg["rms_norm_eps"],  # the text config's, as the converter takes it
        "use_silu": True,
        "n_wa_pattern": v["fullatt_block_indexes"][0] + 1,
    }
    w = open_mmproj(path, gguf.VisionProjectorType.QWEN25VL, vision_keys)
    w.add_file_type(getattr(gguf.LlamaFileType, "ALL_F32" if mmproj_type == "F32" else "MOSTLY_" + mmproj_type))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["depth"])
    qtype = getattr(gguf.GGMLQuantizationType, mmproj_type)
    for name, t in vision_tensors(cfg, seed).items():
        if name == "visual.patch_embed.proj.weight":  # (Dv, 3, 2, P, P) -> two (Dv, 3, P, P), F32 or F16
            for key, x in (("v.patch_embd.weight", t[:, :, 0]), ("v.patch_embd.weight.1", t[:, :, 1])):
                w.add_tensor(key, np.ascontiguousarray(x).astype(np.float16 if mmproj_type == "F16" else np.float32))
            continue
        parts = [(name, t)]
        if ".qkv." in name:
            parts = [(name.replace("qkv", x), c) for x, c in zip("qkv", np.split(t, 3))]
        for n, x in parts:
            gname = names.get_name(n, try_suffixes=(".weight", ".bias"))
            if x.ndim == 2 and mmproj_type != "F32":
                w.add_tensor(gname, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(gname, x)
    close_mmproj(w)
    return model, path
