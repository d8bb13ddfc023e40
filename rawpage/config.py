"""Model configuration: one dataclass for every decoder-only checkpoint we load.

A Hugging Face `config.json` and a GGUF file's metadata both become a
`ModelConfig`; nothing past the loader looks at either format again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rawpage.errors import UnsupportedModelError
from rawpage.multimodal.vision_config import VisionConfig

# rope_scaling recipes the rotary tables know (models/rotary.py); None is plain RoPE.
ROPE_TYPES = (None, "default", "linear", "llama3", "yarn", "dynamic", "longrope")

# Hugging Face `architectures` entries -> our family names (models/registry.py maps
# each family to its model class).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",  # Ministral-8B too
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
# Vision-language checkpoints: the text part runs as this *ForCausalLM, the vision part
# is config.vision (rawpage/multimodal/vision_config.py).
VISION_ARCHITECTURES = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Qwen2_5_VLForConditionalGeneration": "Qwen2ForCausalLM",  # with M-RoPE (ModelConfig.mrope_section)
}
# Gemma3TextConfig's defaults: the Hub's Gemma 3 configs spell out only what differs.
_GEMMA3_TEXT_DEFAULTS = {
    "model_type": "gemma3_text",
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "tie_word_embeddings": True,
}


@dataclass
class ModelConfig:
    architecture: str  # family: a value of SUPPORTED_ARCHITECTURES
    hidden_size: int  # dim
    num_layers: int
    num_heads: int  # H
    num_kv_heads: int  # Hkv; H % Hkv == 0 (GQA)
    head_dim: int  # D
    intermediate_size: int  # feed-forward hidden size
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # Llama 3: {"rope_type": "llama3", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: q/k/v projections carry a bias
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"  # dtype of the checkpoint, for `--dtype auto`
    name: str = ""
    # --- what the families after Llama add (models/decoder.py) ---
    sliding_window: int | None = None  # a query sees its last W keys (itself included)
    layer_types: list[str] | None = None  # per layer "sliding_attention" | "full_attention"; None: all
    hidden_act: str = "silu"  # gate activation: "silu" or "gelu_pytorch_tanh" (Gemma)
    query_pre_attn_scalar: float | None = None  # Gemma: scores scaled by this**-0.5, not D**-0.5
    attn_logit_softcapping: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # Gemma 2: the same on the logits
    rope_local_theta: float | None = None  # Gemma 3: the RoPE base of sliding layers
    num_experts: int = 0  # MoE: experts per layer (0: a dense MLP)
    num_experts_per_tok: int = 0  # MoE: top-k
    moe_intermediate_size: int = 0  # MoE: each expert's FFN hidden size
    norm_topk_prob: bool = True  # MoE: renormalize the top-k router weights to sum to 1
    mlp_only_layers: list[int] = field(default_factory=list)  # Qwen3-MoE: dense layers among the sparse
    vision: VisionConfig | None = None  # a vision-language checkpoint's tower and image recipe
    # Qwen2.5-VL's M-RoPE: rotary frequency pairs given to the t, h and w positions, in that
    # order (sums to D/2); None: one position per token (rawpage/multimodal/mrope.py)
    mrope_section: list[int] | None = None

    def layer_sliding_window(self, i: int) -> int | None:
        """The window of layer i, or None for full attention."""
        if self.sliding_window is None:
            return None
        if self.layer_types is not None and self.layer_types[i] != "sliding_attention":
            return None
        return self.sliding_window

    def layer_is_moe(self, i: int) -> bool:
        return self.num_experts > 0 and i not in self.mlp_only_layers

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str = "", overrides: dict[str, Any] | None = None) -> ModelConfig:
        """A config.json, with --hf-overrides laid over it (of a vision-language one, its text part)."""
        if overrides:
            cfg = apply_hf_overrides(cfg, overrides)
        cfg = text_config(cfg)
        archs = cfg.get("architectures") or [cfg.get("model_type", "<missing>")]
        arch = SUPPORTED_ARCHITECTURES.get(archs[0])
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs[0]!r}; rawpage runs {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
            )
        if cfg.get("partial_rotary_factor", 1.0) != 1.0:
            raise UnsupportedModelError(f"partial_rotary_factor={cfg['partial_rotary_factor']} is not supported")
        heads, eos = cfg["num_attention_heads"], cfg.get("eos_token_id")
        rope = _rope_parameters(cfg, arch)
        rope_scaling, max_len = long_context(_rope_scaling(rope["global"]), cfg.get("max_position_embeddings", 4096))
        is_gemma = arch in ("gemma2", "gemma3")
        return cls(
            architecture=arch,
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope["global"].get("rope_theta", 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=max_len,
            tie_word_embeddings=cfg.get("tie_word_embeddings", is_gemma),
            attention_bias=arch == "qwen2" or cfg.get("attention_bias", False),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
            name=name,
            sliding_window=_sliding_window(cfg, arch),
            layer_types=_layer_types(cfg, arch),
            hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu",
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar") if is_gemma else None,
            attn_logit_softcapping=cfg.get("attn_logit_softcapping") if is_gemma else None,
            final_logit_softcapping=cfg.get("final_logit_softcapping") if is_gemma else None,
            rope_local_theta=rope["local"].get("rope_theta") if "local" in rope else None,
            num_experts=cfg.get("num_local_experts") or cfg.get("num_experts") or 0,
            num_experts_per_tok=cfg.get("num_experts_per_tok", 0),
            moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
            norm_topk_prob=cfg.get("norm_topk_prob", True),  # Mixtral always renormalizes
            mlp_only_layers=_dense_layers(cfg),
            mrope_section=_mrope_section(rope["global"]),
        )

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim={self.head_dim} must be even for rotary")
        kind = rope_type(self.rope_scaling)
        if kind not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"unsupported rope_scaling type {kind!r}; rawpage runs {', '.join(t for t in ROPE_TYPES if t)}"
            )
        if kind in ("linear", "llama3", "yarn", "dynamic") and not (self.rope_scaling or {}).get("factor", 0) > 0:
            raise UnsupportedModelError(f"rope_scaling type {kind!r} needs a 'factor' > 0, got {self.rope_scaling}")
        if self.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise UnsupportedModelError(f"unsupported activation {self.hidden_act!r} (silu, gelu_pytorch_tanh)")
        if self.mrope_section and sum(self.mrope_section) != self.head_dim // 2:
            raise UnsupportedModelError(
                f"mrope_section {self.mrope_section} must sum to head_dim / 2 = {self.head_dim // 2}"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise UnsupportedModelError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be in 1..num_experts={self.num_experts}"
            )


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A vision-language config.json's text_config, as the *ForCausalLM config it is; any
    other config.json as it is."""
    arch = VISION_ARCHITECTURES.get((cfg.get("architectures") or [None])[0])
    if arch is None:
        return cfg
    if arch == "Qwen2ForCausalLM":  # the Hub's Qwen2.5-VL configs keep the text part at the top
        top = {k: v for k, v in cfg.items() if k not in ("vision_config", "text_config")}
        return {**top, **(cfg.get("text_config") or {}), "architectures": [arch], "model_type": "qwen2"}
    text = {**_GEMMA3_TEXT_DEFAULTS, **(cfg.get("text_config") or {}), "architectures": [arch]}
    for key in ("eos_token_id", "bos_token_id", "torch_dtype", "dtype"):
        text.setdefault(key, cfg.get(key))
    return text


def vision_config(cfg: dict[str, Any], preprocessor: dict[str, Any]) -> VisionConfig | None:
    """The vision tower of a vision-language config.json (with its preprocessor_config.json); None for others."""
    return (
        VisionConfig.from_hf(cfg, preprocessor) if cfg.get("architectures", [None])[0] in VISION_ARCHITECTURES else None
    )


def _dense_layers(cfg: dict[str, Any]) -> list[int]:
    """Qwen3-MoE: layers in mlp_only_layers, or off the decoder_sparse_step grid, stay dense."""
    step = cfg.get("decoder_sparse_step") or 1
    only = set(cfg.get("mlp_only_layers") or [])
    return [i for i in range(cfg["num_hidden_layers"]) if i in only or (i + 1) % step]


def _sliding_window(cfg: dict[str, Any], arch: str) -> int | None:
    window = cfg.get("sliding_window")
    # Qwen2/3 configs carry a window they do not use unless use_sliding_window is set.
    if not window or not cfg.get("use_sliding_window", arch not in ("qwen2", "qwen3", "qwen3_moe")):
        return None
    # Qwen slides from max_window_layers on: fine where layer_types spells it out (Qwen3),
    # not in Qwen2's Llama path, which has no window.
    if arch == "qwen2" or (arch.startswith("qwen") and not cfg.get("layer_types")):
        raise UnsupportedModelError(f"{arch} with use_sliding_window is not supported")
    return int(window)


def _layer_types(cfg: dict[str, Any], arch: str) -> list[str] | None:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    n = cfg["num_hidden_layers"]
    if arch == "gemma2":  # even layers slide, odd layers see everything
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if arch == "gemma3":  # every sliding_window_pattern-th layer is global
        pattern = cfg.get("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    return None


def _rope_parameters(cfg: dict[str, Any], arch: str) -> dict[str, dict[str, Any]]:
    """{"global": params, "local": params (Gemma 3 only)} from either spelling:
    rope_theta + rope_scaling (+ rope_local_base_freq), as most checkpoints on the Hub
    have them, or transformers 5's rope_parameters (per layer type for Gemma 3)."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "full_attention" in rp:
        out = {"global": dict(rp["full_attention"])}
        if "sliding_attention" in rp:
            out["local"] = dict(rp["sliding_attention"])
    elif isinstance(rp, dict):
        out = {"global": dict(rp)}
    else:
        out = {"global": dict(cfg.get("rope_scaling") or {})}
        out["global"]["rope_theta"] = cfg.get("rope_theta", 1_000_000.0 if arch == "gemma3" else 10000.0)
        if arch == "gemma3":
            out["local"] = {"rope_type": "default", "rope_theta": cfg.get("rope_local_base_freq", 10000.0)}
    glob = out["global"]
    if glob.get("rope_type", glob.get("type")) in ("su", "longrope"):  # Phi-3: the original length sits outside
        glob["rope_type"] = "longrope"
        glob.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    return out


def _mrope_section(params: dict[str, Any]) -> list[int] | None:
    """Qwen2.5-VL's {"type": "mrope", "mrope_section": [...]}: its sections (the recipe is
    plain RoPE otherwise, as transformers reads it: _rope_scaling)."""
    section = params.get("mrope_section")
    return [int(x) for x in section] if section else None


def rope_type(rope_scaling: dict[str, Any] | None) -> str | None:
    """The recipe's name, under either spelling ("rope_type", or the older "type")."""
    rs = rope_scaling or {}
    return rs.get("rope_type", rs.get("type"))


def long_context(rope_scaling: dict[str, Any] | None, max_len: int) -> tuple[dict[str, Any] | None, int]:
    """(rope_scaling, the context length) for a recipe that stretches the original one.
    YaRN and dynamic NTK name the pretraining length (original_max_position_embeddings,
    else the config's max_position_embeddings) and reach `factor` times past it, the
    length vLLM derives too: Qwen2.5's 32k config with {"type": "yarn", "factor": 4}
    serves 128k. The original length is written into the recipe, which needs it."""
    if rope_type(rope_scaling) not in ("yarn", "dynamic") or not (rope_scaling or {}).get("factor"):
        return rope_scaling, max_len
    rs = dict(rope_scaling, rope_type=rope_type(rope_scaling))
    original = int(rs.get("original_max_position_embeddings") or max_len)
    rs["original_max_position_embeddings"] = original
    return rs, max(max_len, int(original * rs["factor"]))


def _rope_scaling(params: dict[str, Any]) -> dict[str, Any] | None:
    """The scaling recipe without the base; None for plain RoPE."""
    rs = {k: v for k, v in params.items() if k not in ("rope_theta", "mrope_section")}
    return None if rs.get("rope_type", rs.get("type", "default")) in ("default", "mrope") else rs


# What --hf-overrides may change on a GGUF, whose config is not a config.json.
# query_pre_attn_scalar: a GGUF cannot say it (llama.cpp scales Gemma's scores by head_dim**-0.5)
GGUF_OVERRIDES = ("rope_scaling", "rope_theta", "max_position_embeddings", "query_pre_attn_scalar")


def apply_hf_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """config.json with --hf-overrides (and --rope-scaling, --rope-theta) laid over it, as
    vLLM lays them. A transformers-5 config keeps its RoPE in rope_parameters: an
    override of rope_scaling or rope_theta goes there too (into full_attention's, per layer type)."""
    out = {**raw, **overrides}
    rp = raw.get("rope_parameters")
    if isinstance(rp, dict) and ("rope_scaling" in overrides or "rope_theta" in overrides):
        rp = {k: dict(v) for k, v in rp.items()} if "full_attention" in rp else {"flat": dict(rp)}
        target = rp.get("full_attention", rp.get("flat"))
        theta = overrides.get("rope_theta", target.get("rope_theta"))
        if "rope_scaling" in overrides:
            target.clear()
            target.update(overrides["rope_scaling"] or {"rope_type": "default"})
        target["rope_theta"] = theta
        out["rope_parameters"] = rp.get("flat", rp)
    return out


def override_config(cfg: ModelConfig, overrides: dict[str, Any], where: str) -> None:
    """--hf-overrides on a config made from GGUF metadata: RoPE, the context length and Gemma's score scale only."""
    unknown = sorted(set(overrides) - set(GGUF_OVERRIDES))
    if unknown:
        raise UnsupportedModelError(
            f"{where}: --hf-overrides can set only {', '.join(GGUF_OVERRIDES)} on a GGUF, not {', '.join(unknown)}"
        )
    if "rope_theta" in overrides:
        cfg.rope_theta = float(overrides["rope_theta"])
    if "max_position_embeddings" in overrides:
        cfg.max_position_embeddings = int(overrides["max_position_embeddings"])
    if "query_pre_attn_scalar" in overrides:
        if cfg.query_pre_attn_scalar is None:
            raise UnsupportedModelError(f"{where}: query_pre_attn_scalar is Gemma's; this is {cfg.architecture}")
        cfg.query_pre_attn_scalar = float(overrides["query_pre_attn_scalar"])
    if "rope_scaling" in overrides:
        rs = _rope_scaling(dict(overrides["rope_scaling"] or {}))
        if rope_type(rs) == "longrope":
            raise UnsupportedModelError(f"{where}: a GGUF's LongRoPE factors come from the file, not --rope-scaling")
        cfg.rope_scaling, cfg.max_position_embeddings = long_context(rs, cfg.max_position_embeddings)
    cfg.validate()
