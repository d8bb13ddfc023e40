"""Sampler: logits -> next tokens, for a whole batch with per-sequence parameters.

Order of operations, as in vLLM:
    allowed_token_ids (every other token to -inf)                     [rows that give it]
    logit_bias, min_tokens (suppress EOS/stop tokens), penalties      [all rows]
    grammar masks (structured outputs: forbidden tokens to -inf)      [constrained rows]
    greedy rows: argmax
    sampled rows: / temperature -> top_k -> softmax -> min_p -> top_p -> draw
Each sequence draws exactly one uniform number per token from its own seeded
generator, so what it samples never depends on the rest of the batch.
Logprobs are reported from the raw model distribution (before any processing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rawpage.device_logits import DeviceLogits
from rawpage.ops.sampling import inverse_cdf, kth_largest, log_softmax, nucleus_mask, top_k_ids
from rawpage.sampling_params import SamplingParams
from rawpage.sequence import Sequence
from rawpage.structured_output import apply_masks
from rawpage.thinking_budget import force_end_tags


@dataclass
class SamplerOutput:
    token_ids: np.ndarray  # (N,) int
    logprobs: np.ndarray  # (N,) float, raw logprob of each sampled token (nan if not asked)
    top_ids: list[np.ndarray | None]  # per row, top-N token ids if logprobs were asked
    top_logprobs: list[np.ndarray | None]
    ranks: np.ndarray  # (N,) rank of the sampled token in the raw distribution (1 = best)
    top_ranks: list[np.ndarray | None] | None = None  # per row, the ranks of top_ids (None: 1, 2, 3...)


class Sampler:
    def __init__(
        self, vocab_size: int, eos_token_ids: list[int], masks: Callable[[Sequence], np.ndarray | None] | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.eos_ids = np.array(eos_token_ids, dtype=np.int64)
        self.masks = masks  # seq -> its grammar bitmask, computed during the forward pass (MaskPrefetcher.mask)

    def __call__(self, logits: np.ndarray, seqs: list[Sequence]) -> SamplerOutput:
        """logits: (N, V) float32, one row per sequence in `seqs`."""
        logits = logits[:, : self.vocab_size].astype(np.float32)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # overflow is caught below
            processed = self.apply_processors(logits.copy(), seqs)
            tokens = np.empty(len(seqs), dtype=np.int64)
            greedy = np.array([s.request.params.greedy for s in seqs], dtype=bool)
            tokens[greedy] = greedy_tokens(processed[greedy], logits[greedy])
            if (~greedy).any():
                rows = np.flatnonzero(~greedy)
                tokens[rows] = self.sample(processed[rows], [seqs[i] for i in rows], logits[rows])
        return self.report(logits, tokens, seqs)

    def report(self, logits: np.ndarray, tokens: np.ndarray, seqs: list[Sequence]) -> SamplerOutput:
        """The chosen tokens (N,) with logprobs from the raw rows (N, V) where asked."""
        n = len(seqs)
        # Raw logprobs only for the rows that report them (a log-softmax over V is not free).
        want = np.array(
            [s.request.params.logprobs is not None or s.request.params.use_beam_search for s in seqs], dtype=bool
        )
        raw = log_softmax(logits[want, : self.vocab_size]) if want.any() else None
        picked = np.full(n, np.nan)
        ranks = np.zeros(n, dtype=np.int64)
        top_ids: list[np.ndarray | None] = [None] * n
        top_lps: list[np.ndarray | None] = [None] * n
        top_ranks: list[np.ndarray | None] = [None] * n
        for j, i in enumerate(np.flatnonzero(want)):
            picked[i] = raw[j, tokens[i]]
            ranks[i] = int((raw[j] > picked[i]).sum()) + 1
            k = seqs[i].request.params.logprobs
            chosen = seqs[i].request.params.logprob_token_ids  # fixed ids (vLLM) instead of the top k
            if chosen:
                top_ids[i] = np.asarray(chosen, dtype=np.int64)
                top_ranks[i] = ranks_of(raw[j], top_ids[i])
            elif k is not None:  # k may be 0: just the sampled token's own logprob
                top_ids[i] = top_k_ids(raw[j], k)
            if top_ids[i] is not None:
                top_lps[i] = raw[j, top_ids[i]]
        return SamplerOutput(tokens, picked, top_ids, top_lps, ranks, top_ranks)

    def sample_rows(self, logits: DeviceLogits, rows: list[int], seqs: list[Sequence]) -> SamplerOutput:
        """Sample seqs[i] from row rows[i] of logits that may still be on the GPU.

        When every sequence is plainly greedy (nothing edits its logits, no logprobs
        asked), the answer is the raw argmax: it is taken on the device and only
        the token ids are copied back. Otherwise the rows come to the host."""
        if not all(plain_greedy(s) for s in seqs):
            return self(logits[rows], seqs)
        n = len(seqs)
        tokens = logits.argmax(rows)
        return SamplerOutput(tokens, np.full(n, np.nan), [None] * n, [None] * n, np.zeros(n, dtype=np.int64))

    def apply_processors(self, logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
        """Per-request logit edits, in vLLM's order. (N, V) in place."""
        V = self.vocab_size
        allowed_only(logits, seqs)
        for i, s in enumerate(seqs):
            p = s.request.params
            if p.logit_bias:
                add_id_list(logits[i], p, "logit_bias")
            if s.num_output_tokens < p.min_tokens:
                add_id_list(logits[i], p, "stop")
                logits[i, self.eos_ids[: 0 if p.ignore_eos else None]] = -np.inf  # EOS too, unless ignored
            if p.repetition_penalty != 1.0:  # over prompt and output tokens
                seen = np.unique(s.token_ids)
                seen = seen[seen < V]
                v = logits[i, seen]
                rp = p.repetition_penalty
                logits[i, seen] = np.where(v > 0, v / rp, v * rp)
            if p.presence_penalty or p.frequency_penalty:  # over output tokens
                counts = np.bincount(s.output_token_ids, minlength=V)[:V]
                logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        if any(s.grammar is not None for s in seqs):  # last: no bias or penalty can revive a forbidden token
            apply_masks(logits, seqs, self.masks)
        force_end_tags(logits, seqs)  # a spent thinking budget: the end tag's next token, whatever else
        return logits

    def sample(self, logits: np.ndarray, seqs: list[Sequence], raw: np.ndarray | None = None) -> np.ndarray:
        """Sampled rows: (R, V) processed logits -> (R,) token ids; raw: the same rows unprocessed."""
        probs = self.probs(logits, seqs, raw)
        # One uniform per sequence from its own generator; inverse CDF over the row.
        return np.array([inverse_cdf(row, s.rng.random()) for row, s in zip(probs, seqs)], dtype=np.int64)

    def probs(self, logits: np.ndarray, seqs: list[Sequence], raw: np.ndarray | None = None) -> np.ndarray:
        """The distribution sampled rows draw from: (R, V) processed logits (edited in place)
        -> temperature, top_k, softmax, min_p, top_p -> (R, V) probabilities (unnormalized
        after min_p/top_p: zeroed tokens are simply not drawn). A row with no finite maximum
        (parameters that overflowed float32, or no token allowed) gets all its mass on
        greedy_tokens' choice, ties broken by `raw` (R, V), the unprocessed rows, where given."""
        temps = np.array([s.request.params.temperature for s in seqs], dtype=np.float32)
        logits /= temps[:, None]
        for i, s in enumerate(seqs):
            k = s.request.params.top_k
            if 0 < k < logits.shape[1]:
                logits[i, logits[i] < kth_largest(logits[i], k)] = -np.inf
        top = logits.max(axis=-1, keepdims=True)  # (R, 1)
        undefined = np.flatnonzero(~np.isfinite(top[:, 0]))  # overflowed (+inf, NaN), or every token forbidden
        if undefined.size:  # softmax's limit: all the row's mass on one token
            source = logits if raw is None else raw  # (row by row: views, not copies of the rows)
            best = np.array([greedy_tokens(logits[i : i + 1], source[i : i + 1])[0] for i in undefined])
            logits[undefined] = -np.inf
            logits[undefined, best] = top[undefined, 0] = 0.0
        probs = np.exp(logits - top)
        probs /= probs.sum(axis=-1, keepdims=True)
        min_p = np.array([s.request.params.min_p for s in seqs], dtype=np.float32)
        if min_p.any():
            probs[probs < min_p[:, None] * probs.max(axis=-1, keepdims=True)] = 0.0
        for i, s in enumerate(seqs):
            if s.request.params.top_p < 1.0:
                nucleus_mask(probs[i], s.request.params.top_p)
        return probs


def allowed_only(logits: np.ndarray, seqs: list[Sequence]) -> None:
    """vLLM's allowed_token_ids, first: every other token of the row to -inf. (N, V) in
    place; the ids were sorted once per request (SamplingParams.allowed_ids)."""
    for i, s in enumerate(seqs):
        ids = s.request.params.allowed_ids
        if ids is not None:
            keep = logits[i, ids]
            logits[i] = -np.inf
            logits[i, ids] = keep


def ranks_of(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The ranks (1 = best) of `ids` in one row of logprobs (V,): one sort, then a binary search per id."""
    ascending = np.sort(row)
    return len(row) - np.searchsorted(ascending, row[ids], side="right") + 1


def add_id_list(row: np.ndarray, p: SamplingParams, name: str) -> None:
    """One row (V,) += a request's list, "logit_bias" (its biases) or "stop" (-inf at its stop
    ids, for min_tokens). The lists became arrays once per request (SamplingParams), their ids
    < V (check_request), and each is one vectorised op: a scatter to few ids, or the add of
    the list's dense row for many."""
    dense = p.dense_row(name, len(row))
    if dense is not None:
        row += dense
    elif name == "logit_bias":
        row[p.logit_bias_ids] += p.logit_bias_values
    else:
        row[p.stop_token_array] = -np.inf


def greedy_tokens(edited: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """(R, V) processed logits -> (R,) argmax. Where the row's best value is not finite, the
    choice is softmax's limit: among the tokens at +inf (repetition_penalty 1e-300 overflows
    seen tokens' positive logits to it), or else among all (every token forbidden, or NaN),
    the one the raw logits (R, V) rank first. Such a request gets greedy text, never a
    draw from NaN (issue 44)."""
    best = edited.argmax(axis=-1)
    values = edited[np.arange(len(best)), best]
    odd = np.flatnonzero(~np.isfinite(values))
    for i in odd[values[odd] == -np.inf]:  # every token forbidden: one argmax of the raw row (a view)
        best[i] = raw[i].argmax()
    odd = odd[values[odd] != -np.inf]  # the rest: NaN or +inf somewhere (the argmax finds either)
    if odd.size:
        e = edited[odd]
        tied = e == np.inf  # overflowed: the tokens at +inf tie
        none = ~tied.any(axis=-1)  # else every token forbidden (or NaN): the model's own choice
        tied[none] = True
        best[odd] = np.where(tied, raw[odd], -np.inf).argmax(axis=-1)
    return best


def plain_greedy(s: Sequence) -> bool:
    """Greedy with no logit edits (apply_processors would change nothing) and no logprobs."""
    p = s.request.params
    return (
        p.greedy
        and not p.logit_bias
        and p.allowed_ids is None
        and s.num_output_tokens >= p.min_tokens
        and p.repetition_penalty == 1.0
        and not p.presence_penalty
        and not p.frequency_penalty
        and p.logprobs is None
        and not p.use_beam_search
        and s.grammar is None
        and (s.thinking is None or s.thinking.forced_token() is None)
    )
