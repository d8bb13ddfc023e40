"""EngineView: compact snapshots of the paged KV cache and the scheduler's queues, for the
web page's live view and for anyone who builds another (`GET /v1/engine/events`; the
format is in docs/engine-events.md).

Snapshots are taken in the engine thread between steps (AsyncEngine's `on_step` hook), so
each one sees a single consistent state. They take time the engine would spend stepping,
so their cost is bounded:
  - nothing is recorded while nobody watches;
  - a snapshot is taken at most every `min_interval` seconds, and never sooner than keeps
    its own measured cost under `max_overhead` of the time between two snapshots;
  - the step that leaves the engine idle is always snapshotted, so a view ends on the
    drained pool;
  - a new watcher gets the current state at once: the latest snapshot if no step ran
    since, else a new one if the engine is idle or one is due anyway.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawpage.engine import LLMEngine
from rawpage.outputs import RequestOutput
from rawpage.sequence import Sequence

FORMAT_VERSION = 1
# Block states in the "state" run-length list (docs/engine-events.md).
FREE, USED, SHARED, CACHED = 0, 1, 2, 3
OTHER_TENANT = -2  # in a tenant's "owner" runs: a block another tenant's sequence holds
# What a tenant's view keeps of "totals": the engine's pace, nothing that moves with other
# tenants' prompts (prefix hits would tell a key whether its guess of someone's prompt was right).
TENANT_TOTALS = ("steps",)
MAX_QUEUE_ENTRIES = 64  # sequences listed per queue; "counts" has the full lengths
MAX_STEPS = 64  # steps kept between two snapshots


OwnerOf = Callable[[str], "str | None"]  # a request id -> its tenant's key_id (None: nobody's)


@dataclass
class Ownership:
    """Whose is what in one snapshot: what a tenant's view is cut from. Never sent."""

    block_owner: np.ndarray  # (NB,) the sequence id holding each block, -1 for none
    cpu_owner: np.ndarray  # (NCB,) the same over the swap pool
    queue_owners: dict[str, list[tuple[int, str | None]]]  # queue -> (seq id, tenant) of each entry
    steps: list[Any]  # the tagged steps (step_record)


@dataclass
class Snapshot:
    id: int
    data: bytes  # the whole view's JSON text, encoded once for every watcher who may see it all
    cost: float  # seconds it took, JSON included
    full: dict[str, Any] = field(default_factory=dict, repr=False)
    ownership: Ownership | None = field(default=None, repr=False)
    _tenant_views: dict[str, bytes] = field(default_factory=dict, repr=False)

    def for_tenant(self, key_id: str | None) -> bytes:
        """Event loop: the view a non-admin key gets, cut once per snapshot and key."""
        if key_id not in self._tenant_views and self.ownership is not None:
            view = tenant_view(self.full, self.ownership, key_id)
            self._tenant_views[key_id] = json.dumps(view, separators=(",", ":")).encode()
        return self._tenant_views.get(key_id, b"{}")


def run_lengths(values: np.ndarray) -> list[int]:
    """[v0, n0, v1, n1, ...]: each run of equal values as (value, length). values: (N,) ints."""
    if len(values) == 0:
        return []
    starts = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1]) + 1))
    lengths = np.diff(np.append(starts, len(values)))
    return np.stack([values[starts], lengths], axis=1).ravel().tolist()


def block_states(ref_counts: np.ndarray, hashed: np.ndarray) -> np.ndarray:
    """(NB,) state per block: FREE, USED (one reference), SHARED (more), CACHED (free, but its
    content is still named in the prefix cache, so a request with that prefix revives it)."""
    states = np.where(ref_counts > 1, SHARED, np.where(ref_counts == 1, USED, FREE))
    states[hashed & (ref_counts == 0)] = CACHED
    return states


def block_owners(num_blocks: int, seqs: list[Sequence], cpu: bool = False) -> np.ndarray:
    """(NB,) the lowest id of the sequences whose block table holds each block, -1 for none."""
    tables = [s.cpu_block_table if cpu else s.block_table for s in seqs]
    lengths = [len(t) for t in tables]
    blocks = np.fromiter(itertools.chain.from_iterable(tables), np.int64, sum(lengths))  # (U,)
    ids = np.repeat(np.array([s.seq_id for s in seqs], dtype=np.int64), lengths)  # (U,)
    held = blocks >= 0  # entries a sliding window released (-1) belong to no block
    blocks, ids = blocks[held], ids[held]
    order = np.lexsort((ids, blocks))  # by block, then by sequence id
    blocks, ids = blocks[order], ids[order]
    first = np.ones(len(blocks), dtype=bool)  # the lowest id of each block's holders
    first[1:] = blocks[1:] != blocks[:-1]
    owners = np.full(num_blocks, -1, dtype=np.int64)
    owners[blocks[first]] = ids[first]
    return owners


def expand_runs(runs: list[int]) -> np.ndarray:
    """The inverse of run_lengths: (N,) ints."""
    return np.repeat(runs[::2], runs[1::2]) if runs else np.zeros(0, np.int64)


def image_blocks(num_blocks: int, block_size: int, seqs: list[Sequence]) -> np.ndarray:
    """(NB,) 1 where a block of these sequences holds one of their prompt's image tokens, else 0.
    Prompt position p sits in block_table[p // block_size]; only blocks allocated so far count."""
    marks = np.zeros(num_blocks, dtype=np.int64)
    for seq in seqs:
        for im in seq.request.images:
            span = seq.block_table[im.offset // block_size : (im.offset + im.length - 1) // block_size + 1]
            marks[[b for b in span if b >= 0]] = 1
    return marks


def describe_seq(seq: Sequence, queue: str) -> dict[str, Any]:
    state = queue if queue != "running" else ("prefill" if seq.is_prefill else "decode")
    blocks = len(seq.cpu_block_table) if queue == "swapped" else len(seq.block_table)
    return {
        "id": seq.seq_id,
        "request": seq.request.request_id,
        "state": state,
        "tokens": seq.num_tokens,
        "prompt": seq.num_prompt_tokens,
        "computed": seq.num_computed_tokens,
        "blocks": blocks,
    }


def take_snapshot(
    engine: LLMEngine, snapshot_id: int, steps: list[Any], last_cost: float, owner_of: OwnerOf, finished: int
) -> tuple[dict[str, Any], Ownership]:
    """The whole view of one moment, as a JSON-ready dict (docs/engine-events.md), and whose
    each sequence, block and step is, for the tenants' views. Read from the engine's own
    state (block manager, queues, counters); `finished`: requests finished so far."""
    bm, sc = engine.block_manager, engine.scheduler
    refs = np.fromiter(bm.ref_counts, np.int64, bm.num_blocks)
    hashed = np.zeros(bm.num_blocks, dtype=bool)
    cached = bm.cached_block_ids()
    hashed[np.fromiter(cached, np.int64, len(cached))] = True
    queues = {"running": sc.running, "waiting": sc.waiting, "swapped": sc.swapped}
    owner, cpu_owner = block_owners(bm.num_blocks, sc.running), block_owners(bm.num_cpu_blocks, sc.swapped, cpu=True)
    full = {
        "v": FORMAT_VERSION,
        "id": snapshot_id,
        "time": time.time(),
        "pool": {
            "num_blocks": bm.num_blocks,
            "block_size": bm.block_size,
            "num_cpu_blocks": bm.num_cpu_blocks,
            "max_num_batched_tokens": sc.config.max_num_batched_tokens,
            "max_num_seqs": sc.config.max_num_seqs,
        },
        "state": run_lengths(block_states(refs, hashed)),
        "owner": run_lengths(owner),
        "refs": run_lengths(refs),
        "cpu_owner": run_lengths(cpu_owner),
        "image": run_lengths(image_blocks(bm.num_blocks, bm.block_size, sc.running)),
        "counts": {name: len(q) for name, q in queues.items()},
        "queues": {name: [describe_seq(s, name) for s in q[:MAX_QUEUE_ENTRIES]] for name, q in queues.items()},
        "steps": [[n, [c for c, _ in chunks], len(decodes)] for n, chunks, decodes in steps],
        "totals": engine_totals(engine, finished),
        "cost_ms": round(last_cost * 1000, 3),
    }
    owners = {name: [(s.seq_id, owner_of(s.request.request_id)) for s in q] for name, q in queues.items()}
    return full, Ownership(owner, cpu_owner, owners, steps)


def engine_totals(engine: LLMEngine, finished: int) -> dict[str, int]:
    bm, sc, st = engine.block_manager, engine.scheduler, engine.stats
    return {
        "steps": st.steps_total,
        "prompt_tokens": st.prompt_tokens_total,
        "generation_tokens": st.generation_tokens_total,
        "requests_finished": finished,
        "preemptions": sc.num_preemptions,
        "swap_outs": sc.num_swap_outs,
        "swap_ins": sc.num_swap_ins,
        "cow_copies": bm.num_cow_copies,
        "evictions": bm.num_evictions,
        "prefix_queries": bm.prefix_queries,
        "prefix_hits": bm.prefix_hits,
    }


def tenant_view(full: dict[str, Any], own: Ownership, key_id: str | None) -> dict[str, Any]:
    """What one non-admin key may see of a snapshot: its own sequences (ids, lengths, steps)
    in full; other tenants' blocks as anonymous occupancy (owner OTHER_TENANT, never
    "shared", no reference counts, which would say whose prompt matches whose); of the
    totals only the step count."""
    mine = {sid for entries in own.queue_owners.values() for sid, k in entries if k == key_id and k is not None}
    ids = np.fromiter(mine, np.int64, len(mine))

    def anonymous(owner: np.ndarray) -> list[int]:
        return run_lengths(np.where((owner < 0) | np.isin(owner, ids), owner, OTHER_TENANT))

    states, images = expand_runs(full["state"]), expand_runs(full["image"])
    return {
        **{k: full[k] for k in ("v", "id", "time", "pool", "cost_ms")},
        "state": run_lengths(np.where(states == SHARED, USED, states)),
        "owner": anonymous(own.block_owner),
        "cpu_owner": anonymous(own.cpu_owner),
        # image blocks of its own sequences only: what another key sent stays its own
        "image": run_lengths(np.where(np.isin(own.block_owner, ids), images, 0)),
        "counts": {name: sum(1 for sid, _ in entries if sid in mine) for name, entries in own.queue_owners.items()},
        "queues": {name: [e for e in entries if e["id"] in mine] for name, entries in full["queues"].items()},
        "steps": [
            [n, [c for c, k in chunks if k == key_id], decodes.count(key_id)] for n, chunks, decodes in own.steps
        ],
        "totals": {k: full["totals"][k] for k in TENANT_TOTALS},
    }


def step_record(engine: LLMEngine, owner_of: OwnerOf) -> list[Any]:
    """The last step's token budget, from its batch: [step number, [(prefill chunk size, tenant)],
    [tenant of each decode]]. A one-token chunk past the prompt is a decode (it computes the K/V
    of a sampled token)."""
    chunks, decodes = [], []
    for seq, n in engine.batch or []:
        tenant = owner_of(seq.request.request_id)
        if n == 1 and seq.num_computed_tokens > seq.num_prompt_tokens:
            decodes.append(tenant)
        else:
            chunks.append((n, tenant))
    return [engine.stats.steps_total, chunks, decodes]


class EngineView:
    """Holds the newest snapshot for the event stream. The engine thread writes it; the
    event loop reads `latest` (one reference, replaced whole) and counts `watchers`."""

    def __init__(self, min_interval: float = 0.1, max_overhead: float = 0.01, owner_of: OwnerOf | None = None) -> None:
        self.min_interval = min_interval
        self.max_overhead = max_overhead
        self.owner_of: OwnerOf = owner_of or (lambda request_id: None)
        self.watchers = 0  # open event streams (event loop writes)
        self.watchers_by_key: Counter[str | None] = Counter()  # the same, per API key_id
        self.latest: Snapshot | None = None
        self._steps: deque[list[Any]] = deque(maxlen=MAX_STEPS)
        self._next_time = 0.0
        self._count = 0
        self._finished = 0  # requests finished, counted from every step's outputs, watched or not
        self.is_current = False  # no step since `latest` was taken (engine thread writes)

    def on_step(self, engine: LLMEngine, outputs: list[RequestOutput]) -> None:
        """Engine thread, after every step."""
        self.is_current = False
        self._finished += sum(1 for out in outputs if out.finished)
        if not self.watchers:
            return
        self._steps.append(step_record(engine, self.owner_of))
        if time.perf_counter() >= self._next_time or not engine.has_unfinished_requests():
            self.take(engine)

    def refresh(self, engine: LLMEngine) -> None:
        """Engine thread, for a new watcher: make `latest` current. At once if the engine is
        idle (it costs no step) or a snapshot is due; else the next due step takes it. So
        opening streams over and over cannot push snapshots past their budget."""
        if self.is_current and self.latest is not None:
            return
        if not engine.has_unfinished_requests() or time.perf_counter() >= self._next_time:
            self.take(engine)

    def take(self, engine: LLMEngine) -> None:
        """Engine thread: snapshot now, and schedule the earliest next one."""
        t0 = time.perf_counter()
        last_cost = self.latest.cost if self.latest is not None else 0.0
        self._count += 1
        data, ownership = take_snapshot(
            engine, self._count, list(self._steps), last_cost, self.owner_of, self._finished
        )
        self._steps.clear()
        encoded = json.dumps(data, separators=(",", ":")).encode()
        cost = time.perf_counter() - t0
        self.latest = Snapshot(self._count, encoded, cost, data, ownership)
        self.is_current = True
        self._next_time = t0 + max(self.min_interval, cost / self.max_overhead)
