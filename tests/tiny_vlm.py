"""A tiny random Gemma 3 vision-language model (Gemma3ForConditionalGeneration), as a
Hugging Face folder laid out as google/gemma-3-4b-it is on the Hub: the text part
under language_model.model.*, the SigLIP tower under vision_tower.vision_model.*,
the projector under multi_modal_projector.*, a preprocessor_config.json and a
tokenizer with Gemma 3's three image tokens.

Written without rawpage's code (weights drawn with NumPy from a seed, per tensor
name), so that loading it tests rawpage's loader, vision tower and image path against
transformers: tools/make_golden_vlm.py records transformers' logits of this very
folder into tests/data/golden_gemma3_vlm.json.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from tests.tiny_families import family_config, hub_tensors
from tests.tiny_models import SPECIAL, train_tokenizer, write_gguf

IMAGE_TOKENS = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]  # ids 397, 398, 399
BOI, IMAGE, EOI = 397, 398, 399

# Gemma 3's template, shortened: an image part becomes <start_of_image>, which the
# processor (and rawpage) expands into the image's soft tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<start_of_image>{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 8,  # 4 x 4 patches, average-pooled 2 x 2 into 4 tokens
    "layer_norm_eps": 1e-6,
    "vision_use_head": False,
}


def vlm_config() -> dict:
    text = {k: v for k, v in family_config("gemma3").items() if k != "architectures"}
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": dict(VISION),
        "mm_tokens_per_image": 4,
        "boi_token_index": BOI,
        "eoi_token_index": EOI,
        "image_token_index": IMAGE,
        "eos_token_id": 2,
        "bos_token_id": 1,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def vision_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Hub-named float32 weights of the SigLIP tower and the Gemma 3 projector."""
    v, dim = cfg["vision_config"], cfg["text_config"]["hidden_size"]
    h, inter, p = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    n_patches = (v["image_size"] // p) ** 2
    pre = "vision_tower.vision_model."
    t: dict[str, tuple[int, ...]] = {
        pre + "embeddings.patch_embedding.weight": (h, 3, p, p),
        pre + "embeddings.patch_embedding.bias": (h,),
        pre + "embeddings.position_embedding.weight": (n_patches, h),
        pre + "post_layernorm.weight": (h,),
        pre + "post_layernorm.bias": (h,),
        "multi_modal_projector.mm_input_projection_weight": (h, dim),  # (in, out): fan-in is dim 0
        "multi_modal_projector.mm_soft_emb_norm.weight": (h,),
    }
    for i in range(v["num_hidden_layers"]):
        q = f"{pre}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            t[q + n + ".weight"], t[q + n + ".bias"] = (h,), (h,)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[q + f"self_attn.{n}.weight"], t[q + f"self_attn.{n}.bias"] = (h, h), (h,)
        t[q + "mlp.fc1.weight"], t[q + "mlp.fc1.bias"] = (inter, h), (inter,)
        t[q + "mlp.fc2.weight"], t[q + "mlp.fc2.bias"] = (h, inter), (h,)
    out = {}
    for name, shape in sorted(t.items()):
        x = np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(shape)
        if name.endswith("mm_input_projection_weight"):
            x = x / np.sqrt(shape[0])
        elif len(shape) >= 2 and "position" not in name:
            x = x / np.sqrt(np.prod(shape[1:]))
        elif "position" in name or name.endswith("bias"):
            x = 0.1 * x
        else:  # norm weights: LayerNorm scales by w (near 1); Gemma's RMSNorm by 1 + w (near 0)
            x = 0.1 * x + (0.0 if "mm_soft_emb_norm" in name else 1.0)
        out[name] = x.astype(np.float32)
    return out


def vlm_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """The whole checkpoint under the Hub's names (language_model.model.* for the text part)."""
    text = {"language_model." + n: w for n, w in hub_tensors(cfg["text_config"], seed).items()}
    return {**text, **vision_tensors(cfg, seed)}


def seeded_image(seed: int, width: int, height: int):
    """A seeded RGB PIL image of smooth blobs plus noise (a resize has something to average)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width] / max(width, height)
    base = np.stack([np.sin(6 * xx + c) * np.cos(4 * yy - c) for c in rng.uniform(0, 3, 3)], axis=-1)
    pixels = 127.5 * (1 + 0.8 * base) + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def vlm_tokenizer():
    tok = train_tokenizer(397)
    tok.add_special_tokens(IMAGE_TOKENS)
    assert [tok.token_to_id(t) for t in IMAGE_TOKENS] == [BOI, IMAGE, EOI], "image token ids moved"
    return tok


def write_vlm_gguf(
    folder: str, seed: int = 0, mmproj_type: str = "F32", projector: str = "gemma3", text_dim: int | None = None
) -> tuple[str, str]:
    """The tiny Gemma 3 VLM as llama.cpp's convert_hf_to_gguf.py writes it: a gemma3 text
    GGUF (Gemma's norms as 1 + w, the image tokens as control tokens) and, with --mmproj,
    a clip GGUF of the tower and projector, named by gguf's own tensor map (the projector's
    RMSNorm as 1 + w; position and patch embeddings kept F32, other matrices in
    mmproj_type, as its --outtype does). Returns (model.gguf, mmproj.gguf).
    projector, text_dim: another clip.projector_type, or a projector made for a model of
    another embedding length (the mismatches a loader must refuse)."""
    import gguf

    os.makedirs(folder, exist_ok=True)
    cfg = vlm_config()
    text, v = cfg["text_config"], cfg["vision_config"]
    model = write_gguf(
        os.path.join(folder, "model.gguf"),
        text,
        hub_tensors(text, seed),
        vlm_tokenizer(),
        control=tuple(IMAGE_TOKENS),
        chat_template=CHAT_TEMPLATE,
    )
    path = os.path.join(folder, "mmproj.gguf")
    text_dim = text_dim or text["hidden_size"]
    pool = v["image_size"] // v["patch_size"] // round(cfg["mm_tokens_per_image"] ** 0.5)
    vision_keys = {
        "projection_dim": text_dim,
        "image_size": v["image_size"],
        "patch_size": v["patch_size"],
        "embedding_length": v["hidden_size"],
        "feed_forward_length": v["intermediate_size"],
        "block_count": v["num_hidden_layers"],
        "head_count": v["num_attention_heads"],
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "attention_layernorm_eps": v["layer_norm_eps"],
        "use_gelu": True,
        "projector_scale_factor": pool,  # written where not clip.cpp's default 4, as the converter does
    }
    w = open_mmproj(path, projector, vision_keys)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v["num_hidden_layers"])
    qtype = getattr(gguf.GGMLQuantizationType, mmproj_type)
    for name, t in vision_tensors(cfg, seed).items():
        gname = names.get_name(name.replace("_weight", ".weight"), try_suffixes=(".weight", ".bias"))
        if "soft_emb_norm" in name:
            t = t + 1.0
        if "mm_input_projection" in name:  # (Dv, text dim)
            t = np.resize(t, (t.shape[0], text_dim))
        if t.ndim >= 2 and ".embeddings." not in name and mmproj_type != "F32":
            w.add_tensor(gname, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, t)
    close_mmproj(w)
    return model, path


def open_mmproj(path: str, projector: str, vision_keys: dict):
    """A gguf.GGUFWriter of a clip GGUF with a vision encoder of clip.projector_type
    `projector`, each of vision_keys written by the writer's add_vision_<key> (clip.vision.*)."""
    import gguf

    w = gguf.GGUFWriter(path, "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector)
    for what, value in vision_keys.items():
        getattr(w, "add_vision_" + what)(value)
    return w


def close_mmproj(w) -> None:
    """Write the file open_mmproj began, once its tensors are added."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_vlm_folder(folder: str, cfg: dict, tensors: dict, tok, tokenizer_config: dict, pre: dict) -> str:
    """A vision-language model as a Hugging Face folder: config, weights, tokenizer, preprocessor."""
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    for name, obj in (
        ("config.json", cfg),
        ("tokenizer_config.json", tokenizer_config),
        ("preprocessor_config.json", pre),
    ):
        with open(os.path.join(folder, name), "w") as f:
            json.dump(obj, f)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    tok.save(os.path.join(folder, "tokenizer.json"))
    return folder


def write_vlm(folder: str, seed: int = 0) -> str:
    """The tiny Gemma 3 VLM as a Hugging Face folder."""
    cfg = vlm_config()
    pre = {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_resize": True,
        "size": {"height": VISION["image_size"], "width": VISION["image_size"]},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": None,
        "image_seq_length": cfg["mm_tokens_per_image"],
    }
    tok_cfg = {"bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "chat_template": CHAT_TEMPLATE}
    return write_vlm_folder(folder, cfg, vlm_tensors(cfg, seed), vlm_tokenizer(), tok_cfg, pre)
