"""When does a sequence stop? EOS, stop tokens, stop strings, max_tokens, the context limit.

Checked after every new token, in this order. A stop by token (EOS or one of
stop_token_ids) leaves that token's text out; a stop string is cut out of the
text (unless include_stop_str_in_output) even if it spans several tokens.

Each check says what should happen, a `Stop` (finish reason, stop reason) or None;
the scheduler applies it (Scheduler.finish).
"""

from __future__ import annotations

from typing import Any, Protocol

from rawpage.sequence import Sequence

Stop = tuple[str, int | str | None]  # (finish_reason, stop_reason): ("stop", 2), ("length", None)


class TokenChecks(Protocol):
    """What Scheduler.postprocess asks of the output processor (output_processor.py)."""

    def sampled(self, seq: Sequence, out: Any, i: int, now: float) -> tuple[int, float, dict | None]: ...

    def check_stop(self, seq: Sequence) -> Stop | None: ...


def stop_string_holdback(seq: Sequence) -> int:
    """Characters of text to hold back while streaming: a stop string may be starting there."""
    p = seq.request.params
    if not p.stop_strings or p.include_stop_str_in_output:
        return 0
    return max(len(s) for s in p.stop_strings) - 1


def check_stop_token(seq: Sequence, eos_token_ids: list[int]) -> Stop | None:
    p = seq.request.params
    token = seq.token_ids[-1]
    if seq.num_output_tokens < p.min_tokens:
        return None
    if token in p.stop_token_set:  # O(1) whatever the list's length
        return "stop", token
    if not p.ignore_eos and token in eos_token_ids:
        return "stop", None
    return None


def check_stop_string(seq: Sequence, text: str, new_text: str) -> tuple[str, str] | None:
    """Find the earliest stop string that ends inside the new text at the end of `text` (it
    may have begun in earlier tokens). Returns (the text cut there, the stop string), or
    None if none ended."""
    p = seq.request.params
    if not p.stop_strings or not new_text or seq.num_output_tokens < p.min_tokens:
        return None
    best: tuple[int, str] | None = None
    for stop in p.stop_strings:
        # the match must overlap the new text: start searching len(stop) - 1 chars before it
        at = text.find(stop, max(0, len(text) - len(new_text) - len(stop) + 1))
        if at != -1 and (best is None or at < best[0]):
            best = (at, stop)
    if best is None:
        return None
    at, stop = best
    return text[: at + len(stop) if p.include_stop_str_in_output else at], stop


def check_length(seq: Sequence, max_model_len: int) -> Stop | None:
    p = seq.request.params
    if (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or seq.num_tokens >= max_model_len:
        return "length", None
    return None
