"""Open a model from disk: a Hugging Face folder, a .gguf file, or the embedded default.

`load_checkpoint` returns everything the engine needs, in format-free form:
a ModelConfig, a lazy map of float32 tensors under Hugging Face names (or, with
load_format="dummy", random weights of the config's shapes), the tokenizer, and
the model's own sampling defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError
from rawpage.loader.default_model import default_model_path
from rawpage.loader.dummy import DummyWeights
from rawpage.loader.hub import looks_like_hub_id, resolve_hub_id
from rawpage.loader.tensors import TensorSource
from rawpage.text.tokenizer import Tokenizer


@dataclass
class Checkpoint:
    path: str
    config: ModelConfig
    tensors: TensorSource | DummyWeights
    tokenizer: Tokenizer
    generation_config: dict[str, Any] = field(default_factory=dict)
    no_vision: str = "it has no vision tower"  # why the model takes no images, where config.vision is None


def resolve_model_path(model: str | None, revision: str | None = None, download_dir: str | None = None) -> str:
    """A local path for --model: the embedded default, a folder or .gguf file, or a hub id (org/name)."""
    if model is None:
        return default_model_path()
    if looks_like_hub_id(model):
        return resolve_hub_id(model, revision, download_dir)
    path = os.path.expanduser(model)
    if not os.path.exists(path):
        raise ModelLoadError(
            f"model {model!r} not found: pass a Hugging Face model folder, a .gguf file path or a hub id (org/name)"
        )
    return path


def load_checkpoint(
    model: str | None = None,
    load_format: str = "auto",
    seed: int = 0,
    revision: str | None = None,
    download_dir: str | None = None,
    overrides: dict[str, Any] | None = None,
    mmproj: str | None = None,
) -> Checkpoint:
    """load_format "dummy": `model` is a config.json (or a folder with one); the weights
    are random, drawn from `seed` when the model is built. overrides: --hf-overrides
    (with --rope-scaling and --rope-theta), laid over the model's config. mmproj: the
    vision tower of a GGUF model, as llama-server's --mmproj (loader/mmproj.py)."""
    if mmproj is not None and load_format == "dummy":
        raise ModelLoadError("--mmproj goes with a GGUF model, not --load-format dummy")
    if load_format == "dummy":
        return _load_dummy(model, seed, overrides)
    path = resolve_model_path(model, revision, download_dir)
    magic = b""
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            magic = f.read(4)
    found = "safetensors" if os.path.isdir(path) else "gguf" if magic == b"GGUF" else None
    if found is None:
        raise ModelLoadError(f"{path}: neither a model folder nor a GGUF file (magic bytes {magic!r})")
    if load_format not in ("auto", found):  # vLLM's --load-format safetensors / gguf: what the user expects to load
        raise ModelLoadError(f"--load-format {load_format}: {path} holds {found} weights; pass --load-format auto")
    if mmproj is not None and found != "gguf":
        raise ModelLoadError(
            f"--mmproj goes with a GGUF model; {path} is a model folder, whose vision tower (if any) is in its own files"
        )
    return _load_hf_folder(path, overrides) if found == "safetensors" else _load_gguf(path, overrides, mmproj)


def _load_hf_folder(folder: str, overrides: dict[str, Any] | None = None) -> Checkpoint:
    from rawpage.loader import hf_folder

    config = hf_folder.load_config(folder, overrides)
    tensors = hf_folder.open_safetensors(folder)
    qconfig = hf_folder.read_json(os.path.join(folder, "config.json")).get("quantization_config")
    if qconfig:  # AWQ / GPTQ / FP8: packed Linear weights (rawpage/quantization/)
        from rawpage.loader.quantized_checkpoint import checkpoint_tensors

        tensors = checkpoint_tensors(tensors, qconfig, folder)
    tokenizer_config = hf_folder.read_json(os.path.join(folder, "tokenizer_config.json"))
    tokenizer = Tokenizer.from_hf_folder(folder, config.eos_token_ids, tokenizer_config)
    config.eos_token_ids = tokenizer.eos_token_ids
    if config.bos_token_id is None:
        config.bos_token_id = tokenizer.bos_token_id
    gen = hf_folder.read_json(os.path.join(folder, "generation_config.json"))  # the authors' sampling defaults
    for eos in _as_list(gen.get("eos_token_id")):
        if eos not in config.eos_token_ids:
            config.eos_token_ids.append(eos)
    return Checkpoint(folder, config, tensors, tokenizer, gen)


def _load_gguf(path: str, overrides: dict[str, Any] | None = None, mmproj: str | None = None) -> Checkpoint:
    from rawpage.config import override_config
    from rawpage.loader.gguf_file import GGUFCheckpoint

    ckpt = GGUFCheckpoint(path)
    ckpt.config.validate()
    if overrides:
        override_config(ckpt.config, overrides, path)
    tokenizer = Tokenizer.from_gguf(ckpt.meta)
    ckpt.config.eos_token_ids = tokenizer.eos_token_ids
    from rawpage.loader.mmproj import load_mmproj

    tensors, no_vision = ckpt.tensor_source(), Checkpoint.no_vision
    if mmproj is not None:  # the vision tower and projector: config.vision and their tensors
        tensors = tensors.merged(load_mmproj(os.path.expanduser(mmproj), ckpt.config, tokenizer, path))
    elif ckpt.arch in ("gemma3", "qwen2vl"):  # the text GGUFs of vision-language models
        no_vision = f"a {ckpt.arch} GGUF takes images only when started with --mmproj, its mmproj-*.gguf file"
    return Checkpoint(path, ckpt.config, tensors, tokenizer, {}, no_vision)


def _load_dummy(model: str | None, seed: int, overrides: dict[str, Any] | None = None) -> Checkpoint:
    from rawpage.loader.dummy import config_path, load_dummy_config, placeholder_tokenizer

    if model is None:
        raise ModelLoadError("--load-format dummy needs --model pointing at a config.json (see tools/configs/)")
    config = load_dummy_config(model, overrides)
    folder = os.path.dirname(config_path(model))
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        tokenizer = Tokenizer.from_hf_folder(folder, config.eos_token_ids)
    else:
        tokenizer = placeholder_tokenizer(config)
    return Checkpoint(folder, config, DummyWeights(seed), tokenizer, {})


def _as_list(x: Any) -> list[int]:
    return [x] if isinstance(x, int) else list(x or [])
