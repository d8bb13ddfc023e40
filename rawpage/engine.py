"""LLMEngine: requests in, one scheduling iteration per `step()`, incremental outputs out.

    add_request ──► Scheduler.schedule() ──► ModelRunner.execute() ──► Sampler
                         (which tokens)          (forward pass)        (next tokens)
                                                                          │
    RequestOutput ◄── stop checks, detokenize ◄── append tokens ◄─────────┘

The engine is synchronous and single-threaded; the server drives it from one
background thread, `LLM` drives it in a loop.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import numpy as np

from rawpage.backends import cuda_available, get_backend
from rawpage.beam_search import BeamState, final_hypotheses, is_done, select
from rawpage.block_manager import BlockManager
from rawpage.chat_template import ChatTemplate
from rawpage.cuda_graphs import graph_batch_sizes
from rawpage.device_logits import DeviceLogits
from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError
from rawpage.loader import load_checkpoint
from rawpage.memory import DEFAULT_CPU_KV_CACHE, GiB, plan_fixed, profile_gpu
from rawpage.model_runner import ModelRunner, kv_bytes_per_block
from rawpage.models.llama import LlamaModel
from rawpage.output_processor import OutputProcessor
from rawpage.outputs import RequestOutput
from rawpage.profile_run import profile_run
from rawpage.sampler import Sampler, log_softmax
from rawpage.sampling_params import SamplingParams
from rawpage.scheduler import Scheduler, SchedulerConfig
from rawpage.sequence import Request, Sequence, SequenceStatus
from rawpage.stats import EngineStats, StepStats
from rawpage.structured_output import GrammarCompiler, MaskPrefetcher

logger = logging.getLogger("rawpage")

PromptType = str | list[int] | dict[str, Any]

# Steps that may fail in a row (each failing its own requests) before the engine gives up.
MAX_CONSECUTIVE_STEP_FAILURES = 8


def resolve_dtype(dtype: str, device: str, checkpoint_dtype: str) -> str | None:
    """--dtype auto: float32 on cpu and sim; on cuda bfloat16 for bfloat16 checkpoints, else float16."""
    if dtype == "half":
        return "float16"
    if dtype != "auto":
        return dtype
    if device in ("cuda", "auto") and cuda_available():
        return "bfloat16" if "bfloat16" in checkpoint_dtype else "float16"
    return None


class LLMEngine:
    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        args = args or EngineArgs(**kwargs)
        self.args = args
        t0 = time.monotonic()
        ckpt = load_checkpoint(args.model, args.load_format, args.seed)
        self.model_path = ckpt.path
        self.model_config = c = ckpt.config
        self.tokenizer = ckpt.tokenizer
        self.generation_config = ckpt.generation_config
        self.chat_template = ChatTemplate.from_arg(args.chat_template) if args.chat_template else None
        self.backend = get_backend(args.device, resolve_dtype(args.dtype, args.device, c.torch_dtype))
        self.model = LlamaModel(c, self.backend, ckpt.tensors)
        self.max_model_len = self._resolve_max_model_len()
        self.block_size = args.block_size
        batched = args.max_num_batched_tokens or (8192 if self.backend.name == "cuda" else 2048)
        self.memory = self._plan_memory(batched)
        num_blocks = self.memory.num_blocks
        num_cpu_blocks = 0
        if args.preemption_mode == "swap":
            num_cpu_blocks = int(args.swap_space * GiB) // self.memory.bytes_per_block
            logger.info("swap space: %d CPU blocks (%.2f GiB)", num_cpu_blocks, args.swap_space)
        self.block_manager = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching,
                                          num_cpu_blocks=num_cpu_blocks)  # fmt: skip
        self.scheduler = Scheduler(
            SchedulerConfig(args.max_num_seqs, batched, self.max_model_len, args.preemption_mode),
            self.block_manager,
        )
        graphs = self.backend.supports_graphs and not args.enforce_eager
        self.runner = ModelRunner(self.model, self.backend, args.block_size, num_blocks, num_cpu_blocks,
                                  graph_batch_sizes(args.max_num_seqs) if graphs else None, self.max_model_len)  # fmt: skip
        self.grammars = GrammarCompiler(self.tokenizer.hf, c.vocab_size, c.eos_token_ids)
        self.masks = MaskPrefetcher(self.grammars.words)
        self.sampler = Sampler(c.vocab_size, c.eos_token_ids, self.masks)
        self.output = OutputProcessor(self.tokenizer, c.eos_token_ids, c.vocab_size, self.max_model_len,
                                      self.scheduler.finish)  # fmt: skip
        self.requests: dict[str, Request] = {}
        self._aborted: list[Request] = []  # to report as finished at the end of the next step
        self._batch: dict[str, Request] | None = None  # the requests of the step in progress
        self._consecutive_failures = 0
        self._seq_ids = itertools.count()
        self._rng = np.random.default_rng(args.seed)
        self.stats = EngineStats(args.log_stats_interval)
        self.startup_seconds = time.monotonic() - t0
        logger.info("loaded %s (%s) on %s in %.1f s", c.name or ckpt.path, c.architecture, self.backend.name,
                    self.startup_seconds)  # fmt: skip
        logger.info("%s", self.memory.describe())

    # --- setup ------------------------------------------------------------------------
    def _resolve_max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        want = self.args.max_model_len or limit
        if want > limit:
            raise ValueError(f"--max-model-len {want} exceeds the model's context length {limit}")
        return want

    def _plan_memory(self, max_num_batched_tokens: int):
        a, c = self.args, self.model_config
        per_block = kv_bytes_per_block(c, a.block_size, self.backend.dtype.itemsize)
        weights = self.model.num_bytes()
        if self.backend.memory is not None and not a.num_gpu_blocks_override and not a.kv_cache_memory:
            # GPU: measure the worst-case step, then the KV cache takes the rest of the budget.
            def worst_case() -> None:
                profile_run(self.model, self.backend, max_num_batched_tokens, a.max_num_seqs, a.block_size)

            return profile_gpu(self.backend.memory, weights, worst_case, a.gpu_memory_utilization, per_block,
                               a.block_size, self.max_model_len)  # fmt: skip
        if a.num_gpu_blocks_override:
            budget = a.num_gpu_blocks_override * per_block
            return plan_fixed(
                budget,
                per_block,
                a.block_size,
                self.max_model_len,
                weights,
                0,
                "--num-gpu-blocks-override",
            )
        return plan_fixed(
            a.kv_cache_memory or DEFAULT_CPU_KV_CACHE,
            per_block,
            a.block_size,
            self.max_model_len,
            weights,
        )

    # --- requests ----------------------------------------------------------------------
    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt) if prompt else []
        return None, list(prompt)

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None,
                    arrival_time: float | None = None, priority: int = 0) -> Request:  # fmt: skip
        """Queue a request. Raises ValueError at once if it can never run."""
        params = params or SamplingParams()
        if priority and self.args.scheduling_policy != "priority":
            raise InvalidRequestError("priority needs --scheduling-policy priority; this engine schedules first come, "
                                      "first served", "priority")  # fmt: skip
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids = self.tokenize_prompt(prompt)
        self.validate_prompt(ids, params)
        req = Request(request_id, text, ids, params, arrival_time or time.monotonic(), priority)
        seed = params.seed if params.seed is not None else int(self._rng.integers(2**63))
        req.seqs.append(Sequence(next(self._seq_ids), req, ids, 0, seed))
        if params.structured_outputs is not None:
            req.seqs[0].grammar = self.grammars.new_state(params.structured_outputs, self._encode_plain)
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]
        if params.use_beam_search:
            req.beam = BeamState(params.n, params.length_penalty, params.early_stopping)
        self.requests[request_id] = req
        self.scheduler.add(req.seqs[0])
        return req

    def validate_prompt(self, ids: list[int], params: SamplingParams) -> None:
        """Refuse, with a message that names the field, anything that could not run to the end:
        token ids outside the vocabulary (in the prompt, stop_token_ids or logit_bias) and
        prompts that leave no room under --max-model-len."""
        n, limit, V = len(ids), self.max_model_len, self.model_config.vocab_size
        if n == 0:
            raise InvalidRequestError("the prompt is empty; give at least one token", "prompt")
        for name, given in (("prompt", ids), ("stop_token_ids", params.stop_token_ids),
                            ("logit_bias", list(params.logit_bias or ()))):  # fmt: skip
            bad = [t for t in given if not 0 <= t < V]
            if bad:
                shown = ", ".join(str(t)[:24] for t in bad[:5])
                raise InvalidRequestError(f"{name}: token ids [{shown}] are outside the vocabulary [0, {V})", name)
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.args.max_logprobs:
                raise InvalidRequestError(f"{name} is {k}, more than --max-logprobs {self.args.max_logprobs}", name)
        if params.n > self.args.max_num_seqs:
            raise InvalidRequestError(
                f"n is {params.n}, more than --max-num-seqs {self.args.max_num_seqs}: the sequences of one request "
                "must fit in one batch",
                "n",
            )
        if params.max_tokens is None and n >= limit:
            raise InvalidRequestError(
                f"the prompt has {n} tokens, which leaves no room for output under --max-model-len {limit}", "prompt"
            )
        total = n + (params.max_tokens or 0)
        if total > limit:
            raise InvalidRequestError(
                f"the prompt ({n} tokens) plus max_tokens ({params.max_tokens}) is {total} tokens, "
                f"more than --max-model-len {limit}; shorten the prompt or lower max_tokens",
                "prompt",
            )
        if params.structured_outputs is not None:
            self.grammars.compile(params.structured_outputs)  # a bad schema is a 400 now, not a failure later
        # Startup guaranteed that one --max-model-len sequence fits in the pool, so any
        # request that passes these checks can run to completion, if need be alone.

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def abort_request(self, request_id: str | list[str]) -> None:
        """Stop requests now; their blocks are freed at once and a final output follows."""
        for rid in [request_id] if isinstance(request_id, str) else request_id:
            req = self.requests.get(rid)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    self.scheduler.finish(seq)
            self._aborted.append(req)

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
        self._batch = None
        sched = self.scheduler.schedule()
        self._batch = {seq.request.request_id: seq.request for seq, _ in sched.scheduled}
        self.runner.swap(sched.swap_out, sched.swap_in)
        counts = self._execute(sched) if not sched.is_empty else (0, 0)
        return self._finish_step(*counts)

    def _execute(self, sched) -> tuple[int, int]:
        """Run the forward pass for the scheduled chunks, then sample where a sequence has all
        its known tokens computed. Returns (prompt tokens computed, tokens generated)."""
        num_prompt_tokens = 0
        self.runner.copy_blocks(sched.block_copies)
        rows = [self._logits_rows(seq, n) for seq, n in sched.scheduled]
        # Grammar masks of the constrained sequences about to sample, computed meanwhile.
        self.masks.start([s for (s, n), r in zip(sched.scheduled, rows)
                          if s.grammar is not None and len(r) and s.num_computed_tokens + n == s.num_tokens])  # fmt: skip
        try:
            logits = self.runner.execute(sched.scheduled, rows)
        finally:
            self.masks.wait()
        to_sample: list[Sequence] = []
        sample_rows: list[int] = []
        beam_rows: list[tuple[Sequence, int]] = []
        offset = 0
        for (seq, n), r in zip(sched.scheduled, rows):
            start = seq.num_computed_tokens
            if not (n == 1 and seq.num_output_tokens > 0 and start == seq.num_tokens - 1):
                num_prompt_tokens += n  # prompt or recomputed tokens, not a decode step
            seq.num_computed_tokens += n
            self.block_manager.cache_full_blocks(seq)
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = time.monotonic()
            if seq.request.prompt_logprobs is not None and len(r) > 1:
                self.output.record_prompt_logprobs(seq.request, start, logits[offset : offset + len(r)])
            if seq.num_computed_tokens == seq.num_tokens and seq.request.beam is not None:
                beam_rows.append((seq, offset + len(r) - 1))
            elif seq.num_computed_tokens == seq.num_tokens:
                for s in self._fork_if_needed(seq):
                    to_sample.append(s)
                    sample_rows.append(offset + len(r) - 1)
            offset += len(r)
        if to_sample:
            self._sample(logits, sample_rows, to_sample)
        if beam_rows:
            self._beam_search_step(beam_rows, logits)
        return num_prompt_tokens, len(to_sample) + len(beam_rows)

    def _sample(self, logits: DeviceLogits, rows: list[int], seqs: list[Sequence]) -> None:
        """Sample the whole batch at once; if one request's parameters break that, sample
        each sequence alone so that only the culprit fails."""
        try:
            out = self.sampler.sample_rows(logits, rows, seqs)
        except Exception:  # noqa: BLE001 - narrowed down below
            for r, s in zip(rows, seqs):
                if s.is_finished:
                    continue
                try:
                    self.output.append_tokens([s], self.sampler.sample_rows(logits, [r], [s]), self._fail_seq)
                except Exception as e:  # noqa: BLE001 - isolated to this request
                    self._fail_request(s.request, e)
            return
        self.output.append_tokens(seqs, out, self._fail_seq)

    def _finish_step(self, num_prompt_tokens: int, num_generated: int) -> list[RequestOutput]:
        """Outputs for every request this step touched or aborted; finished ones are dropped."""
        touched = dict(self._batch or {})
        touched.update((r.request_id, r) for r in self._aborted)
        self._aborted = []
        outputs = [self._output(req) for req in touched.values()]
        for o in outputs:
            if o.finished:
                self.requests.pop(o.request_id, None)
                self.stats.requests_finished_total += 1
        bm, sc = self.block_manager, self.scheduler
        self.stats.swap_outs_total, self.stats.swap_ins_total = sc.num_swap_outs, sc.num_swap_ins
        gauges = StepStats(len(sc.running), len(sc.waiting), len(sc.swapped), bm.num_used_blocks / max(1, bm.num_blocks),
                           num_prompt_tokens, num_generated)  # fmt: skip
        self.stats.record_step(gauges, sc.num_preemptions, bm.prefix_hits / max(1, bm.prefix_queries), self.kv_usage)
        return outputs

    def _output(self, req: Request) -> RequestOutput:
        try:
            return self.output.make_output(req)
        except Exception as e:  # noqa: BLE001 - isolated to this request
            self._fail_request(req, e)
            if req in self._aborted:  # reported right here, not again next step
                self._aborted.remove(req)
            return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, None, [], True, req.metrics,
                                 req.num_cached_tokens, req.error)  # fmt: skip

    # --- failures ----------------------------------------------------------------------------
    def _recover(self, e: Exception) -> list[RequestOutput]:
        """A step raised. Fail the requests of its batch (all requests, if it failed before
        the batch was known) and report them. Only a failure that repeats step after step,
        whatever the requests, means the engine itself is broken: that one propagates."""
        self._consecutive_failures += 1
        if self._consecutive_failures > MAX_CONSECUTIVE_STEP_FAILURES:
            raise e
        victims = list((self._batch if self._batch is not None else self.requests).values())
        logger.error("a step failed (%s: %s); failing its %d request(s)", type(e).__name__, e, len(victims),
                     exc_info=e)  # fmt: skip
        for req in victims:
            self._fail_request(req, e)
        self._batch = None
        return self._finish_step(0, 0)

    def _fail_seq(self, seq: Sequence, e: Exception) -> None:
        self._fail_request(seq.request, e)

    def _fail_request(self, req: Request, e: Exception) -> None:
        """End a request with an error: every sequence aborted, every block freed."""
        if req.error is not None:
            return
        req.error = f"{type(e).__name__}: {e}"
        logger.error("request %s failed: %s", req.request_id, req.error, exc_info=e)
        for seq in req.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)
        if req.beam is not None:
            req.beam.done = True
        self._aborted.append(req)

    def _logits_rows(self, seq: Sequence, n: int) -> np.ndarray:
        """Which rows of this sequence's chunk need logits: the last one if it completes the
        sequence's known tokens (we sample), all of them while recording prompt logprobs."""
        req = seq.request
        if req.prompt_logprobs is not None and seq.index == 0 and len(req.prompt_logprobs) < seq.num_prompt_tokens:
            return np.arange(n)
        if seq.num_computed_tokens + n == seq.num_tokens:
            return np.array([n - 1])
        return np.zeros(0, dtype=np.int64)

    def _fork_if_needed(self, seq: Sequence) -> list[Sequence]:
        """n > 1: once the shared prompt is computed, the parent forks n - 1 children that
        point at the same KV blocks; each samples its own first token from the same logits."""
        req = seq.request
        if req.params.n == 1 or req.forked:
            return [seq]
        req.forked = True
        for i in range(1, req.params.n):
            child = seq.fork(next(self._seq_ids), i, seq.seed)
            req.seqs.append(child)
            if self.args.share_forked_blocks:
                self.block_manager.fork(seq, child)
                self.scheduler.add_running(child)
            else:  # the comparison point: every child stores (and computes) the prompt again
                child.num_computed_tokens = 0
                self.scheduler.add(child)
        return list(req.seqs)

    # --- beam search ------------------------------------------------------------------
    def _beam_search_step(self, rows: list[tuple[Sequence, int]], logits: DeviceLogits) -> None:
        """Stash each beam's next-token logprobs; advance a request once all its live beams
        have theirs (beams of one request may be computed in different steps)."""
        reqs = {}
        for seq, row in rows:
            if seq.is_finished:
                continue
            try:
                processed = self.sampler.apply_processors(
                    logits[row : row + 1, : self.model_config.vocab_size].copy(), [seq]
                )
                seq.request.beam.pending[seq.seq_id] = log_softmax(processed)[0]
                reqs[seq.request.request_id] = seq.request
            except Exception as e:  # noqa: BLE001 - isolated to this request
                self._fail_request(seq.request, e)
        for req in reqs.values():
            live = [s for s in req.seqs if not s.is_finished]
            if req.error is None and all(s.seq_id in req.beam.pending for s in live):
                try:
                    self._advance_beams(req, live)
                except Exception as e:  # noqa: BLE001 - isolated to this request
                    self._fail_request(req, e)

    def _advance_beams(self, req: Request, live: list[Sequence]) -> None:
        st, p = req.beam, req.params
        req.forked = True  # its beams now take one seat each
        rows = np.stack([st.pending.pop(s.seq_id) for s in live])
        chosen = select(st, live, rows, set(self.model_config.eos_token_ids), p.ignore_eos)
        # Forks first, from the parents as they are; then drops; then every beam gets its token.
        assigned, seen = [], set()
        for parent, tok, lp in chosen:
            beam = parent if parent.seq_id not in seen else self._fork_beam(req, parent)
            seen.add(parent.seq_id)
            assigned.append((beam, tok, lp))
        for s in live:
            if s.seq_id not in seen:
                self.scheduler.finish(s)
                req.seqs.remove(s)
        for beam, tok, lp in assigned:
            beam.append_token(tok, lp)
        beams = [b for b, _, _ in assigned]
        at_limit = bool(beams) and any(
            (p.max_tokens is not None and b.num_output_tokens >= p.max_tokens) or b.num_tokens >= self.max_model_len
            for b in beams
        )
        if not beams or at_limit or is_done(st, beams, self.max_model_len):
            st.results = final_hypotheses(st, beams, "length")
            for b in beams:
                b.finish_reason = "length"
                self.scheduler.finish(b)
            st.done = True

    def _fork_beam(self, req: Request, parent: Sequence) -> Sequence:
        """A new beam sharing the parent's KV blocks (or, if the parent lost them to
        preemption meanwhile, recomputing them)."""
        child = parent.fork(next(self._seq_ids), len(req.seqs), parent.seed)
        req.seqs.append(child)
        if parent.status == SequenceStatus.RUNNING:
            self.block_manager.fork(parent, child)
            self.scheduler.add_running(child)
        else:
            child.num_computed_tokens = 0
            self.scheduler.add(child)
        return child
