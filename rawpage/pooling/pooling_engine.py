"""PoolingEngine (--runner pooling): the engine of an embedding model.

The same scheduler, block manager and forward pass as generation, minus everything
after the last layer:

    add_request ──► Scheduler.schedule() ──► forward (no LM head) ──► Pooler.add
                      (prompt chunks only)     rows the pooling needs    │
    EmbeddingRequestOutput ◄── Pooler.vector ◄── last chunk ran: blocks freed

A request is one input; many inputs are many requests, admitted together and run in
the same steps as any batch of prompts. Nothing is sampled and no KV outlives its
request, so prefix caching and CUDA graphs (decode-only) are off.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from typing import Any

import numpy as np

from rawpage.dtypes import to_float32
from rawpage.engine import LLMEngine, PromptType
from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError
from rawpage.outputs import EmbeddingOutput, EmbeddingRequestOutput
from rawpage.pooling.pooler import Pooler, PoolingParams, PoolingRequest, resolve_pooling_type
from rawpage.prompt_truncation import TRUNCATION_SIDES, truncate
from rawpage.request_checks import check_salt_and_priority
from rawpage.sampling_params import SamplingParams
from rawpage.sequence import Request, Sequence

logger = logging.getLogger("rawpage")

GENERATE_HINT = "start one without --runner pooling (LLM(model) offline) to generate text"


def new_engine(args: EngineArgs) -> LLMEngine:
    """The engine --runner asks for: LLMEngine generates, PoolingEngine embeds."""
    return PoolingEngine(args) if args.runner == "pooling" else LLMEngine(args)


def check_pooling_args(args: EngineArgs) -> None:
    """Flags a pooling engine cannot honour (yet): refused before the model loads."""
    refused = [
        ("--tensor-parallel-size > 1", args.tensor_parallel_size > 1),
        ("--enable-lora", args.enable_lora),
        ("--speculative-config", args.speculative_config is not None),
    ]
    for name, given in refused:
        if given:
            raise ValueError(f"{name} does not work with --runner pooling; leave it out to serve embeddings")


class PoolingEngine(LLMEngine):
    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        args = args or EngineArgs(runner="pooling", **kwargs)
        check_pooling_args(args)
        # A cached prefix would skip rows that mean and cls pooling read; decode graphs never replay.
        super().__init__(args.replace(runner="pooling", enable_prefix_caching=False, enforce_eager=True))
        self.pooler = Pooler(resolve_pooling_type(args.pooling_type, self.model_path))
        logger.info("pooling runner: %s pooling, %d dimensions", self.pooler.pooling_type, self.hidden_size)

    @property
    def hidden_size(self) -> int:
        return self.model_config.hidden_size

    # --- requests ----------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: PoolingParams | SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: Any = None,
    ) -> Request:
        """Queue one input to embed. Raises InvalidRequestError (a ValueError) at once if it
        cannot run: sampling parameters (this engine does not generate), an empty input, or
        one over --max-model-len without truncate_prompt_tokens."""
        params = PoolingParams() if params is None else params
        if not isinstance(params, PoolingParams):
            raise InvalidRequestError(f"this engine is a pooling model (--runner pooling): {GENERATE_HINT}", "model")
        check_salt_and_priority(prompt, cache_salt, priority, self.args.scheduling_policy)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            raise InvalidRequestError("LoRA adapters do not work with --runner pooling", "lora_request")
        text, ids = self.tokenize_prompt(prompt)
        ids = self.check_input(ids, params)
        arrival = arrival_time or time.time()
        req = PoolingRequest(request_id, text, ids, SamplingParams(), arrival, priority, pooling_params=params)
        req.seqs.append(Sequence(next(self._seq_ids), req, ids, 0, 0))
        self.requests[request_id] = req
        self.scheduler.add(req.seqs[0])
        return req

    def check_input(self, ids: list[int], params: PoolingParams, param: str = "input") -> list[int]:
        """The input's token ids as they will run (truncate_prompt_tokens applied), or
        InvalidRequestError naming the field and the limit."""
        limit, V, k = self.max_model_len, self.model_config.vocab_size, params.truncate_prompt_tokens
        if k is not None and not (k == -1 or 1 <= k <= limit):
            raise InvalidRequestError(
                f"truncate_prompt_tokens must be -1 (to --max-model-len) or 1 to {limit}, got {k}",
                "truncate_prompt_tokens",
            )
        if params.truncation_side not in TRUNCATION_SIDES:
            raise InvalidRequestError("truncation_side must be 'left' or 'right'", "truncation_side")
        ids = truncate(ids, limit if k == -1 else k, params.truncation_side) if k is not None else ids
        if not ids:
            raise InvalidRequestError("the input is empty; give at least one token", param)
        if len(ids) > limit:
            raise InvalidRequestError(
                f"the input has {len(ids)} tokens, more than --max-model-len {limit}; shorten it or "
                "pass truncate_prompt_tokens (keeps the first k tokens; truncation_side 'left': the last k)",
                param,
            )
        if any(not 0 <= t < V for t in ids):
            raise InvalidRequestError(f"the input has token ids out of vocabulary (not in [0, {V}))", param)
        if params.dimensions is not None and not 1 <= params.dimensions <= self.hidden_size:
            raise InvalidRequestError(f"dimensions must be 1 to {self.hidden_size}", "dimensions")
        return ids

    # --- one iteration ---------------------------------------------------------------------
    def _step(self) -> list[EmbeddingRequestOutput]:
        """schedule -> forward without the LM head -> pool; a sequence whose last chunk ran
        is finished at once (its blocks go back to the pool) and reported."""
        sched = self._schedule()
        if sched.is_empty:
            return self._finish_step(0, 0)
        rows = [self.pooler.rows(seq, n) for seq, n in sched.scheduled]
        hidden = self._hidden_states(sched.scheduled, rows)  # (N, dim), N = the rows asked for
        offset = 0
        for (seq, n), r in zip(sched.scheduled, rows):
            self.pooler.add(seq.request, seq.num_computed_tokens, hidden[offset : offset + len(r)])
            offset += len(r)
            self.scheduler.computed(seq, n)
            if seq.request.metrics.first_scheduled_time is None:
                seq.request.metrics.first_scheduled_time = time.time()
            if seq.num_computed_tokens == seq.num_tokens:
                self.scheduler.finish(seq, "stop")
                seq.request.metrics.finished_time = time.time()
        return self._finish_step(sum(n for _, n in sched.scheduled), 0)

    def _hidden_states(self, scheduled: list[tuple[Sequence, int]], rows: list[np.ndarray]) -> np.ndarray:
        """The forward pass of the runner's batch, stopped before the LM head: the final
        (normed) hidden states of the requested rows, (N, dim) float32 on the host. Always
        eager and adapter-free (check_pooling_args), so the runner's graphs and LoRA slots
        are not involved."""
        runner = self.runner
        batch = runner.buffer.upload(runner.build_batch(scheduled, rows))
        hidden = self.model.forward(batch, runner.kv_caches)  # (N, dim)
        return to_float32(self.backend.to_numpy(hidden))

    def _output(self, req: PoolingRequest) -> EmbeddingRequestOutput:
        """The request's vector once its last chunk ran (empty until then, or if it failed)."""
        done = req.is_finished and req.error is None and req.seqs[0].finish_reason == "stop"
        out = EmbeddingOutput(self.pooler.vector(req) if done else [])
        return EmbeddingRequestOutput(
            req.request_id, out, req.prompt_token_ids, req.is_finished, req.metrics, req.error
        )


def embed(
    engine: LLMEngine,
    ids: itertools.count,
    prompts: PromptType | list[PromptType],
    pooling_params: PoolingParams | None = None,
    use_tqdm: bool = True,
    truncate_prompt_tokens: int | None = None,
) -> list[EmbeddingRequestOutput]:
    """LLM.embed: every prompt queued at once (so they share steps), run to the end; outputs
    in prompt order. `ids` numbers the requests (the LLM's own counter)."""
    if not isinstance(engine, PoolingEngine):
        raise ValueError("this LLM generates text; LLM.embed needs LLM(model, runner='pooling')")
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    params = pooling_params or PoolingParams()
    if truncate_prompt_tokens is not None:
        params = dataclasses.replace(params, truncate_prompt_tokens=truncate_prompt_tokens)
    rids = [str(next(ids)) for _ in prompts]
    try:
        for rid, prompt in zip(rids, prompts):
            engine.add_request(rid, prompt, params)
    except ValueError:
        engine.abort_request(rids)
        while engine.has_unfinished_requests():
            engine.step()
        raise
    return _run(engine, rids, use_tqdm)


def _run(engine: PoolingEngine, rids: list[str], use_tqdm: bool) -> list[EmbeddingRequestOutput]:
    done: dict[str, EmbeddingRequestOutput] = {}
    bar = None
    if use_tqdm:
        from tqdm import tqdm

        bar = tqdm(total=len(rids), desc="embeddings", unit="input", dynamic_ncols=True)
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return [done[r] for r in rids if r in done]
