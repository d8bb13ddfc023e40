"""Beam search (vLLM's `use_beam_search`, with `n` as the beam width).

The beams of a request are ordinary sequences. Every step, once all live beams
have their next-token log-probabilities, we score the 2 * width best
continuations of each, keep the `width` best overall, and re-point sequences:
a beam chosen k times is forked k - 1 times (its children share its KV blocks
by reference; only a shared, partially filled last block is copied when a child
writes into it), and a beam not chosen is dropped (its references released).
Candidates ending in EOS become finished hypotheses, as in Hugging Face's
BeamSearchScorer; the result is the `width` best hypotheses by
cumulative log-probability / length ** length_penalty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from rawpage.ops.sampling import log_softmax
from rawpage.sampler import Sampler
from rawpage.sequence import Request, Sequence

if TYPE_CHECKING:
    from rawpage.device_logits import DeviceLogits
    from rawpage.forking import Forker
    from rawpage.scheduler import Scheduler


@dataclass
class Hypothesis:
    token_ids: list[int]  # generated tokens
    cumulative_logprob: float
    score: float
    finish_reason: str


@dataclass
class BeamState:
    width: int
    length_penalty: float
    early_stopping: bool | str
    finished: list[Hypothesis] = field(default_factory=list)  # best first
    pending: dict[int, np.ndarray] = field(default_factory=dict)  # seq_id -> logprobs (V,) of its next token
    done: bool = False
    results: list[Hypothesis] = field(default_factory=list)  # the final best `width`, once done

    def add(self, hyp: Hypothesis) -> None:
        self.finished.append(hyp)
        self.finished.sort(key=lambda h: h.score, reverse=True)
        del self.finished[self.width :]


def beam_score(cumulative_logprob: float, seq_len: int, length_penalty: float) -> float:
    """vLLM's (and HF's) length-normalised score; seq_len counts prompt and output."""
    return cumulative_logprob / (seq_len**length_penalty)


def select(
    state: BeamState, beams: list[Sequence], logprobs: np.ndarray, eos_ids: set[int], ignore_eos: bool
) -> list[tuple[Sequence, int, float]]:
    """logprobs: (len(beams), V). Returns up to `width` (parent beam, token, token logprob),
    best first; EOS candidates among the top `width` become finished hypotheses. A
    candidate at -inf is one the grammar (or a ban) forbids: never a beam, so a grammar
    that allows fewer tokens than `width` leaves fewer beams."""
    k = min(2 * state.width, logprobs.shape[1])
    cand = np.argpartition(-logprobs, k - 1, axis=1)[:, :k]  # (beams, k) token ids
    cand_lp = np.take_along_axis(logprobs, cand, axis=1)
    total = cand_lp + np.array([b.cumulative_logprob for b in beams])[:, None]  # cumulative if chosen
    order = np.argsort(-total, axis=None, kind="stable")
    chosen: list[tuple[Sequence, int, float]] = []
    for rank, flat in enumerate(order):
        if not np.isfinite(total.flat[flat]):
            break  # best first: every candidate left is forbidden too
        i, j = divmod(int(flat), k)
        beam, token, lp = beams[i], int(cand[i, j]), float(cand_lp[i, j])
        if token in eos_ids and not ignore_eos:
            if rank < state.width:  # only a top-ranked EOS ends a hypothesis
                cum = beam.cumulative_logprob + lp
                # The EOS itself does not count towards the length, as in vLLM.
                state.add(
                    Hypothesis(
                        beam.output_token_ids + [token],
                        cum,
                        beam_score(cum, beam.num_tokens, state.length_penalty),
                        "stop",
                    )
                )
            continue
        chosen.append((beam, token, lp))
        if len(chosen) == state.width:
            break
    return chosen


def is_done(state: BeamState, beams: list[Sequence], max_len: int) -> bool:
    """Can no running beam beat the worst of `width` finished hypotheses any more?"""
    if len(state.finished) < state.width:
        return False
    if state.early_stopping is True:
        return True
    best = max(b.cumulative_logprob for b in beams)
    cur_len = beams[0].num_tokens
    if state.early_stopping == "never" and state.length_penalty > 0:
        best_possible = beam_score(best, max_len, state.length_penalty)  # it may still grow
    else:
        best_possible = beam_score(best, cur_len, state.length_penalty)
    return state.finished[-1].score >= best_possible


def final_hypotheses(state: BeamState, beams: list[Sequence], finish_reason: str) -> list[Hypothesis]:
    """The `width` best of the finished hypotheses and the beams still running."""
    for b in beams:
        state.add(
            Hypothesis(
                b.output_token_ids,
                b.cumulative_logprob,
                beam_score(b.cumulative_logprob, b.num_tokens, state.length_penalty),
                finish_reason,
            )
        )
    return list(state.finished)


class BeamSearch:
    """The engine's side of beam search: after a forward pass, stash each beam's next-token
    log-probabilities, and advance a request once all its live beams have theirs (beams of
    one request may be computed in different steps, e.g. after a preemption). Which beams
    fork, drop, take which token and finish is decided here; the scheduler does it."""

    def __init__(
        self, sampler: Sampler, forker: Forker, scheduler: Scheduler, eos_token_ids: list[int], max_model_len: int
    ) -> None:
        self.sampler = sampler
        self.forker = forker
        self.scheduler = scheduler
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len

    def step(self, rows: list[tuple[Sequence, int]], logits: DeviceLogits) -> list[tuple[Request, Exception]]:
        """rows: (beam, its row of logits (T', V)) for every beam that completed its tokens.
        Returns the requests that failed, with why (the engine fails them; the others go on)."""
        reqs, failed = {}, []
        for seq, row in rows:
            if seq.is_finished:
                continue
            try:
                processed = self.sampler.apply_processors(
                    logits[row : row + 1, : self.sampler.vocab_size].copy(), [seq]
                )
                seq.request.beam.pending[seq.seq_id] = log_softmax(processed)[0]
                reqs[seq.request.request_id] = seq.request
            except Exception as e:  # noqa: BLE001 - isolated to this request
                failed.append((seq.request, e))
        for req in reqs.values():
            live = [s for s in req.seqs if not s.is_finished]
            ok = req.error is None and not any(r is req for r, _ in failed)
            if ok and all(s.seq_id in req.beam.pending for s in live):
                try:
                    self._advance(req, live)
                except Exception as e:  # noqa: BLE001 - isolated to this request
                    failed.append((req, e))
        return failed

    def _advance(self, req: Request, live: list[Sequence]) -> None:
        st, p = req.beam, req.params
        req.forked = True  # its beams now take one seat each
        rows = np.stack([st.pending.pop(s.seq_id) for s in live])  # (beams, V)
        chosen = select(st, live, rows, self.eos_token_ids, p.ignore_eos)
        # Forks first, from the parents as they are; then drops; then every beam gets its token.
        assigned, seen = [], set()
        for parent, tok, lp in chosen:
            beam = parent if parent.seq_id not in seen else self.forker.fork(req, parent, len(req.seqs))
            seen.add(parent.seq_id)
            assigned.append((beam, tok, lp))
        for s in live:
            if s.seq_id not in seen:
                self.scheduler.finish(s)
                req.seqs.remove(s)
        for beam, tok, lp in assigned:
            self.scheduler.append_token(beam, tok, lp)
        beams = [b for b, _, _ in assigned]
        if not beams or self._at_limit(p.max_tokens, beams) or is_done(st, beams, self.max_model_len):
            st.results = final_hypotheses(st, beams, "length")
            for b in beams:
                self.scheduler.finish(b, "length")
            st.done = True

    def _at_limit(self, max_tokens: int | None, beams: list[Sequence]) -> bool:
        """Has any beam reached max_tokens or the context limit?"""
        return any(
            (max_tokens is not None and b.num_output_tokens >= max_tokens) or b.num_tokens >= self.max_model_len
            for b in beams
        )
