"""What one engine-view snapshot (GET /v1/engine/events) costs on a full, realistic pool.

    python tools/bench_engine_view.py                     # 55,000 blocks, 256 sequences (8B on an H200)
    python tools/bench_engine_view.py --num-blocks 2900 --num-seqs 64   # the default CPU server

The pool is filled as a busy server fills it: sequences of several requests, n=2 pairs
sharing their prompt blocks, a common system prompt shared by all, and cached free blocks
left by finished requests. It prints the median cost of one snapshot (JSON included; wall and thread CPU time) and of
the per-step hook, and the snapshot rate that keeps the cost at 1% of the engine's time.
No model is loaded: the snapshot reads only the block manager and the scheduler.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rawpage.block_manager import BlockManager
from rawpage.sampling_params import SamplingParams
from rawpage.scheduler import Scheduler, SchedulerConfig
from rawpage.sequence import Request, Sequence
from rawpage.server.engine_view import EngineView, step_record
from rawpage.stats import EngineStats


def busy_engine(num_blocks: int, num_seqs: int, block_size: int = 16) -> SimpleNamespace:
    """An engine-shaped namespace whose pool is ~90% used by num_seqs running sequences."""
    bm = BlockManager(num_blocks, block_size)
    sc = Scheduler(SchedulerConfig(max(256, num_seqs), 8192, 8192, "recompute"), bm)
    system = list(range(1, 1 + 8 * block_size))  # 8 blocks every request shares
    tokens_each = int(0.9 * num_blocks / -(-num_seqs // 2) * block_size)  # a pair shares its blocks
    for i in range(0, num_seqs, 2):
        req = Request(f"r{i}", None, system + [1000 + i] * (tokens_each - len(system)), SamplingParams(n=2))
        parent = Sequence(i, req, req.prompt_token_ids, 0, 0)
        bm.allocate(parent, bm.prefix_cache.match_prefix(parent))
        assert bm.append_slots(parent, parent.num_uncomputed_tokens), "pool too small"
        parent.num_computed_tokens = parent.num_tokens
        bm.prefix_cache.cache_full_blocks(parent)
        sc.add_running(parent)
        if i + 1 < num_seqs:
            child = parent.fork(i + 1, 1, 0)
            bm.fork(parent, child)
            sc.add_running(child)
    batch = [(s, 1) for s in sc.running]  # a decode step of every sequence
    return SimpleNamespace(
        block_manager=bm, scheduler=sc, stats=EngineStats(0), batch=batch, has_unfinished_requests=lambda: True
    )


def median_seconds(fn, repeats: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-blocks", type=int, default=55000)
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    a = p.parse_args()
    engine = busy_engine(a.num_blocks, a.num_seqs)
    view = EngineView()
    snapshot = median_seconds(lambda: view.take(engine), a.repeats)
    # CPU time of this thread: what the snapshot itself costs when other processes share the cores
    snapshot_cpu = median_seconds(lambda: view.take(engine), a.repeats, time.thread_time)
    hook = median_seconds(lambda: step_record(engine, lambda request_id: None), a.repeats)
    bm = engine.block_manager
    print(
        f"pool: {bm.num_blocks} blocks, {bm.num_used_blocks} in use, {len(engine.scheduler.running)} running sequences"
    )
    print(
        f"snapshot: {snapshot * 1e3:.2f} ms median wall, {snapshot_cpu * 1e3:.2f} ms CPU "
        f"(JSON {len(view.latest.data) / 1024:.1f} KiB)"
    )
    print(f"per-step hook while watched: {hook * 1e6:.1f} us median")
    rate = min(1 / view.min_interval, view.max_overhead / snapshot)
    print(f"snapshots at most {rate:.1f}/s: {100 * snapshot * rate:.2f}% of the engine thread's time")


if __name__ == "__main__":
    main()
