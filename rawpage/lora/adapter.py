"""LoRA adapters in PEFT's format, read from disk into host arrays.

A PEFT folder holds `adapter_config.json` (r, lora_alpha, target_modules,
use_rslora, ...) and `adapter_model.safetensors`, with, for each targeted
projection of each layer,

    base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight   (r, in)
    base_model.model.model.layers.{i}.self_attn.q_proj.lora_B.weight   (out, r)

and the layer computes y = x·Wᵀ + scale·(x·Aᵀ)·Bᵀ, scale = lora_alpha / r, or
lora_alpha / sqrt(r) with rsLoRA. Anything PEFT can express that rawpage would
not compute as written (DoRA, biases, per-module ranks, extra trained modules)
is refused with a message rather than ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from rawpage.config import ModelConfig
from rawpage.errors import ModelLoadError
from rawpage.loader.safetensors_file import SafetensorsFile, bf16_to_f32

# PEFT module name -> (the fused Linear it is part of, which part)
TARGETS = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "down_proj": ("down", 0),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")
_KEY = re.compile(r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")


class LoRAError(ValueError):
    """An adapter that cannot be loaded or served; the message says why."""


class LoRANotFoundError(LoRAError):
    """No adapter at a path: nothing there, not a folder, or no adapter_config.json or
    adapter_model.safetensors in it (or unreadable). The server answers all alike, so that
    a client cannot tell them apart to learn what lies on its disk."""


@dataclass(frozen=True)
class LoRARequest:
    """vLLM's LoRARequest: which adapter a request runs with. lora_int_id >= 1 is the
    adapter's id; lora_path a PEFT folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if self.lora_int_id < 1:
            raise LoRAError(f"lora_int_id must be >= 1, got {self.lora_int_id}")


@dataclass
class LoRAAdapter:
    """One adapter on the host: per (layer, module), A (r, in) and B·scale (out, r), float32."""

    name: str
    int_id: int
    path: str
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = field(repr=False)
    digest: str = ""  # SHA-256 of the config and weights: the prefix cache's key
    owner: str | None = None  # the server's: the key_id of the tenant that loaded it; None = shared by all

    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_adapter_config(path: str) -> dict:
    cfg_path = os.path.join(path, "adapter_config.json")
    try:
        if not os.path.isfile(cfg_path):  # (never a FIFO or a device: nothing that could block)
            raise OSError
        with open(cfg_path, "rb") as f:
            text = f.read(1 << 20)  # a config is a few hundred bytes
    except (OSError, ValueError):  # ValueError: a NUL in the path
        raise LoRANotFoundError(f"No adapter found at {path!r}: no adapter_config.json there") from None
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise LoRAError(f"LoRA adapter {path!r}: adapter_config.json is not readable JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise LoRAError(f"LoRA adapter {path!r}: adapter_config.json must hold a JSON object")
    refused = {  # with vLLM's phrases, which its clients and tests match
        "use_dora": "DoRA adapters (this server does not yet support DoRA)",
        "modules_to_save": "adapters that also train whole modules (it only supports modules_to_save being None)",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "layers_to_transform": "layers_to_transform",
        "fan_in_fan_out": "fan_in_fan_out",
    }
    for key, what in refused.items():
        if cfg.get(key):
            raise LoRAError(f"LoRA adapter {path!r}: {what} are not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAError(f"LoRA adapter {path!r}: bias={cfg['bias']!r} is not supported (only 'none')")
    check_config_types(cfg, path)
    return cfg


def check_config_types(cfg: dict, path: str) -> None:
    """r a positive integer, lora_alpha a finite number (JSON allows NaN and Infinity),
    use_rslora a boolean: anything else would reach the arithmetic as garbage."""
    r, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoRAError(f"LoRA adapter {path!r}: 'r' must be a positive integer, got {r!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise LoRAError(f"LoRA adapter {path!r}: 'lora_alpha' must be a finite number, got {alpha!r}")
    if not isinstance(cfg.get("use_rslora", False), bool):
        raise LoRAError(f"LoRA adapter {path!r}: 'use_rslora' must be true or false")


def load_adapter(request: LoRARequest, config: ModelConfig, max_rank: int) -> LoRAAdapter:
    """Read and check an adapter against the base model's shapes and --max-lora-rank. Every
    tensor's name, dtype and shape is checked from the safetensors header before any data
    is read. Touches no engine state, so it may run in any thread."""
    path, name = request.lora_path, request.lora_name
    cfg = read_adapter_config(path)
    r, alpha = cfg["r"], float(cfg.get("lora_alpha", cfg["r"]))
    if not 1 <= r <= max_rank:
        raise LoRAError(
            f"LoRA adapter {name!r} has rank {r}, which is greater than max_lora_rank {max_rank} (--max-lora-rank)"
        )
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.isfile(file):
        raise LoRANotFoundError(f"No adapter found at {path!r}: no adapter_model.safetensors there")
    try:
        st = SafetensorsFile(file)
    except OSError:
        raise LoRANotFoundError(f"No adapter found at {path!r}: adapter_model.safetensors is unreadable") from None
    except (ValueError, KeyError, TypeError, ModelLoadError) as e:  # a corrupt header
        raise LoRAError(f"cannot read {file!r}: {e}") from None
    try:
        plan = _plan(st, config, r, name)
        weights = {key: (_read(st, a), _read(st, b) * np.float32(scale)) for key, (a, b) in plan.items()}
    except LoRAError:
        raise
    except (OSError, ValueError, KeyError, TypeError, ModelLoadError) as e:  # a corrupt file's header or data
        raise LoRAError(f"cannot read {file!r}: {e}") from None
    h = hashlib.sha256(json.dumps([r, scale], sort_keys=True).encode())
    for key in sorted(weights):
        a, b = weights[key]
        h.update(repr(key).encode() + a.tobytes() + b.tobytes())
    return LoRAAdapter(name, request.lora_int_id, path, r, scale, weights, h.hexdigest())


def _read(st: SafetensorsFile, key: str) -> np.ndarray:
    t = st.tensor(key)
    return bf16_to_f32(t) if st.dtype_name(key) == "BF16" else np.asarray(t, np.float32)


def _plan(st: SafetensorsFile, config: ModelConfig, r: int, name: str) -> dict[tuple[int, str], tuple[str, str]]:
    """{(layer, module): (A's key, B's key)}, every name, dtype and shape checked against
    the base model from the header alone."""
    found: dict[tuple[int, str], dict[str, str]] = {}
    for key in st.keys():
        m = _KEY.fullmatch(key)
        if m is None or m.group(2) not in TARGETS or int(m.group(1)) >= config.num_layers:
            raise LoRAError(
                f"LoRA adapter {name!r}: tensor {key[:200]!r} is not a LoRA A/B of a q/k/v/o/gate/up/down "
                f"projection of this {config.num_layers}-layer model"
            )
        if st.dtype_name(key) not in FLOAT_DTYPES:
            raise LoRAError(f"LoRA adapter {name!r}: tensor {key!r} is {st.dtype_name(key)}, not F32, F16 or BF16")
        found.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = key
    if not found:
        raise LoRAError(f"LoRA adapter {name!r} holds no LoRA weights")
    plan = {}
    for (layer, module), ab in sorted(found.items()):
        if set(ab) != {"A", "B"}:
            raise LoRAError(f"LoRA adapter {name!r}: layer {layer} {module} lacks its lora_A or lora_B")
        n_in, n_out = projection_shape(config, module)
        a, b = st.shape(ab["A"]), st.shape(ab["B"])
        if a != (r, n_in) or b != (n_out, r):
            raise LoRAError(
                f"LoRA adapter {name!r}: layer {layer} {module} has A {a} and B {b}; "
                f"this model needs A ({r}, {n_in}) and B ({n_out}, {r})"
            )
        plan[(layer, module)] = (ab["A"], ab["B"])
    return plan


def projection_shape(config: ModelConfig, module: str) -> tuple[int, int]:
    """(in, out) of one projection of the base model."""
    c = config
    return {
        "q_proj": (c.hidden_size, c.q_size),
        "k_proj": (c.hidden_size, c.kv_size),
        "v_proj": (c.hidden_size, c.kv_size),
        "o_proj": (c.q_size, c.hidden_size),
        "gate_proj": (c.hidden_size, c.intermediate_size),
        "up_proj": (c.hidden_size, c.intermediate_size),
        "down_proj": (c.intermediate_size, c.hidden_size),
    }[module]
