"""When does a sequence stop? EOS, stop tokens, stop strings, max_tokens, the context limit.

Checked after every new token, in this order. A stop by token (EOS or one of
stop_token_ids) leaves that token's text out; a stop string is cut out of the
text (unless include_stop_str_in_output) even if it spans several tokens.
"""

from __future__ import annotations

from rawpage.sequence import Sequence


def stop_string_holdback(seq: Sequence) -> int:
    """Characters of text to hold back while streaming: a stop string may be starting there."""
    p = seq.request.params
    if not p.stop_strings or p.include_stop_str_in_output:
        return 0
    return max(len(s) for s in p.stop_strings) - 1


def check_stop_token(seq: Sequence, eos_token_ids: list[int]) -> bool:
    p = seq.request.params
    token = seq.token_ids[-1]
    if seq.num_output_tokens < p.min_tokens:
        return False
    if token in p.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token
    elif not p.ignore_eos and token in eos_token_ids:
        seq.finish_reason = "stop"
    return seq.finish_reason is not None


def check_stop_string(seq: Sequence, text: str, new_text: str) -> str | None:
    """Find the earliest stop string that ends inside the new text at the end of `text` (it
    may have begun in earlier tokens). Returns the text cut there, or None if none ended."""
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
    seq.finish_reason, seq.stop_reason = "stop", stop
    return text[: at + len(stop) if p.include_stop_str_in_output else at]


def check_length(seq: Sequence, max_model_len: int) -> bool:
    p = seq.request.params
    if (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or seq.num_tokens >= max_model_len:
        seq.finish_reason = "length"
    return seq.finish_reason is not None
