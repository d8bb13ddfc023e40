"""LLMEngine: requests in, one scheduling iteration per `step()`, incremental outputs out.

    add_request ──► Scheduler.schedule() ──► ModelRunner.execute() ──► Sampler
                         (which tokens)          (forward pass)        (next tokens)
                                                                          │
    RequestOutput ◄── stop checks, detokenize ◄── append tokens ◄─────────┘

The engine is synchronous and single-threaded; the server drives it from one
background thread, `LLM` drives it in a loop.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from typing import Any

import numpy as np

from rawpage.backends.cpu_malloc import release_freed_memory
from rawpage.beam_search import BeamSearch, BeamState
from rawpage.block_manager import BlockManager
from rawpage.device_logits import DeviceLogits
from rawpage.engine_args import EngineArgs
from rawpage.engine_setup import decode_graph_shapes, load_model, make_runner, num_swap_blocks, resolve_max_model_len
from rawpage.errors import InvalidRequestError, WorkerDiedError
from rawpage.forking import Forker
from rawpage.lora.manager import LoRARequest, resolve_lora
from rawpage.model_runner import KVPool
from rawpage.multimodal.image_input import ImageError, ImageInput
from rawpage.multimodal.prompt_images import PromptImages
from rawpage.output_processor import OutputProcessor
from rawpage.outputs import RequestOutput
from rawpage.rank_setup import backend_for
from rawpage.request_checks import CheckedPrompt, check_request, check_salt_and_priority
from rawpage.sampler import Sampler
from rawpage.sampling_params import SamplingParams
from rawpage.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from rawpage.sequence import Request, Sequence
from rawpage.spec_decode.build import build_spec_decoder
from rawpage.stats import EngineStats
from rawpage.structured_output.grammar_compiler import GrammarCompiler, MaskPrefetcher
from rawpage.text.chat_template import ChatTemplate
from rawpage.thinking_budget import ThinkingBudget, ThinkingBudgets

logger = logging.getLogger("rawpage")

PromptType = str | list[int] | dict[str, Any]

# Steps that may fail in a row (each failing its own requests) before the engine gives up.
MAX_CONSECUTIVE_STEP_FAILURES = 8


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        self.args = args = args or EngineArgs(**kwargs)
        t0 = time.monotonic()
        ckpt = args.load_checkpoint()
        self.model_path = ckpt.path
        self.model_config = c = ckpt.config
        self.tokenizer, self.sampling_defaults = ckpt.tokenizer, args.sampling_defaults(ckpt)
        self.chat_template = ChatTemplate.from_arg(args.chat_template) if args.chat_template else None
        self.backend = backend_for(args, args.device, c.torch_dtype)
        self.max_model_len = resolve_max_model_len(args.max_model_len, c.max_position_embeddings)
        self.block_size = args.block_size
        batched = args.batched_tokens(self.backend.name)
        loaded = load_model(args, ckpt, self.backend, batched, self.max_model_len)
        self.model, self.memory, self.workers, self.lora = loaded.model, loaded.memory, loaded.workers, loaded.lora
        num_blocks = self.memory.num_blocks
        num_cpu_blocks = num_swap_blocks(args, self.memory.bytes_per_block)
        self.block_manager = BlockManager(
            num_blocks,
            args.block_size,
            args.enable_prefix_caching,
            num_cpu_blocks=num_cpu_blocks,
            sliding_window=self.memory.sliding_window,  # see PoolLayout in memory.py
        )
        max_loras = self.lora.max_loras if self.lora else 0
        config = SchedulerConfig(args.max_num_seqs, batched, self.max_model_len, args.preemption_mode, max_loras)
        self.scheduler = Scheduler(config, self.block_manager)
        shapes = decode_graph_shapes(args, self.backend, c)  # decode and verification steps replayed from graphs
        pool = KVPool(args.block_size, num_blocks, num_cpu_blocks)
        self.runner = make_runner(self.workers, self.model, self.backend, pool, shapes, self.max_model_len, self.lora)
        self.grammars = GrammarCompiler.from_args(self.tokenizer.hf, c.vocab_size, c.eos_token_ids, args)
        self.masks = MaskPrefetcher(self.max_model_len)
        self.sampler = Sampler(c.vocab_size, c.eos_token_ids, self.masks.mask)
        self._seq_ids = itertools.count()
        self.forker = Forker(self.scheduler, self._seq_ids)
        self.beam_search = BeamSearch(self.sampler, self.forker, self.scheduler, c.eos_token_ids, self.max_model_len)
        self.output = OutputProcessor(self.tokenizer, c.eos_token_ids, c.vocab_size, self.max_model_len)
        # Optional features are composed here, once: with speculation off, self.spec is None
        # and a step calls none of its code (nor any grammar's or beam's, without them).
        self.spec = build_spec_decoder(args, loaded.draft, self.scheduler, self.sampler, self.output)
        self.requests: dict[str, Request] = {}
        self._aborted: list[Request] = []  # to report as finished at the end of the next step
        self.batch: list[tuple[Sequence, int]] | None = None  # this (or the last) step's; None until scheduled
        self._consecutive_failures, self._rng = 0, np.random.default_rng(args.seed)
        self.stats = EngineStats(args.log_stats_interval, spec=self.spec.stats if self.spec else None)
        self.startup_seconds = time.monotonic() - t0
        name = args.served_model_name or os.path.basename(ckpt.path)  # not a GGUF's general.name: any text
        self.images = PromptImages(c.vision, self.tokenizer, name, args, self.backend.name, ckpt.no_vision)
        logger.info("loaded %s (%s) on %s in %.1f s", name, c.architecture, self.backend.name, self.startup_seconds)
        logger.info("%s", self.memory.describe())
        release_freed_memory()  # what starting the engine freed since the load (malloc keeps it: cpu_malloc.py)

    # --- requests ----------------------------------------------------------------------
    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt) if prompt else []
        return None, list(prompt)

    def prompt_with_images(self, prompt: PromptType) -> tuple[str | None, list[int], tuple[ImageInput, ...]]:
        """tokenize_prompt, for a prompt that may carry vLLM's multi_modal_data (and
        mm_processor_kwargs): its text's (or ids') image placeholders expanded into each
        image's soft tokens, as many placeholders as images."""
        if not (isinstance(prompt, dict) and prompt.get("multi_modal_data") is not None):
            if isinstance(prompt, dict) and prompt.get("mm_processor_kwargs"):  # checked with no image too
                try:
                    self.images.inputs([], prompt["mm_processor_kwargs"])
                except ImageError as e:
                    raise InvalidRequestError(str(e), "mm_processor_kwargs") from None
            return (*self.tokenize_prompt(prompt), ())
        try:
            data, kwargs = prompt["multi_modal_data"], prompt.get("mm_processor_kwargs")
            images = tuple(self.images.from_multi_modal_data(data, kwargs))
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self.images.expand_ids(list(prompt["prompt_token_ids"]), images), images
            text = self.images.expand_text(prompt.get("prompt", ""), images, always=True)
        except ImageError as e:
            raise InvalidRequestError(str(e), "multi_modal_data") from None
        return prompt.get("prompt"), self.tokenizer.encode(text), images

    def add_request(
        self,
        request_id: str,
        prompt: PromptType | CheckedPrompt,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> Request:
        """Queue a request; ValueError at once if it can never run (check_prompt's refusal). A
        CheckedPrompt is not checked again: its params, priority and salt are its own, and its
        grammar is compiling. Requests share prefix-cached KV blocks only with requests of the
        same `cache_salt` (also read from a dict prompt's "cache_salt") and the same LoRA adapter."""
        text, checked = None, prompt
        if not isinstance(prompt, CheckedPrompt):
            text, checked = self._check_unchecked(prompt, params or SamplingParams(), priority, cache_salt)
        if checked.refusal is not None:
            raise checked.refusal
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        ids, params, priority, salt = checked.prompt_token_ids, checked.params, checked.priority, checked.cache_salt
        lora = resolve_lora(self.lora, lora_request)  # read from disk if new
        req = Request(request_id, text, ids, params, arrival_time or time.time(), priority, cache_salt=salt, lora=lora)
        req.images = checked.images
        seed = params.seed if params.seed is not None else int(self._rng.integers(2**63))
        so, future = params.structured_outputs, checked.grammar  # compiling since check_prompt: not looked up again
        grammar = self.grammars.new_state(so, ids, req, future) if future is not None else None
        thinking = self._thinking_state(params, ids)
        req.seqs.append(Sequence(next(self._seq_ids), req, ids, 0, seed, grammar, thinking))
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        if params.use_beam_search:
            req.beam = BeamState(params.n, params.length_penalty, params.early_stopping)
        self.requests[request_id] = req
        self.scheduler.add(req.seqs[0])
        return req

    @functools.cached_property
    def thinking(self) -> ThinkingBudgets:
        """The think-block trackers' factory, made on the first request that needs it."""
        encode = functools.partial(self.tokenizer.encode, add_special_tokens=False)
        return ThinkingBudgets(self.grammars.token_texts, self.grammars.decode, encode)

    def _thinking_state(self, params: SamplingParams, ids: list[int]) -> ThinkingBudget | None:
        """The think block's tracker for a request that names a budget or the tags (thinking_budget.py)."""
        if params.use_beam_search or (params.thinking_token_budget is None and params.reasoning_tags is None):
            return None
        return self.thinking.new_state(params.thinking_token_budget, params.reasoning_tags, ids)

    def check_prompt(
        self, ids: list[int], params: SamplingParams, priority: int, salt: str | None, images: tuple = ()
    ) -> CheckedPrompt:
        """Every check of a request, once, and its grammar's gate and compile started on the
        compiler's threads. A refusal is the CheckedPrompt's (InvalidRequestError naming the
        field), a refused grammar its future's error: the server tells the grammar's first.
        Any thread: it reads only settings fixed at startup (the server calls it on the event loop)."""
        so = params.structured_outputs
        grammar = self.grammars.submit(so) if so is not None else None
        try:
            salt = check_salt_and_priority(ids, salt, priority, self.args.scheduling_policy)
            check_request(ids, params, self.max_model_len, self.model_config.vocab_size, self.args)
            images = self.images.place(ids, images)
        except InvalidRequestError as e:
            return CheckedPrompt(ids, params, priority, salt, grammar, e)
        return CheckedPrompt(ids, params, priority, salt, grammar, images=images)

    def _check_unchecked(
        self, prompt: PromptType, params: SamplingParams, priority: int, cache_salt: str | None
    ) -> tuple[str | None, CheckedPrompt]:
        """The prompt's text and check_prompt's verdict, for a request nobody checked (LLMEngine used directly)."""
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) and cache_salt is None else cache_salt
        text, ids, images = self.prompt_with_images(prompt)
        if params.structured_outputs is not None:  # over a grammar limit raises now, not at its compile
            self.grammars.check(params.structured_outputs)
        return text, self.check_prompt(ids, params, priority, salt, images)

    def abort_request(self, request_id: str | list[str]) -> None:
        """Stop requests now; their blocks are freed at once and a final output follows."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            req = self.requests.get(rid)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    self.scheduler.finish(seq, "abort")
            self._aborted.append(req)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget the prefix cache's names of every block no sequence holds (vLLM's call: after
        the weights change, or between benchmark runs). reset_running_requests: first preempt
        every running sequence (each recomputes its tokens later), so that none stays named.
        True when no block is named any more."""
        if reset_running_requests:
            self.scheduler.preempt_all()
        bm = self.block_manager
        bm.prefix_cache.reset(bm.ref_counts)
        return not bm.prefix_cache.cached

    def kv_usage(self):
        """Blocks in use, tokens stored, waste and blocks saved by sharing, right now."""
        return self.block_manager.usage(self.scheduler.running)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # --- one iteration ---------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> execute -> sample -> process outputs.

        An exception while stepping fails only the requests it touched (their clients get
        the error, their blocks are freed) and the engine goes on serving everyone else."""
        try:
            outputs = self._step()
        except Exception as e:  # noqa: BLE001 - contained to this step's requests
            return self._recover(e)
        self._consecutive_failures = 0
        return outputs

    def _step(self) -> list[RequestOutput]:
        sched = self._schedule()
        if sched.is_empty:
            self.grammars.wait_pending(0.01)  # nothing to run but grammars compiling: do not spin
            return self._finish_step(0, 0)
        logits, ready, num_prompt_tokens = self._execute(sched)
        num_generated = self._sample(logits, ready)
        return self._finish_step(num_prompt_tokens, num_generated)

    def _schedule(self) -> SchedulerOutput:
        self.batch = None  # until the batch is known, a failure is everyone's (_recover)
        if self.spec:
            self.spec.propose(self.scheduler.running)  # drafted tokens join their sequences as extra query tokens
        if self.grammars.pending:  # compiles that failed (no server checked them first)
            self._fail_all(self.grammars.failed_requests())
        sched = self.scheduler.schedule()
        now = time.time()
        for seq, _ in sched.scheduled:  # the end of its queue time (vLLM's SCHEDULED event)
            seq.request.metrics.first_scheduled_time = seq.request.metrics.first_scheduled_time or now
        if self.spec:
            self.spec.settle(sched)
        self.batch = sched.scheduled
        self.runner.swap(sched.swap_out, sched.swap_in)
        return sched

    def _execute(self, sched: SchedulerOutput) -> tuple[DeviceLogits, list[tuple[Sequence, int]], int]:
        """The forward pass over the scheduled chunks. Returns the logits (rows, V); the
        sequences that now have all their known tokens computed, each with its logits row
        (they sample next); and how many prompt (or recomputed) tokens were computed."""
        self.runner.copy_blocks(sched.block_copies)
        rows = [self._logits_rows(seq, n) for seq, n in sched.scheduled]
        if not any(seq.grammar is not None for seq, _ in sched.scheduled):
            logits = self.runner.execute(sched.scheduled, rows)
        else:
            self.masks.start(sched.scheduled, rows)  # grammar masks of those about to sample, computed meanwhile
            try:
                logits = self.runner.execute(sched.scheduled, rows)
            finally:
                self.masks.wait()
        ready: list[tuple[Sequence, int]] = []
        num_prompt_tokens = offset = 0
        for (seq, n), r in zip(sched.scheduled, rows):
            num_prompt_tokens += self._computed(seq, n, logits, offset, len(r))
            if seq.num_computed_tokens == seq.num_tokens:
                ready.append((seq, offset + len(r) - 1))
            offset += len(r)
        return logits, ready, num_prompt_tokens

    def _computed(self, seq: Sequence, n: int, logits: DeviceLogits, offset: int, num_rows: int) -> int:
        """Bookkeeping once the forward pass has computed n more tokens of `seq`: progress,
        prefix-cache names, prompt logprobs (its rows are logits[offset : offset + num_rows]).
        Returns how many of the n were prompt or recomputed tokens rather than a decode step."""
        start = seq.num_computed_tokens
        is_decode = seq.num_output_tokens > 0 and start == seq.num_tokens - 1 - seq.num_draft_tokens
        self.scheduler.computed(seq, n)
        if seq.request.prompt_logprobs is not None and num_rows > 1:
            self.output.record_prompt_logprobs(seq.request, start, logits[offset : offset + num_rows])
        return 0 if is_decode else n

    def _sample(self, logits: DeviceLogits, ready: list[tuple[Sequence, int]]) -> int:
        """Next tokens for the ready sequences: beams go to beam search; the others, with the
        n - 1 siblings that fork off a finished prompt now, to the sampler. Returns how many
        tokens were appended."""
        num_verified = 0
        if self.spec:  # speculative drafts: accepted + one more
            ready, num_verified, failed = self.spec.verify(logits, ready)
            self._fail_all(failed)
        beams = [(seq, row) for seq, row in ready if seq.request.beam is not None]
        seqs: list[Sequence] = []
        rows: list[int] = []
        for seq, row in ready:
            if seq.request.beam is None:
                forked = self.forker.fork_samples(seq)
                seqs += forked
                rows += [row] * len(forked)
        if seqs:
            self._sample_rows(logits, rows, seqs)
        if beams:
            self._fail_all(self.beam_search.step(beams, logits))
        return len(seqs) + len(beams) + num_verified

    def _sample_rows(self, logits: DeviceLogits, rows: list[int], seqs: list[Sequence]) -> None:
        """Sample the whole batch at once; if one request's parameters break that, sample
        each sequence alone so that only the culprit fails."""
        try:
            out = self.sampler.sample_rows(logits, rows, seqs)
        except Exception:  # noqa: BLE001 - narrowed down below
            for r, s in zip(rows, seqs):
                if s.is_finished:
                    continue
                try:
                    self._fail_all(
                        self.scheduler.postprocess([s], self.sampler.sample_rows(logits, [r], [s]), self.output)
                    )
                except Exception as e:  # noqa: BLE001 - isolated to this request
                    self._fail_request(s.request, e)
            return
        self._fail_all(self.scheduler.postprocess(seqs, out, self.output))

    def _finish_step(self, num_prompt_tokens: int, num_generated: int) -> list[RequestOutput]:
        """Outputs for every request this step touched or aborted; finished ones are dropped."""
        touched = self._batch_requests()
        touched.update((r.request_id, r) for r in self._aborted)
        self._aborted = []
        outputs = [self._output(req) for req in touched.values()]
        finished = [o.request_id for o in outputs if o.finished]
        for rid in finished:
            self.requests.pop(rid, None)
        self.stats.record_step(self.scheduler, num_prompt_tokens, num_generated)
        return outputs

    def _output(self, req: Request) -> RequestOutput:
        try:
            return self.output.make_output(req)
        except Exception as e:  # noqa: BLE001 - isolated to this request
            self._fail_request(req, e)
            self.output.forget(req)
            if req in self._aborted:  # reported right here, not again next step
                self._aborted.remove(req)
            return self.output.failed_output(req)

    # --- failures ----------------------------------------------------------------------------
    def _recover(self, e: Exception) -> list[RequestOutput]:
        """A step raised. Fail the requests of its batch (all requests, if it failed before
        the batch was known) and report them. Only a failure that repeats step after step,
        whatever the requests, means the engine itself is broken: that one propagates, as does
        the loss of a tensor-parallel worker (no later step can run without its shard)."""
        self._consecutive_failures += 1
        if self._consecutive_failures > MAX_CONSECUTIVE_STEP_FAILURES or isinstance(e, WorkerDiedError):
            raise e
        victims = list(self._batch_requests().values())
        logger.error("a step failed (%s: %s); failing its %d request(s)", type(e).__name__, e, len(victims), exc_info=e)
        for req in victims:
            self._fail_request(req, e)
        self.batch = []  # the failed step computed nothing
        return self._finish_step(0, 0)

    def _batch_requests(self) -> dict[str, Request]:
        """The requests of the step's batch by id; every request while the batch is unknown."""
        if self.batch is None:
            return dict(self.requests)
        return {seq.request.request_id: seq.request for seq, _ in self.batch}

    def _fail_all(self, failed: list[tuple[Request, BaseException]]) -> None:
        for req, e in failed:
            self._fail_request(req, e)

    def _fail_request(self, req: Request, e: Exception) -> None:
        """End a request with an error: every sequence aborted, every block freed."""
        if req.error is not None:
            return
        req.error = f"{type(e).__name__}: {e}"
        logger.error("request %s failed: %s", req.request_id, req.error, exc_info=e)
        for seq in req.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        if req.beam is not None:
            req.beam.done = True
        self._aborted.append(req)

    def _logits_rows(self, seq: Sequence, n: int) -> np.ndarray:
        """Which rows of this sequence's chunk need logits: the last one if it completes the
        sequence's known tokens (we sample), all of them while recording prompt logprobs."""
        req = seq.request
        if seq.num_draft_tokens or (
            req.prompt_logprobs is not None and seq.index == 0 and len(req.prompt_logprobs) < seq.num_prompt_tokens
        ):
            return np.arange(n)
        if seq.num_computed_tokens + n == seq.num_tokens:
            return np.array([n - 1])
        return np.zeros(0, dtype=np.int64)
