"""`--load-format dummy`: a model of the shapes in a config.json, with random weights.

For benchmarking real shapes (tools/configs/ holds Llama-3-8B and Llama-3.2-1B)
without downloading a checkpoint. `--model` names a config.json, or a folder
holding one. The weights are drawn on the device they will live on
(Backend.uniform), each from a seed derived from the weight's name, so a dummy
model is the same on every run and loads in seconds even at 8B parameters.

The scale keeps activations O(1) through the layers, so logits are not
degenerate and parity checks against another implementation mean something:
matrices U(-sqrt(3/fan_in), +sqrt(3/fan_in)) (variance 1/fan_in), norm weights
1 + U(-0.1, 0.1), biases U(-0.02, 0.02).

With no tokenizer.json next to the config, the tokenizer is a word-level
stand-in with one token per id ("<t123>"), so prompts are passed as token ids
and outputs decode to placeholders.
"""

from __future__ import annotations

import json
import math
import os
import zlib

from rawpage.backends.base import Array, Backend
from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError
from rawpage.text.tokenizer import Tokenizer


class DummyWeights:
    """Stands where a TensorSource would (LlamaModel takes either): every weight the
    config implies exists, and is generated on the backend when asked for."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def has(self, name: str) -> bool:
        return name != "rope_freqs"  # Llama 3 rope scaling comes from the config instead

    def load(self, backend: Backend, parts: list[tuple[str, tuple[int, ...]]]) -> Array:
        """The named tensors, concatenated along dim 0 (a fused weight), drawn in one go."""
        name, shape = parts[0]
        rows = sum(s[0] for _, s in parts)
        full = (rows, *shape[1:])
        seed = zlib.crc32(f"{self.seed}:{name}".encode())
        if len(shape) == 2:
            return backend.uniform(full, math.sqrt(3.0 / shape[1]), seed)
        if name.endswith("norm.weight"):
            return backend.uniform(full, 0.1, seed, offset=1.0)
        return backend.uniform(full, 0.02, seed)


def config_path(model: str) -> str:
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(
            f"--load-format dummy needs --model to name a config.json (or a folder with one); {model!r} is neither"
        )
    return path


def load_dummy_config(model: str, overrides: dict | None = None) -> ModelConfig:
    path = config_path(model)
    try:
        with open(path) as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) + " (dummy weights)"
    cfg = ModelConfig.from_hf(raw, name=name, overrides=overrides)
    cfg.validate()
    return cfg


def placeholder_tokenizer(config: ModelConfig) -> Tokenizer:
    """One word-level token per id, "<t{id}>", decoding with spaces between tokens."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {f"<t{i}>": i for i in range(config.vocab_size)}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="<t0>"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    return Tokenizer(hf, config.bos_token_id, list(config.eos_token_ids), None)
