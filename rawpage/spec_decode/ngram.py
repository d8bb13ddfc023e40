"""Prompt lookup (n-gram) proposer: no extra model.

If the last n tokens of a sequence (n from prompt_lookup_max down to prompt_lookup_min)
occurred earlier in its prompt or output, the k tokens that followed that earlier
occurrence are the draft. Text that copies from its context (editing, summarizing,
code changes, quoting) drafts well; free text drafts nothing and costs nothing.
"""

from __future__ import annotations

import numpy as np

from rawpage.sequence import Sequence


def ngram_lookup(tokens: np.ndarray, k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """tokens: (L,) int. Up to k tokens following the most recent earlier occurrence of the
    longest suffix (of lookup_max..lookup_min tokens) that occurred before; [] if none."""
    L = len(tokens)
    for n in range(min(lookup_max, L - 1), lookup_min - 1, -1):
        suffix = tokens[L - n :]
        # Starts i with at least one token after the match: i + n <= L - 1.
        starts = np.flatnonzero(tokens[: L - n] == suffix[0])
        if n > 1 and starts.size:
            window = tokens[starts[:, None] + np.arange(1, n)]  # (candidates, n - 1)
            starts = starts[(window == suffix[1:]).all(axis=1)]
        if starts.size:
            i = int(starts[-1]) + n
            return tokens[i : i + k].tolist()
    return []


class NgramProposer:
    def __init__(self, lookup_min: int, lookup_max: int) -> None:
        self.lookup_min, self.lookup_max = lookup_min, lookup_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Drafts of up to ks[i] tokens for each sequence (its token_ids hold no drafts yet)."""
        return [
            ngram_lookup(np.asarray(s.token_ids, dtype=np.int64), k, self.lookup_min, self.lookup_max)
            for s, k in zip(seqs, ks)
        ]

    def release(self, seq: Sequence) -> None:
        """Nothing is kept per sequence."""
