"""How many tokens each sequence may draft this step: speculation that backs off where it
does not pay.

A verification step costs more than a decode step: on a GPU little (the weights are read
once either way), on a CPU up to about 2x (BLAS is less efficient at 2..5 rows than at
one; docs/benchmarks.md). Drafts that are mostly rejected are then a net loss: an ordinary
chat answer drafted by prompt lookup ran at 0.73x without this. So each sequence keeps:

    k      its draft length: +2 after a draft accepted whole (up to num_speculative_tokens),
           -1 after one cut short (at least 1), as in transformers' "heuristic" schedule;
    skip   steps to sit out: after a draft with no token accepted, the next 1, 2, 4, ...
           MAX_BACKOFF steps draft nothing, doubling while drafts keep failing outright,
           and back to none at the first accepted token.

A draft that is accepted keeps drafting at full speed; text that copies its context
(editing, quoting, code) backs off only where the copying stops. The choice of k depends
only on past outcomes, so rejection sampling still keeps the target's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BACKOFF = 16  # the longest run of steps a sequence sits out after failed drafts


@dataclass
class _Budget:
    k: int
    skip: int = 0
    backoff: int = 0  # the next sit-out after a draft with nothing accepted


class DraftLengths:
    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self.budgets: dict[int, _Budget] = {}  # seq_id -> its budget

    def allowed(self, seq_id: int) -> int:
        """Tokens the sequence may draft this step: 0 while it sits out (which uses up one
        step of its sit-out)."""
        b = self.budgets.setdefault(seq_id, _Budget(self.k_max))
        if b.skip:
            b.skip -= 1
            return 0
        return b.k

    def update(self, seq_id: int, drafted: int, accepted: int) -> None:
        """After verifying a draft of `drafted` tokens, `accepted` of them accepted."""
        b = self.budgets.setdefault(seq_id, _Budget(self.k_max))
        b.k = min(self.k_max, b.k + 2) if accepted == drafted else max(1, b.k - 1)
        if accepted:
            b.backoff = 0
        else:
            b.skip = b.backoff = min(MAX_BACKOFF, max(1, 2 * b.backoff))

    def keep_only(self, seq_ids: set[int]) -> None:
        """Forget sequences no longer running (finished, aborted, preempted)."""
        self.budgets = {s: b for s, b in self.budgets.items() if s in seq_ids}
