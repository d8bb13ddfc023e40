"""Requests and their sequences: the unit the scheduler moves and the block manager pages.

A Request is one prompt with its SamplingParams. It owns one Sequence, or n of
them for parallel sampling and beam search; those share the prompt's KV blocks.
Every sequence carries its own token list, KV block table, progress
(`num_computed_tokens`: how many of its tokens already have K/V in the cache)
and random generator. Its text lives in the OutputProcessor: a sequence is a
scheduling record.

Only the scheduler (and its block manager, for the block tables) changes a sequence
once it exists (vLLM v1's rule): the runner, the sampler, the output processor, beam
search and speculative decoding hand it data and decisions (a token to append, a
reason to finish), and the scheduler applies them (tests/test_sequence_owner.py).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.block_hash import root_digest
from rawpage.sampling_params import SamplingParams

NULL_BLOCK = -1  # a block_table entry the sliding window released: positions kept, no kernel reads it


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # no KV blocks; (re)starts from num_computed_tokens
    RUNNING = "running"  # holds blocks; scheduled every step
    SWAPPED = "swapped"  # its blocks live in the CPU swap pool
    FINISHED = "finished"


@dataclass(slots=True)  # one per reported token per step: no per-object __dict__ (issue 44)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = most likely
    decoded_token: str | None = None


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request: Request,
        token_ids: list[int],
        index: int,
        seed: int,
        grammar: Any = None,
        thinking: Any = None,
    ) -> None:
        self.seq_id = seq_id
        self.request = request
        self.index = index  # which of the request's n completions
        self.token_ids = list(token_ids)  # prompt, then generated tokens
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_draft_tokens = 0  # speculative drafts at the end of token_ids, until verified
        self.block_table: list[int] = []  # logical block i -> physical block id
        self.block_hashes: list[bytes] = []  # prefix-cache names of its full blocks (BlockManager)
        self.num_hashed_blocks = 0  # leading blocks of block_table already named in the cache
        self.cpu_block_table: list[int] = []  # while swapped: where its blocks wait in CPU memory
        self.status = SequenceStatus.WAITING
        self.rng = np.random.default_rng([seed, index])  # siblings of one request differ
        self.seed = seed
        self.cumulative_logprob = 0.0
        self.logprobs: list[dict[int, Logprob]] = []  # one dict per generated token, if asked
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: int | str | None = None  # the stop token id or stop string
        self.grammar: Any = grammar  # GrammarState of a structured-output request; advanced by append_token
        self.thinking: Any = thinking  # ThinkingBudget of a reasoning request (thinking_budget.py); likewise

    # --- token bookkeeping ------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:  # never unverified drafts (a step that failed may leave some)
        return self.token_ids[self.num_prompt_tokens : self.num_tokens - self.num_draft_tokens]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than one token is waiting for its K/V (prompt, or recompute)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprob: float, entry: dict[int, Logprob] | None = None) -> None:
        """entry: the token's logprobs as reported (with the top alternatives), if asked for."""
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob
        if entry is not None:
            self.logprobs.append(entry)
        if self.grammar is not None:
            self.grammar.accept(token_id)
        if self.thinking is not None:
            self.thinking.accept(token_id)

    def fork(self, seq_id: int, index: int, seed: int) -> Sequence:
        """A child with the same tokens and progress; the caller shares the blocks."""
        child = Sequence(seq_id, self.request, self.token_ids, index, seed)
        child.num_computed_tokens = self.num_computed_tokens
        child.status = self.status
        child.cumulative_logprob = self.cumulative_logprob
        child.logprobs = list(self.logprobs)
        child.grammar = self.grammar.fork() if self.grammar is not None else None
        child.thinking = self.thinking.fork() if self.thinking is not None else None
        return child

    def __repr__(self) -> str:
        return (
            f"Sequence({self.seq_id}, req={self.request.request_id}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, {self.status.value})"
        )


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.time)  # epoch seconds, as are all RequestMetrics
    priority: int = 0  # lower runs first (vLLM's convention)
    seqs: list[Sequence] = field(default_factory=list)
    forked: bool = False  # n > 1: children exist once the prompt is computed
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: RequestMetrics = field(init=False)
    beam: Any = None  # BeamState when params.use_beam_search
    error: str | None = None  # why the engine failed this request, if it did
    cache_salt: str | None = None  # requests share cached KV blocks only within one salt
    lora: Any = None  # the LoRAAdapter it runs with (rawpage/lora), None = the base model
    images: tuple = ()  # ImageInput of each image, placed in the prompt (rawpage/multimodal/image_input.py)
    root_digest: bytes = field(init=False, repr=False)  # parent name of its first KV block

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(self.arrival_time)
        lora = self.lora.digest if self.lora is not None else None  # two adapters never share KV
        self.root_digest = root_digest({"cache_salt": self.cache_salt, "lora": lora})

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)
