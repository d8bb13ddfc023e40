"""vLLM's truncate_prompt_tokens and truncation_side: keep only k of a prompt's tokens.

"left" drops tokens from the start (the last k stay: vLLM's side for generation, where
the end of a prompt is what the reply continues); "right" drops them from the end (the
first k stay: vLLM's side for pooling models). -1 means as many as fit: --max-model-len
less the tokens the request may generate.
"""

from __future__ import annotations

from dataclasses import dataclass

TRUNCATION_SIDES = ("left", "right")


@dataclass(frozen=True)
class PromptTruncation:
    """How a request's prompt is cut, its -1 already resolved to a count."""

    keep: int  # tokens to keep, >= 0
    side: str  # "left" or "right" (TRUNCATION_SIDES)

    def apply(self, ids: list[int]) -> list[int]:
        return truncate(ids, self.keep, self.side)


def truncate(ids: list[int], keep: int, side: str) -> list[int]:
    """The `keep` tokens of `ids` that `side` leaves (all of them if there are no more)."""
    if len(ids) <= keep:
        return ids
    return ids[len(ids) - keep :] if side == "left" else ids[:keep]


def resolve(given: int, side: str, max_input_tokens: int, names: str) -> PromptTruncation:
    """truncate_prompt_tokens as given (-1, or a count) -> a PromptTruncation; ValueError
    (vLLM's words after ours) when the count is more than the prompt may hold. `names`
    says what max_input_tokens is, e.g. "max_model_len - max_tokens"."""
    if given < -1:
        raise ValueError(f"truncate_prompt_tokens must be -1 or >= 0, got {given} (greater_than_equal)")
    if side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation_side must be 'left' or 'right', got {str(side)[:32]!r}")
    if max_input_tokens < 1:
        raise ValueError(f"truncate_prompt_tokens: {names} is {max_input_tokens}, which leaves no room for a prompt")
    keep = max_input_tokens if given == -1 else given
    if keep > max_input_tokens:
        raise ValueError(
            f"truncate_prompt_tokens is {given}, more than the {max_input_tokens} tokens the prompt may hold "
            f"(truncate_prompt_tokens={given} cannot be greater than {names} = {max_input_tokens}. "
            "Please request a smaller truncation size.)"
        )
    return PromptTruncation(keep, side)
