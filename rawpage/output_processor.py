"""OutputProcessor: sampled tokens -> text and RequestOutputs.

After the sampler, each sampled row becomes a token and its logprobs entry
(`sampled`), which the scheduler appends; then the sequence's text is extended by
incremental detokenization and its stop conditions checked (`check_stop`: EOS and
stop tokens, stop strings across token boundaries, max_tokens, the context limit).
A stop is a decision the scheduler applies at once, so that the sequence's KV blocks
are freed in the same step (LLMEngine._append). Then each touched request becomes a
RequestOutput with cumulative fields and this step's deltas.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from rawpage.beam_search import final_hypotheses
from rawpage.ops.sampling import log_softmax, top_k_ids
from rawpage.outputs import CompletionOutput, RequestOutput
from rawpage.sampler import SamplerOutput
from rawpage.sequence import Logprob, Request, Sequence
from rawpage.stop_checker import Stop, check_length, check_stop_string, check_stop_token, stop_string_holdback
from rawpage.text.detokenizer import IncrementalDetokenizer, complete_text
from rawpage.text.tokenizer import Tokenizer

logger = logging.getLogger("rawpage")


@dataclass
class SequenceText:
    """The output side of one sequence: its text and what was already reported."""

    detokenizer: IncrementalDetokenizer
    text: str = ""  # generated text so far, stop strings removed
    num_emitted_tokens: int = 0  # tokens already reported in outputs
    num_emitted_chars: int = 0


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token_ids: list[int],
        vocab_size: int,
        max_model_len: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.texts: dict[int, SequenceText] = {}  # seq_id -> its text, until its request's last output
        self.token_texts: dict[int, str] = {}  # token id -> its text, for logprobs (at most the vocabulary)

    def record_prompt_logprobs(self, req: Request, start: int, logits: np.ndarray) -> None:
        """logits row j (position start + j) predicts prompt token start + j + 1."""
        k = req.params.prompt_logprobs
        ids = req.prompt_token_ids
        lps = log_softmax(logits[:, : self.vocab_size])
        for j in range(len(lps)):
            pos = start + j + 1
            if pos >= len(ids) or pos < len(req.prompt_logprobs):
                continue
            tok = ids[pos]
            entry = {tok: self._logprob(tok, float(lps[j, tok]), int((lps[j] > lps[j, tok]).sum()) + 1)}
            for rank, t in enumerate(top_k_ids(lps[j], k) if k else [], start=1):
                entry.setdefault(int(t), self._logprob(int(t), float(lps[j, t]), rank))
            req.prompt_logprobs.append(entry)

    def sampled(self, seq: Sequence, out: SamplerOutput, i: int, now: float) -> tuple[int, float, dict | None]:
        """Row i of the sampler's output for `seq`: (token, its logprob, the logprobs entry
        to report, if the request asked for logprobs). The scheduler appends them."""
        tok, lp = int(out.token_ids[i]), float(out.logprobs[i])
        entry = None
        if seq.request.params.logprobs is not None:
            entry = {tok: self._logprob(tok, lp, int(out.ranks[i]))}
            given = out.top_ranks[i] if out.top_ranks is not None else None  # logprob_token_ids' real ranks
            ranks = given if given is not None else range(1, len(out.top_ids[i]) + 1)
            for rank, t, v in zip(ranks, out.top_ids[i], out.top_logprobs[i]):
                entry.setdefault(int(t), self._logprob(int(t), float(v), int(rank)))
        m = seq.request.metrics
        m.first_token_time = m.first_token_time or now
        return tok, 0.0 if np.isnan(lp) else lp, entry

    def check_stop(self, seq: Sequence) -> Stop | None:
        """After the scheduler appended a token: its text, and whether the sequence stops
        (EOS or a stop token, a stop string, its grammar's error state, max_tokens or the
        context limit). Says what should happen; the scheduler finishes the sequence."""
        stop = check_stop_token(seq, self.eos_token_ids)
        if stop is None:
            st = self._text(seq)
            delta = st.detokenizer.add([seq.token_ids[-1]])
            st.text += delta
            cut = check_stop_string(seq, st.text, delta)
            if cut is not None:
                st.text, stop = cut[0], ("stop", cut[1])
        if seq.grammar is not None and seq.grammar.error is not None:
            stop = _grammar_error_stop(seq)
        return stop or check_length(seq, self.max_model_len)

    def make_output(self, req: Request) -> RequestOutput:
        """The request's output after this step: cumulative text and tokens, plus the deltas
        since the last output (text that may still become a stop string is held back)."""
        if req.beam is not None:
            return self._beam_output(req)
        outs = []
        for seq in req.seqs:
            st = self._text(seq)
            visible = st.text
            hold = stop_string_holdback(seq)
            if hold and not seq.is_finished:
                visible = visible[: max(st.num_emitted_chars, len(visible) - hold)]
            toks = seq.output_token_ids
            lps = seq.logprobs if req.params.logprobs is not None else None
            outs.append(
                CompletionOutput(
                    index=seq.index,
                    text=visible,
                    token_ids=list(toks),
                    cumulative_logprob=seq.cumulative_logprob if req.params.logprobs is not None else None,
                    logprobs=lps,
                    finish_reason=seq.finish_reason,
                    stop_reason=seq.stop_reason,
                    delta_text=visible[st.num_emitted_chars :],
                    delta_token_ids=list(toks[st.num_emitted_tokens :]),
                    delta_logprobs=lps[st.num_emitted_tokens :] if lps is not None else None,
                    grammar_error=getattr(seq.grammar, "error", None),
                    reasoning_tokens=seq.thinking.num_reasoning_tokens if seq.thinking is not None else None,
                )
            )
            st.num_emitted_chars, st.num_emitted_tokens = len(visible), len(toks)
        finished = req.is_finished
        if finished:
            req.metrics.finished_time = time.time()
            self.forget(req)
        return _request_output(req, req.prompt_logprobs, outs, finished)

    def failed_output(self, req: Request) -> RequestOutput:
        """The final output of a request whose output could not be made: its error, no completions."""
        return _request_output(req, None, [], True)

    def _logprob(self, token_id: int, logprob: float, rank: int) -> Logprob:
        """A Logprob with the token's own text, as vLLM fills decoded_token."""
        text = self.token_texts.get(token_id)
        if text is None:  # decoded once: every entry naming this token shares the string
            text = self.token_texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return Logprob(logprob, rank, text)

    def _text(self, seq: Sequence) -> SequenceText:
        st = self.texts.get(seq.seq_id)
        if st is None:
            p = seq.request.params
            detok = IncrementalDetokenizer(self.tokenizer, seq.request.prompt_token_ids, p.skip_special_tokens)
            st = self.texts[seq.seq_id] = SequenceText(detok)
        return st

    def forget(self, req: Request) -> None:
        """Drop the text state of a request's sequences once its last output is made."""
        for seq in req.seqs:
            self.texts.pop(seq.seq_id, None)

    def _beam_output(self, req: Request) -> RequestOutput:
        """Beam search reports once, at the end: the best `n` hypotheses, best first."""
        outs = []
        if req.is_finished:
            hyps = req.beam.results or final_hypotheses(req.beam, [], "abort")
            for i, h in enumerate(hyps):
                text = complete_text(self.tokenizer, h.token_ids, req.params.skip_special_tokens)
                outs.append(
                    CompletionOutput(
                        i, text, h.token_ids, h.cumulative_logprob, None, h.finish_reason, None, text, list(h.token_ids)
                    )
                )
            req.metrics.finished_time = time.time()
        return _request_output(req, req.prompt_logprobs, outs, req.is_finished)


def _request_output(
    req: Request,
    prompt_logprobs: list[dict[int, Logprob] | None] | None,
    outs: list[CompletionOutput],
    finished: bool,
) -> RequestOutput:
    """The request's RequestOutput with these completions; its metrics and error as they stand."""
    return RequestOutput(
        req.request_id,
        req.prompt,
        req.prompt_token_ids,
        prompt_logprobs,
        outs,
        finished,
        req.metrics,
        req.num_cached_tokens,
        req.error,
    )


def _grammar_error_stop(seq: Sequence) -> Stop:
    """The grammar reached its error state (GrammarState.mask allowed only EOS): the
    output is cut short here. It ends "length", flagged in CompletionOutput.grammar_error,
    never "stop", which would pass a broken output off as one the grammar accepted."""
    logger.warning(
        "request %s: its grammar allows no next token (%s); ending it", seq.request.request_id, seq.grammar.error
    )
    return "length", None
