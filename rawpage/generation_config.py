"""--generation-config: the sampling defaults a request gets for the fields it leaves out.

    auto    the model's generation_config.json (vLLM's default): temperature, top_p,
            top_k, min_p, repetition_penalty, and max_new_tokens as max_tokens
    vllm    none: the API's neutral defaults (temperature 1, top_p 1, ...)
    FOLDER  that folder's generation_config.json

--override-generation-config (JSON) is laid over the result, as vLLM lays it. A GGUF
file carries no generation_config.json, so `auto` there means the neutral defaults.
A request's own fields always win; these only fill the gaps (server and LLM alike).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from rawpage.errors import ModelLoadError

logger = logging.getLogger("rawpage")

# generation_config.json's keys that are sampling defaults (vLLM's get_diff_sampling_param)
SAMPLING_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")


def sampling_defaults(
    mode: str, model_path: str, model_config: dict[str, Any], overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """SamplingParams keywords from the generation config --generation-config names, logged."""
    from rawpage.loader.hf_folder import read_json

    if mode == "vllm":
        source, gen = "vllm: the API's neutral defaults", {}
    elif mode == "auto":
        gen = model_config
        kind = "a GGUF file, which has" if not os.path.isdir(model_path) else "a model folder with"
        source = "auto: the model's generation_config.json" if gen else f"auto: {kind} no generation_config.json"
    elif os.path.isdir(mode):
        gen = read_json(os.path.join(mode, "generation_config.json"), required=True)
        source = f"{mode}/generation_config.json"
    else:
        raise ModelLoadError(
            f"--generation-config {mode!r}: give auto (the model's generation_config.json), vllm (the "
            "API's neutral defaults) or a folder that holds a generation_config.json"
        )
    defaults = {k: gen[k] for k in SAMPLING_KEYS if gen.get(k) is not None}
    defaults.update(overrides or {})
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    unknown = sorted(set(defaults) - {*SAMPLING_KEYS, "max_tokens"})
    if unknown:
        raise ModelLoadError(f"--override-generation-config: unknown key(s) {unknown}; known: {list(SAMPLING_KEYS)}")
    _check(defaults, source)
    shown = ", ".join(f"{k}={v}" for k, v in defaults.items()) or "none"
    logger.info("generation config %s; sampling defaults for fields a request leaves out: %s", source, shown)
    return defaults


def _check(defaults: dict[str, Any], source: str) -> None:
    """A bad value fails at startup, naming its file, not in every request that falls back to it."""
    from rawpage.sampling_params import SamplingParams

    try:
        SamplingParams(**defaults)
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"generation config ({source}): {e}; start with --generation-config vllm") from None
