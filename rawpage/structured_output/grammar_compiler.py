"""The engine's grammar work, off its thread: compiling each constraint once (GrammarCompiler)
and each step's allowed-token masks while the forward pass runs (MaskPrefetcher).

    submit(so) ──► gate (grammar_limits) ──► child validates (grammar_validator) ──► build LLMatcher
        │            a 400 naming the flag      a crash or timeout: a 400             on a big-stack thread
        └─► Future[CompiledGrammar], cached per grammar text (MatcherCache)

Compiling a 50,000-item choice takes seconds; on the engine thread it stalled every
stream, once per prompt. Here it runs on a few threads of its own (not the server's
template and tokenization threads), once per grammar text: each request gets a
deep_copy() of the cached, never-advanced matcher. The scheduler leaves a sequence
waiting until its grammar's future is done (vLLM's WAITING_FOR_FSM).

Each step, MaskPrefetcher fills the bitmasks of the constrained sequences about to sample on
a worker thread while the forward pass runs; the sampler reads them (apply_masks).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from rawpage.errors import InvalidRequestError
from rawpage.structured_output import GrammarState, StructuredOutputsParams
from rawpage.structured_output.closing import Closer
from rawpage.structured_output.grammar_limits import GrammarLimits, check_grammar_limits
from rawpage.structured_output.grammar_validator import COMPILE_STACK_BYTES, GrammarTooComplexError, GrammarValidator
from rawpage.structured_output.reasoning_gate import OPEN, ReasoningGate, TokenTexts, prompt_phase

logger = logging.getLogger("rawpage")

COMPILE_THREADS = 2  # grammars compiling at once; each has its own validator child
CACHED_GRAMMARS = 64  # compiled matchers kept (and refusals remembered), least recently used out


class CompiledGrammar:
    """A compiled, never-advanced matcher; every sequence starts from a copy of it."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher
        self._lock = threading.Lock()  # copies are taken from the engine and mask threads

    def fresh(self) -> Any:
        with self._lock:
            return self._matcher.deep_copy()


class MatcherCache:
    """A locked LRU: grammar text -> Future[CompiledGrammar], at most `capacity` entries.
    A future that failed stays too, so a refused grammar sent again is refused at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_add(self, key: str) -> tuple[Future, bool]:
        """The key's future, and True when it was just added (the caller must fill it)."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key], False
            fut: Future = Future()
            self._entries[key] = fut
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
            return fut, True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class CompileThreads:
    """A few daemon threads with COMPILE_STACK_BYTES of stack, started on the first job.
    (ThreadPoolExecutor starts threads lazily, under whatever stack size is set then.)"""

    def __init__(self, n: int) -> None:
        self.n = n
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) on a compile thread; fn handles its own errors."""
        with self._lock:
            if not self._started:
                old = threading.stack_size(COMPILE_STACK_BYTES)
                try:
                    for i in range(self.n):
                        threading.Thread(target=self._work, name=f"rawpage-compile-{i}", daemon=True).start()
                finally:
                    threading.stack_size(old)
                self._started = True
        self._jobs.put((fn, args))

    def _work(self) -> None:
        while True:
            fn, args = self._jobs.get()
            fn(*args)


class GrammarCompiler:
    """Compiles constraints for one tokenizer. The llguidance tokenizer costs ~0.4 s to
    build, so it is made (here and in each validator child) on the first grammar."""

    @classmethod
    def from_args(cls, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int], args: Any) -> GrammarCompiler:
        """The compiler with the grammar limits of these EngineArgs."""
        return cls(hf_tokenizer, vocab_size, eos_token_ids, GrammarLimits.from_args(args))

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: list[int], limits: GrammarLimits) -> None:
        self.hf, self.vocab_size, self.eos_token_ids, self.limits = hf_tokenizer, vocab_size, eos_token_ids, limits
        self.words = (vocab_size + 31) // 32  # int32 words in one bitmask row
        self.cache = MatcherCache(CACHED_GRAMMARS)
        self.threads = CompileThreads(COMPILE_THREADS)
        self.num_compiles = 0  # matchers built (cache misses that passed validation)
        self._ll = None
        self._closer: Closer | None = None
        self._lock = threading.Lock()
        self._validators: queue.SimpleQueue | None = None
        self.pending: list[tuple[Future, Any]] = []  # (future, owner) of states still compiling; engine thread only
        self.token_texts = TokenTexts(self.decode_each, vocab_size, self.words)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)

    def decode_each(self, ids: list[int]) -> list[str]:
        """Each token's own text (special tokens kept), in one call."""
        return self.hf.decode_batch([[t] for t in ids], skip_special_tokens=False)

    @property
    def closer(self) -> Closer:
        """What every sequence's look-ahead shares: the single-character tokens (closing.py)."""
        with self._lock:
            if self._closer is None:
                encode = lambda text: self.hf.encode(text, add_special_tokens=False).ids  # noqa: E731
                self._closer = Closer(encode, self.decode, self.eos_token_ids, self.vocab_size)
            return self._closer

    @property
    def ll_tokenizer(self):
        with self._lock:
            if self._ll is None:
                from llguidance import LLTokenizer

                self._ll = LLTokenizer(self.hf.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids)
            return self._ll

    def check(self, so: StructuredOutputsParams) -> str:
        """The grammar text, within the limits; InvalidRequestError naming the limit and
        its flag otherwise. Remembered on `so`: 128 prompts sharing one constraint pay once."""
        if so._checked is not None and so._checked[0] == self.limits:
            return so._checked[1]
        try:
            schema = so.schema()
            grammar = so.to_grammar(schema)
        except (ValueError, TypeError, RecursionError) as e:
            raise InvalidRequestError(f"structured_outputs: {e}", "structured_outputs") from None
        check_grammar_limits(so, schema, grammar, self.limits)
        so._checked = (self.limits, grammar)
        return grammar

    def submit(self, so: StructuredOutputsParams) -> Future:
        """Future[CompiledGrammar]: done at once when the grammar is cached; otherwise the
        gate, the child's validation and the build run on a compile thread. A refusal is
        the future's InvalidRequestError."""
        if so._checked is not None and so._checked[0] == self.limits:
            fut, added = self.cache.get_or_add(so._checked[1])
            if added:
                self.threads.submit(self._compile, so._checked[1], fut)
            return fut
        out: Future = Future()
        self.threads.submit(self._check_and_compile, so, out)
        return out

    def new_state(
        self, so: StructuredOutputsParams, prompt_ids: Sequence[int], owner: Any = None, compiled: Future | None = None
    ) -> GrammarState:
        """A sequence's GrammarState; its matcher arrives when the compile (`compiled`, submit's
        future; submitted now if None) is done. With reasoning tags, the prompt says whether it
        starts thinking (reasoning_gate.py). `owner` is handed back by take_failed if it fails."""
        gate = None
        if so.reasoning is not None:
            phase = prompt_phase(self.decode, prompt_ids, so.reasoning)
            gate = ReasoningGate(so.reasoning, phase, self.token_texts) if phase != OPEN else None
        state = GrammarState(self, compiled if compiled is not None else self.submit(so), gate)
        if not state.compiled.done():
            self.pending.append((state.compiled, owner))
        return state

    def take_failed(self) -> list[tuple[Any, BaseException]]:
        """(owner, error) of the states whose compile failed since the last call; the
        engine thread calls it before each schedule."""
        failed = [(owner, f.exception()) for f, owner in self.pending if f.done() and f.exception() is not None]
        self.pending = [(f, owner) for f, owner in self.pending if not f.done()]
        return failed

    def failed_requests(self) -> list[tuple[Any, BaseException]]:
        """(request, error) for each unfinished request whose compile failed since the last
        call (a request queued without the server's check, LLMEngine used directly)."""
        return [(req, e) for req, e in self.take_failed() if not req.is_finished]

    def wait_for(self, params: list[Any]) -> None:
        """Compile each distinct grammar of these SamplingParams now, raising the first
        refusal (LLM.generate: a bad grammar raises at once, as the server's 400 does)."""
        for so in {id(p.structured_outputs): p.structured_outputs for p in params if p.structured_outputs}.values():
            self.submit(so).result()

    def wait_pending(self, timeout: float) -> None:
        """Sleep until a pending compile finishes (at most `timeout` s): an engine with
        nothing to run but compiling grammars does not spin."""
        if self.pending:
            concurrent.futures.wait([f for f, _ in self.pending], timeout, concurrent.futures.FIRST_COMPLETED)

    # --- on the compile threads -----------------------------------------------------------
    def _check_and_compile(self, so: StructuredOutputsParams, out: Future) -> None:
        try:
            fut, added = self.cache.get_or_add(self.check(so))
            if added:
                self._compile(so._checked[1], fut)
            out.set_result(fut.result())  # another thread may be compiling it: wait for that one
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            out.set_exception(e)

    def _compile(self, grammar: str, fut: Future) -> None:
        """Validate in a child, then build here; the outcome goes into `fut`."""
        try:
            fut.set_result(self._build(grammar))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(e)

    def _build(self, grammar: str) -> CompiledGrammar:
        from llguidance import LLMatcher

        t0 = time.monotonic()
        error = self._validate(grammar)
        if error:
            raise InvalidRequestError(f"structured_outputs: {error}", "structured_outputs")
        ll, t1 = self.ll_tokenizer, time.monotonic()
        matcher = LLMatcher(ll, grammar, log_level=0)
        # The first mask builds the lexer's states (1 s for a 40,000-item choice), which every
        # copy shares: here, not in the first step the grammar's sequence samples in.
        _check_satisfiable(matcher, matcher.compute_bitmask())
        with self._lock:
            self.num_compiles += 1
        logger.info(
            "grammar compiled: %d bytes, validated in %.2f s, built in %.2f s",
            len(grammar),
            t1 - t0,
            time.monotonic() - t1,
        )
        return CompiledGrammar(matcher)

    def _validate(self, grammar: str) -> str:
        """The child's verdict; a crash or timeout is a refusal naming the limits."""
        validators = self._validator_pool()
        validator = validators.get()
        try:
            return validator.validate(grammar)
        except GrammarTooComplexError as e:
            logger.warning("a grammar of %d bytes was refused: %s", len(grammar), e)
            raise InvalidRequestError(
                f"structured_outputs: the grammar is too complex for the grammar compiler ({e}); "
                f"keep it within the limits: {self.limits.describe()}",
                "structured_outputs",
            ) from None
        finally:
            validators.put(validator)

    def _validator_pool(self) -> queue.SimpleQueue:
        with self._lock:
            if self._validators is None:
                setup = {"tokenizer": self.hf.to_str(), "vocab_size": self.vocab_size}
                setup["eos_token_ids"] = self.eos_token_ids
                frame = json.dumps(setup).encode()
                self._validators = queue.SimpleQueue()
                for _ in range(COMPILE_THREADS):
                    self._validators.put(GrammarValidator(frame, self.limits.timeout))
            return self._validators


def _check_satisfiable(matcher: Any, first_mask: bytes) -> None:
    """A grammar that cannot even start ({"$ref": "#"}: a schema that is only itself) is a
    400 at admission, not an output cut short. One that fails later, mid-output, ends
    "length" with CompletionOutput.grammar_error (output_processor.py), never "stop"."""
    if matcher.is_error() or (not any(first_mask) and not matcher.is_accepting()):
        why = (matcher.get_error() or "it allows no first token").splitlines()[0][:200]
        raise InvalidRequestError(
            f"structured_outputs: the grammar can never be satisfied ({why})", "structured_outputs"
        )


class MaskPrefetcher:
    """Computes the step's bitmasks on a worker thread while the forward pass runs.
    A mask is keyed by (seq_id, tokens so far), so a stale or missing one is simply
    computed again at sampling time."""

    def __init__(self, max_model_len: int | None = None) -> None:
        self.max_model_len = max_model_len
        self._pool: ThreadPoolExecutor | None = None
        self._job: Future | None = None
        self._masks: dict[tuple[int, int], np.ndarray | None] = {}

    def start(self, scheduled: list, rows: list) -> None:
        """scheduled: the step's (sequence, new tokens); rows: each one's logits rows. The
        constrained sequences that sample this step are those whose chunk completes their
        known tokens."""
        self.wait()
        seqs = [
            s
            for (s, n), r in zip(scheduled, rows)
            if s.grammar is not None and len(r) and s.num_computed_tokens + n == s.num_tokens
        ]
        self._masks = {}
        if not seqs:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rawpage-grammar")
        jobs = [(s.seq_id, s.num_tokens, s.grammar, self.budget(s)) for s in seqs]
        self._job = self._pool.submit(self._compute, jobs)

    def _compute(self, jobs: list) -> dict:
        return {(seq_id, n): g.mask(budget) for seq_id, n, g, budget in jobs}

    def budget(self, seq) -> int | None:
        """The tokens `seq` may still write, the next one included (max_tokens, the context)."""
        limits = [seq.request.params.max_tokens, self.max_model_len]
        left = [n - used for n, used in zip(limits, (seq.num_output_tokens, seq.num_tokens)) if n is not None]
        return min(left) if left else None

    def wait(self) -> None:
        """Join the worker: matchers must not be touched (forked, advanced) while it runs."""
        if self._job is not None:
            self._masks = self._job.result()
            self._job = None

    def mask(self, seq) -> np.ndarray | None:
        key = (seq.seq_id, seq.num_tokens)
        if key not in self._masks:
            self._masks[key] = seq.grammar.mask(self.budget(seq))
        return self._masks[key]
