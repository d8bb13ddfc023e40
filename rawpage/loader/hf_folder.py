"""Load a Hugging Face model folder: config.json, *.safetensors (sharded or not), tokenizer."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np

from rawpage.config import ModelConfig, vision_config
from rawpage.errors import ModelLoadError
from rawpage.loader.safetensors_file import SafetensorsFile, bf16_to_f32
from rawpage.loader.tensors import TensorSource, is_linear_weight
from rawpage.quantization.weight import QuantizedWeight


def read_json(path: str, required: bool = False) -> dict[str, Any]:
    """A JSON file as a dict; {} if it is absent and not required."""
    if not os.path.exists(path):
        if required:
            folder = os.path.dirname(path)
            raise ModelLoadError(f"{folder}: no {os.path.basename(path)}; is this a Hugging Face model folder?")
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def open_safetensors(folder: str) -> TensorSource:
    """All tensors of the folder's shards, by name; read lazily from memory maps. A bf16
    Linear weight is also offered as stored (QuantizedWeight kind "bf16", its uint16
    bits), for a backend that keeps bf16 (the native CPU one): 2 bytes a weight."""
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors files (other weight formats are not supported)")
    readers, bf16 = {}, {}
    for path in files:
        st = SafetensorsFile(path)
        for name in st.keys():
            if st.dtype_name(name) != "BF16":
                readers[name] = lambda st=st, name=name: st.tensor(name)
                continue
            readers[name] = lambda st=st, name=name: bf16_to_f32(st.tensor(name))
            if len(st.shape(name)) == 2 and is_linear_weight(name):
                bf16[name] = lambda st=st, name=name: _bf16_weight(st, name)
    if "embed_tokens.weight" in readers and "model.embed_tokens.weight" not in readers:
        # Saved from the bare *Model, as the Qwen3-Embedding checkpoints are: no "model." prefix (and no LM head).
        readers, bf16 = (
            {n if n.startswith("lm_head.") else "model." + n: r for n, r in d.items()} for d in (readers, bf16)
        )
    if any(n.startswith(_VLM_PREFIXES) for n in readers):
        readers, bf16 = ({_vlm_name(n): r for n, r in d.items()} for d in (readers, bf16))
    return TensorSource(readers, bf16)


# A vision-language checkpoint keeps its text part one level down: language_model.model.*
# on the Hub (Gemma 3), model.language_model.* as transformers 5 saves it. The decoder
# reads model.*; the vision tower reads vision_tower.* and multi_modal_projector.* (Qwen2.5-VL: visual.*).
_VLM_PREFIXES = (
    "language_model.",
    "model.language_model.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
    "model.visual.",
)


def _vlm_name(name: str) -> str:
    for old, new in (
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("model.language_model.", "model."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
        ("model.visual.", "visual."),  # Qwen2.5-VL as transformers 5 saves it (the Hub's: visual.*)
    ):
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _bf16_weight(st: SafetensorsFile, name: str) -> QuantizedWeight:
    """(out, in) uint16 bits, copied out of the mapping (the model holds its weights)."""
    rows, cols = st.shape(name)
    return QuantizedWeight("bf16", (rows, cols), np.array(st.tensor(name)))


def load_config(folder: str, overrides: dict | None = None) -> ModelConfig:
    raw = read_json(os.path.join(folder, "config.json"), required=True)
    cfg = ModelConfig.from_hf(raw, name=os.path.basename(os.path.normpath(folder)), overrides=overrides)
    cfg.vision = vision_config(raw, read_json(os.path.join(folder, "preprocessor_config.json")))
    cfg.validate()
    return cfg
