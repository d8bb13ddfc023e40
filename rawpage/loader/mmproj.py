"""llama.cpp's multimodal projector file (`--mmproj`, as llama-server takes it): a GGUF
of general.architecture "clip" holding a vision tower and its projector, paired with
a text GGUF. Two projectors:

- "gemma3" (SigLIP + average pool), paired with a gemma3 GGUF: tensors offered under the
  Hub's names (vision_tower.vision_model.*, multi_modal_projector.*), so that
  models/siglip.py reads an mmproj as it reads a Gemma3ForConditionalGeneration folder;
- "qwen2.5vl_merger" (Qwen2.5-VL's ViT + patch merger), paired with a qwen2vl GGUF (its
  M-RoPE sections in qwen2vl.rope.dimension_sections): tensors offered as visual.*, the
  converter's splits joined again (q, k, v into qkv; the Conv3d's two time slices,
  v.patch_embd.weight and .weight.1, into one), for models/qwen_vit.py.

Its metadata becomes the model's VisionConfig. The image tokens are the family's own
strings, found in the text GGUF's vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError, UnsupportedModelError
from rawpage.loader.gguf_file import read_float32
from rawpage.loader.gguf_reader import GGUFTensorInfo, read_gguf
from rawpage.loader.tensors import TensorSource
from rawpage.multimodal.vision_config import ImageProcessorConfig, VisionConfig
from rawpage.text.tokenizer import Tokenizer

# clip.projector_type -> the text GGUF architecture it pairs with
PROJECTORS = {"gemma3": "gemma3", "qwen2.5vl_merger": "qwen2"}
GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
QWEN_IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
# What a Qwen2.5-VL mmproj does not hold, as clip.cpp takes it (convert_hf_to_gguf.py writes
# neither the config's window_size nor the preprocessor's min/max_pixels, and clip.cpp reads
# no key for them): 112-pixel windows, and images resized to between 8 and 4096 tokens
# (llama-server's --image-min-tokens / --image-max-tokens; here --mm-processor-kwargs'
# min_pixels / max_pixels). Every released Qwen2.5-VL has window_size 112.
QWEN_WINDOW, QWEN_MIN_TOKENS, QWEN_MAX_TOKENS = 112, 8, 4096
DEFAULT_POOL = 4  # clip.cpp's Gemma 3 pooling (k x k patches a token) when clip.vision.projector.scale_factor is absent

# mmproj tensor name -> Hub name; {i}: the layer
_TOWER = "vision_tower.vision_model."
_GLOBAL = {
    "v.patch_embd.weight": _TOWER + "embeddings.patch_embedding.weight",
    "v.patch_embd.bias": _TOWER + "embeddings.patch_embedding.bias",
    "v.position_embd.weight": _TOWER + "embeddings.position_embedding.weight",
    "v.post_ln.weight": _TOWER + "post_layernorm.weight",
    "v.post_ln.bias": _TOWER + "post_layernorm.bias",
    "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
    "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
}
_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "ln1": "layer_norm1",
    "ln2": "layer_norm2",
    "ffn_up": "mlp.fc1",
    "ffn_down": "mlp.fc2",
}


def hub_name(name: str) -> str | None:
    """The Hub name of an mmproj tensor (None: one the Gemma 3 tower does not use)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".")  # v.blk.{i}.{what}.{weight|bias}
    if len(parts) == 5 and parts[:2] == ["v", "blk"] and parts[3] in _LAYER:
        return f"{_TOWER}encoder.layers.{parts[2]}.{_LAYER[parts[3]]}.{parts[4]}"
    return None


def load_mmproj(path: str, config: ModelConfig, tokenizer: Tokenizer, model: str) -> TensorSource:
    """Set config.vision from the mmproj at `path` and return its tensors under Hub names.
    Refused at startup, naming both files: a file that is not a clip GGUF, a projector
    rawpage does not run, one whose text model is another architecture or size."""
    where = f"--mmproj {path}"
    if not os.path.isfile(path):
        raise ModelLoadError(f"{where}: no such file (pass the mmproj GGUF that goes with {model})")
    meta, infos, data = read_gguf(path)
    if meta.get("general.architecture") != "clip" or not meta.get("clip.has_vision_encoder", True):
        raise ModelLoadError(
            f"{where}: not a multimodal projector (general.architecture {meta.get('general.architecture')!r}, "
            "not 'clip' with a vision encoder); pass the mmproj-*.gguf file made for the model"
        )
    kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    if kind not in PROJECTORS:
        raise UnsupportedModelError(
            f"{where}: projector type {kind!r} is not supported; rawpage runs {', '.join(sorted(PROJECTORS))}"
        )
    if config.architecture != PROJECTORS[kind] or (kind == "qwen2.5vl_merger") != bool(config.mrope_section):
        raise UnsupportedModelError(
            f"{where}: a {kind} projector, but {model} is a {config.architecture} model without vision; "
            f"pass the mmproj made for this model, or leave --mmproj out to serve text only"
        )
    if kind == "qwen2.5vl_merger":
        config.vision = _qwen_vision_config(meta, where, tokenizer, config.hidden_size, model)
        return _qwen_tensors(data, infos)
    vision = _vision_config(meta, where, tokenizer)
    infos_by_name = {t.name: t for t in infos}
    proj = infos_by_name.get("mm.input_projection.weight")
    dim = int(meta.get("clip.vision.projection_dim", proj.shape[-1] if proj is not None else 0))
    if dim != config.hidden_size or proj is None or proj.shape != (vision.hidden_size, dim):
        raise ModelLoadError(
            f"{where}: projects images to {dim} dimensions (mm.input_projection.weight "
            f"{proj.shape if proj else 'missing'}), but {model} has embedding length {config.hidden_size}: "
            "the mmproj belongs to another model size"
        )
    readers = {}
    for t in infos:
        name = hub_name(t.name)
        if name is not None:
            readers[name] = lambda t=t: _read(data, t)
    config.vision = vision
    return TensorSource(readers)


def _read(data: np.ndarray, t: GGUFTensorInfo) -> np.ndarray:
    w = read_float32(data, t)
    # llama.cpp's converter stores the projector's RMSNorm as the 1 + w it scales by
    # (the tower's LayerNorms are stored as they are)
    return w - 1.0 if t.name == "mm.soft_emb_norm.weight" else w


def _vision_config(meta: dict, where: str, tokenizer: Tokenizer) -> VisionConfig:
    v = "clip.vision."
    try:
        image_size, patch = int(meta[v + "image_size"]), int(meta[v + "patch_size"])
        hidden, heads = int(meta[v + "embedding_length"]), int(meta[v + "attention.head_count"])
        side = image_size // patch
        pool = int(meta.get(v + "projector.scale_factor", DEFAULT_POOL))
        if pool <= 0 or side % pool:
            raise UnsupportedModelError(f"{where}: a {side}x{side} patch grid does not pool {pool}x{pool}")
        ids = [_token_id(tokenizer, t, where) for t in GEMMA3_IMAGE_TOKENS]
        return VisionConfig(
            hidden_size=hidden,
            intermediate_size=int(meta[v + "feed_forward_length"]),
            num_layers=int(meta[v + "block_count"]),
            num_heads=heads,
            image_size=image_size,
            patch_size=patch,
            layer_norm_eps=float(meta.get(v + "attention.layer_norm_epsilon", 1e-6)),
            tokens_per_image=(side // pool) ** 2,
            boi_token_id=ids[0],
            image_token_id=ids[1],
            eoi_token_id=ids[2],
            processor=ImageProcessorConfig(  # Gemma3ImageProcessor's: bilinear to the tower's size, x / 255
                height=image_size,
                width=image_size,
                image_mean=tuple(float(x) for x in meta.get(v + "image_mean", (0.5,) * 3)),
                image_std=tuple(float(x) for x in meta.get(v + "image_std", (0.5,) * 3)),
            ),
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: mmproj metadata lacks {e.args[0]!r}") from None


def _token_id(tokenizer: Tokenizer, token: str, where: str) -> int:
    i = tokenizer.hf.token_to_id(token)
    if i is None:
        raise ModelLoadError(f"{where}: the model's vocabulary has no {token} token, which its images need")
    return int(i)


def _qwen_vision_config(meta: dict, where: str, tokenizer: Tokenizer, text_dim: int, model: str) -> VisionConfig:
    """A qwen2.5vl_merger mmproj's VisionConfig, from what convert_hf_to_gguf.py writes: the
    tower's shape (clip.vision.*), full attention in every n_wa_pattern-th block (the converter
    writes fullatt_block_indexes[0] + 1, having checked they are evenly spaced), eps, mean
    and std; clip.cpp's window and token limits for the rest (QWEN_WINDOW ...)."""
    v = "clip.vision."
    try:
        layers, patch = int(meta[v + "block_count"]), int(meta[v + "patch_size"])
        merge, n_wa = int(meta.get(v + "spatial_merge_size", 2)), int(meta[v + "n_wa_pattern"])
        if int(meta.get(v + "projection_dim", text_dim)) != text_dim:
            raise ModelLoadError(
                f"{where}: projects images to {meta[v + 'projection_dim']} dimensions, but {model} has embedding "
                f"length {text_dim}: the mmproj belongs to another model size"
            )
        factor = patch * merge
        pre = {
            "min_pixels": QWEN_MIN_TOKENS * factor * factor,
            "max_pixels": QWEN_MAX_TOKENS * factor * factor,
            "image_mean": meta.get(v + "image_mean"),
            "image_std": meta.get(v + "image_std"),
        }
        ids = [_token_id(tokenizer, t, where) for t in QWEN_IMAGE_TOKENS]
        return VisionConfig(
            hidden_size=int(meta[v + "embedding_length"]),
            intermediate_size=int(meta[v + "feed_forward_length"]),
            num_layers=layers,
            num_heads=int(meta[v + "attention.head_count"]),
            image_size=0,
            patch_size=patch,
            layer_norm_eps=float(meta.get(v + "attention.layer_norm_epsilon", 1e-6)),
            tokens_per_image=0,
            boi_token_id=ids[0],
            image_token_id=ids[1],
            eoi_token_id=ids[2],
            processor=ImageProcessorConfig.from_qwen2_vl({k: x for k, x in pre.items() if x is not None}, patch, merge),
            family="qwen2_5_vl",
            spatial_merge_size=merge,
            temporal_patch_size=2,  # the converter's two patch_embd slices
            window_size=QWEN_WINDOW,
            fullatt_block_indexes=tuple(i for i in range(layers) if (i + 1) % n_wa == 0),
            out_hidden_size=text_dim,
            hidden_act="silu",
        )
    except KeyError as e:
        raise ModelLoadError(f"{where}: mmproj metadata lacks {e.args[0]!r}") from None


# Qwen2.5-VL mmproj tensor -> visual.* name; {i}: the block
_QWEN_GLOBAL = {
    "v.post_ln.weight": "merger.ln_q.weight",
    **{f"mm.{j}.{w}": f"merger.mlp.{j}.{w}" for j in (0, 2) for w in ("weight", "bias")},
}
_QWEN_LAYER = {
    "attn_out": "attn.proj",
    "ln1": "norm1",
    "ln2": "norm2",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _qwen_tensors(data: np.ndarray, infos: list[GGUFTensorInfo]) -> TensorSource:
    """The mmproj's tensors as a Qwen2_5_VLForConditionalGeneration folder names them (visual.*)."""
    by_name = {t.name: t for t in infos}

    def joined(names: list[str], stack_axis: int | None = None) -> Callable[[], np.ndarray]:
        """The named tensors concatenated on axis 0, or stacked on a new stack_axis."""

        def read() -> np.ndarray:
            parts = [read_float32(data, by_name[n]) for n in names]
            return np.concatenate(parts) if stack_axis is None else np.stack(parts, axis=stack_axis)

        return read

    readers = {}
    for name, t in by_name.items():
        parts = name.split(".")  # v.blk.{i}.{what}.{weight|bias}
        if name in _QWEN_GLOBAL:
            readers["visual." + _QWEN_GLOBAL[name]] = lambda t=t: read_float32(data, t)
        elif len(parts) == 5 and parts[:2] == ["v", "blk"] and parts[3] in _QWEN_LAYER:
            readers[f"visual.blocks.{parts[2]}.{_QWEN_LAYER[parts[3]]}.{parts[4]}"] = lambda t=t: read_float32(data, t)
        elif len(parts) == 5 and parts[:2] == ["v", "blk"] and parts[3] == "attn_q":
            qkv = [f"v.blk.{parts[2]}.attn_{x}.{parts[4]}" for x in "qkv"]
            readers[f"visual.blocks.{parts[2]}.attn.qkv.{parts[4]}"] = joined(qkv)
    # Conv3d (Dv, 3, 2, P, P): the converter's two Conv2d time slices, stacked on axis 2
    readers["visual.patch_embed.proj.weight"] = joined(["v.patch_embd.weight", "v.patch_embd.weight.1"], stack_axis=2)
    return TensorSource(readers)
