"""SpeculativeConfig: vLLM's `speculative_config`, as a dict in `LLM(...)` or JSON on the CLI.

{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
{"model": "path/to/draft", "num_speculative_tokens": 4}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ["ngram", "draft_model"]
KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # "ngram" | "draft_model"
    num_speculative_tokens: int  # k: tokens drafted per sequence per step
    prompt_lookup_min: int = 5  # ngram: shortest suffix looked up
    prompt_lookup_max: int = 5  # ngram: longest suffix looked up (tried first)
    model: str | None = None  # draft_model: HF folder or .gguf of the draft

    @classmethod
    def parse(cls, value: dict[str, Any] | str | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """A dict, a JSON string (the CLI) or None. Raises ValueError naming the bad key."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--speculative-config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict (or JSON object), got {type(value).__name__}")
        unknown = set(value) - KEYS
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {sorted(unknown)}; known: {sorted(KEYS)}")
        method = value.get("method") or ("draft_model" if value.get("model") else None)
        if method not in METHODS:
            raise ValueError(
                f"speculative_config: method must be one of {METHODS} (or give 'model' for a draft model), "
                f"got {value.get('method')!r}"
            )
        if method == "draft_model" and not value.get("model"):
            raise ValueError("speculative_config: a draft model needs 'model': the path of the draft checkpoint")
        if method == "ngram" and value.get("model"):
            raise ValueError("speculative_config: method 'ngram' takes no 'model'")
        k = value.get("num_speculative_tokens")
        if not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_config: num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}"
            )
        # vLLM's defaults: 5 and 5 if neither is given, else the one given for both.
        lo, hi = value.get("prompt_lookup_min"), value.get("prompt_lookup_max")
        lo, hi = (5, 5) if lo is None and hi is None else (lo if lo is not None else hi, hi if hi is not None else lo)
        if method == "ngram" and not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise ValueError(
                f"speculative_config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo!r} and {hi!r}"
            )
        return cls(method, k, lo, hi, value.get("model"))
