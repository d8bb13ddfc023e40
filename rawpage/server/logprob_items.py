"""OpenAI's per-token logprobs, as chat completions (`choices[].logprobs.content`) and the
Responses API (`output_text.logprobs`, with include ["message.output_text.logprobs"]) write
them: one item per generated token,

    {"token": "Hello", "logprob": -0.31, "bytes": [72, ...], "top_logprobs": [{"token", "logprob", "bytes"}, ...]}

from the engine's entries ({token id: Logprob(logprob, rank)}, the sampled token and the
top N by rank, or vLLM's logprob_token_ids instead of the top N).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def logprob_items(
    token_ids: list[int], entries: list, top_n: int, fixed_ids: bool, token: Callable[[int], str]
) -> list[dict[str, Any]]:
    """One item per token. top_logprobs: the entries ranked 1..top_n, best first; with
    logprob_token_ids (`fixed_ids`), every entry: the sampled token, then those ids (vLLM).
    `token` writes a token id as the reply shows it (its text, or "token_id:N")."""

    def item(tok: int, lp: float) -> dict[str, Any]:
        text = token(tok)
        return {"token": text, "logprob": max(lp, -9999.0), "bytes": list(text.encode("utf-8"))}

    out = []
    for tok, e in zip(token_ids, entries):
        if fixed_ids:
            top = [(0, t, v.logprob) for t, v in e.items()]
        else:
            top = sorted((v.rank, t, v.logprob) for t, v in e.items() if v.rank is not None and v.rank <= top_n)
        out.append({**item(tok, e[tok].logprob), "top_logprobs": [item(t, lp) for _, t, lp in top]})
    return out
