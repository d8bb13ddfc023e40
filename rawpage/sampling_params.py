"""SamplingParams: how to pick each next token and when to stop. Same names as vLLM's."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.structured_output import StructuredOutputsParams

# vLLM's cap on logprob_token_ids (MAX_LOGPROB_TOKEN_IDS): a request reports at most this many fixed ids per step
MAX_LOGPROB_TOKEN_IDS = 128
# A positive temperature below this runs at this (vLLM's _MAX_TEMP): logits / 1e-300 overflow.
MIN_TEMPERATURE = 0.01
# An id list longer than 1/DENSE_FRACTION of the vocabulary is applied as a dense row (dense_row).
DENSE_FRACTION = 8


@dataclass
class SamplingParams:
    n: int = 1  # completions per prompt; they share the prompt's KV blocks
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus: smallest set of tokens with this much probability
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 means all
    min_p: float = 0.0  # drop tokens less likely than min_p * p(most likely token)
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the generated text
    repetition_penalty: float = 1.0  # divides positive (multiplies negative) logits of seen tokens
    seed: int | None = None  # per-request RNG; same seed, same output, whatever the batch
    max_tokens: int | None = 16  # None: up to the context limit
    min_tokens: int = 0  # EOS and stop tokens are suppressed until this many are generated
    stop: list[str] | str | None = None  # stop strings, excluded from the output text
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled one)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token
    # vLLM's logprob_token_ids: report these tokens' logprobs (and the sampled one's) at each
    # step instead of the top-N; alone, it turns logprobs on
    logprob_token_ids: list[int] | None = None
    logit_bias: dict[int, float] | None = None  # added to the logits before sampling
    allowed_token_ids: list[int] | None = None  # vLLM's: only these tokens may be sampled
    skip_special_tokens: bool = True
    # beam search (vLLM's offline API): n is the beam width
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # a grammar the output must follow (JSON schema, regex, choice, Lark); a dict is accepted too
    structured_outputs: StructuredOutputsParams | dict[str, Any] | None = None
    # vLLM's: tokens a reasoning model may write inside its think block before the end tag is
    # forced (rawpage/thinking_budget.py); None (or -1) unlimited, 0 no thinking
    thinking_token_budget: int | None = None
    # the think block's (start, end) tags: the engine tracks the block (usage's reasoning tokens)
    # and applies thinking_token_budget to it; None: <think>, </think> where a budget is given
    reasoning_tags: tuple[str, str] | None = None
    stop_strings: list[str] = field(init=False, repr=False)
    # Per-request lookups built once, so that a step's cost never grows with a list's length
    # (issue 44): a set for the stop check here; the arrays below on first use (by then
    # check_request has refused ids outside the vocabulary, which int64 may not hold).
    stop_token_set: frozenset[int] = field(init=False, repr=False, compare=False)
    _dense: dict[str, np.ndarray] = field(init=False, repr=False, compare=False)  # dense_row's, by name

    def __post_init__(self) -> None:
        self.stop_strings = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._token_id_lists()
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        if self.top_k == -1:
            self.top_k = 0
        if self.thinking_token_budget == -1:
            self.thinking_token_budget = None  # llama-server's spelling of unlimited
        if 0 < self.temperature < MIN_TEMPERATURE:  # vLLM's rule: 1e-300 would divide logits to inf and NaN
            self.temperature = MIN_TEMPERATURE
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
            if any(k < 0 for k in self.logit_bias) or not all(map(math.isfinite, self.logit_bias.values())):
                raise ValueError("logit_bias must map non-negative token ids to finite numbers")
        self._validate()
        self._validate_thinking()
        self.stop_token_set = frozenset(self.stop_token_ids)
        self._dense = {}

    @functools.cached_property
    def allowed_ids(self) -> np.ndarray | None:
        """allowed_token_ids as a sorted, duplicate-free array, for the sampler's mask."""
        return None if self.allowed_token_ids is None else np.array(sorted(self.allowed_token_ids), dtype=np.int64)

    @functools.cached_property
    def stop_token_array(self) -> np.ndarray:
        """(S,) int64: stop_token_ids sorted, each once (min_tokens' mask)."""
        return np.array(sorted(self.stop_token_set), dtype=np.int64)

    @functools.cached_property
    def logit_bias_ids(self) -> np.ndarray:
        """(K,) int64: logit_bias's token ids; logit_bias_values (K,) float32 are their biases."""
        return np.fromiter((self.logit_bias or {}).keys(), dtype=np.int64, count=len(self.logit_bias or ()))

    @functools.cached_property
    def logit_bias_values(self) -> np.ndarray:
        return np.fromiter((self.logit_bias or {}).values(), dtype=np.float32, count=len(self.logit_bias or ()))

    def _validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.temperature < 0:
            bad("temperature", "must be >= 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", "must be -1, 0 (disabled) or a positive integer")
        if not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if not -2 <= self.presence_penalty <= 2:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2 <= self.frequency_penalty <= 2:
            bad("frequency_penalty", "must be in [-2, 2]")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", "must be > 0")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", "must be an integer >= 1 (or None)")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        # The upper bound is the engine's --max-logprobs (LLMEngine.check_prompt).
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            bad("logprobs", "must be an integer >= 0")
        if self.prompt_logprobs is not None and (not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0):
            bad("prompt_logprobs", "must be an integer >= 0")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "must be an integer")
        if any(not s for s in self.stop_strings):
            bad("stop", "must not contain empty strings")
        bad_ids = [t for t in self.stop_token_ids if isinstance(t, bool) or not isinstance(t, int) or t < 0]
        if bad_ids:
            bad("stop_token_ids", "must be non-negative integer token ids")
        if not math.isfinite(self.length_penalty) or not -10 <= self.length_penalty <= 10:
            # length ** length_penalty must stay a finite, non-zero float for every length
            bad("length_penalty", "must be a number in [-10, 10]")
        if self.use_beam_search:
            if self.temperature != 0 and self.temperature != 1.0:
                bad(
                    "temperature",
                    "must be 0 with beam search (beams are chosen by log-probability)",
                )
            if self.early_stopping not in (True, False, "never"):
                bad("early_stopping", "must be True, False or 'never'")

    def _token_id_lists(self) -> None:
        """allowed_token_ids and logprob_token_ids (vLLM's rules and words): non-empty lists
        of ids >= 0, each kept once (the vocabulary is the engine's check); logprob_token_ids
        at most MAX_LOGPROB_TOKEN_IDS, never with beam search, and alone it asks for logprobs."""
        for name in ("allowed_token_ids", "logprob_token_ids"):
            ids = getattr(self, name)
            if ids is not None and (not isinstance(ids, (list, tuple)) or not ids):
                raise ValueError(f"{name} must be a non-empty list of token ids ({name} is not None and empty!)")
            if ids is not None and any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                raise ValueError(f"{name} must hold token ids (integers >= 0), got {list(ids)[:8]!r}")
            setattr(self, name, None if ids is None else list(dict.fromkeys(ids)))
        n = len(self.logprob_token_ids or ())
        if n > MAX_LOGPROB_TOKEN_IDS:
            raise ValueError(
                f"logprob_token_ids has {n} distinct ids (Requested logprob_token_ids of length {n}, "
                f"which is greater than max allowed: {MAX_LOGPROB_TOKEN_IDS})"
            )
        if n and self.use_beam_search:
            raise ValueError("logprob_token_ids is not supported with beam search")
        if n and self.logprobs is None:
            self.logprobs = 0  # vLLM's num_logprobs: the ids alone ask for logprobs

    def _validate_thinking(self) -> None:
        budget = self.thinking_token_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"thinking_token_budget must be an integer >= 0, or -1 / None (unlimited), got {budget!r}")
        if budget is not None and self.use_beam_search:
            raise ValueError("thinking_token_budget does not combine with beam search")

    def dense_row(self, name: str, vocab_size: int) -> np.ndarray | None:
        """A long id list as one (V,) float32 row to add to the logits, built on first use:
        "logit_bias" (the biases, 0 elsewhere) or "stop" (-inf at stop_token_ids, for
        min_tokens). A scatter to tens of thousands of ids costs ~200x a dense add of the same
        row (tests/test_step_cost_bounds.py). None while the list is short (a scatter is cheap)."""
        ids = self.logit_bias_ids if name == "logit_bias" else self.stop_token_array
        if len(ids) <= vocab_size // DENSE_FRACTION:
            return None
        row = self._dense.get(name)
        if row is None or len(row) != vocab_size:
            row = self._dense[name] = np.zeros(vocab_size, np.float32)
            row[ids] = self.logit_bias_values if name == "logit_bias" else -np.inf
        return row

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1
