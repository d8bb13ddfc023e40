"""Scheduler and BlockManager on their own: fake sequences, a fake "model" that just
marks scheduled tokens as computed and appends a token to finished prefills."""

import itertools

import pytest

from rawpage.block_manager import BlockManager
from rawpage.sampling_params import SamplingParams
from rawpage.scheduler import Scheduler, SchedulerConfig
from rawpage.sequence import Request, Sequence, SequenceStatus

_ids = itertools.count()


def make_seq(n_prompt, arrival, priority=0, max_tokens=100, n=1):
    req = Request(
        f"r{next(_ids)}",
        None,
        list(range(1, n_prompt + 1)),
        SamplingParams(max_tokens=max_tokens, n=n),
        arrival_time=arrival,
        priority=priority,
    )
    seq = Sequence(next(_ids), req, req.prompt_token_ids, 0, seed=0)
    req.seqs.append(seq)
    return seq


def make(num_blocks=64, block_size=4, max_num_seqs=8, budget=32, caching=False):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching, watermark=0.0)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, 4096, "recompute"), bm), bm


def fake_step(sched):
    """What the engine does after a forward pass, minus the model."""
    out = sched.schedule()
    for seq, n in out.scheduled:
        seq.num_computed_tokens += n
        sched.block_manager.cache_full_blocks(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token(7, 0.0)
    return out


def test_fcfs_admission_order_and_priority():
    sched, _ = make(budget=1000)
    a, b, c = make_seq(5, 1.0), make_seq(5, 2.0), make_seq(5, 3.0, priority=-1)
    for s in (b, a, c):
        sched.add(s)
    out = sched.schedule()
    assert [s for s, _ in out.scheduled] == [c, a, b]  # priority first, then arrival


def test_chunked_prefill_respects_the_token_budget():
    sched, _ = make(budget=16)
    long, short = make_seq(40, 1.0), make_seq(6, 2.0)
    sched.add(long)
    sched.add(short)
    out = fake_step(sched)
    assert [(s, n) for s, n in out.scheduled] == [(long, 16)]  # the whole budget to the oldest
    out = fake_step(sched)
    assert [(s, n) for s, n in out.scheduled] == [(long, 16)]
    out = fake_step(sched)
    assert [(s, n) for s, n in out.scheduled] == [
        (long, 8),
        (short, 6),
    ]  # prefill tail + a new prompt
    out = fake_step(sched)
    assert [(s, n) for s, n in out.scheduled] == [(long, 1), (short, 1)]  # both decode
    assert all(n <= 16 for _, n in out.scheduled)


def test_max_num_seqs_caps_the_batch():
    sched, _ = make(max_num_seqs=3, budget=1000)
    seqs = [make_seq(4, float(i)) for i in range(5)]
    for s in seqs:
        sched.add(s)
    out = fake_step(sched)
    assert len(out.scheduled) == 3 and len(sched.waiting) == 2
    sched.finish(seqs[0])
    out = fake_step(sched)
    assert seqs[3] in [s for s, _ in out.scheduled] and len(sched.running) == 3


def test_preemption_takes_the_newest_and_it_resumes():
    # 6 blocks of 4 slots: three 8-token prompts fill 2 blocks each; the next token needs a third
    sched, bm = make(num_blocks=6, block_size=4, budget=1000)
    seqs = [make_seq(8, float(i)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    fake_step(sched)  # all three prefill: 6 blocks used, each now has 9 tokens (8 + 1 sampled)
    assert bm.num_free_blocks == 0
    out = fake_step(sched)  # each now needs a third block: the newest is preempted
    assert out.preempted == [seqs[2]]
    assert seqs[2].status == SequenceStatus.WAITING and seqs[2].num_computed_tokens == 0
    assert seqs[2].block_table == [] and sched.num_preemptions == 1
    sched.finish(seqs[0])
    sched.finish(seqs[1])
    out = fake_step(sched)  # room again: the victim recomputes prompt + its generated token
    assert out.scheduled == [(seqs[2], 9)]


def test_a_sequence_alone_that_cannot_grow_preempts_itself_not_others():
    sched, bm = make(num_blocks=2, block_size=4, budget=1000)
    a = make_seq(8, 0.0)
    sched.add(a)
    fake_step(sched)
    out = fake_step(sched)  # needs a 3rd block, nobody else to evict
    assert out.preempted == [a] and out.scheduled == []


def test_long_prompt_starts_with_the_chunk_that_fits():
    sched, bm = make(num_blocks=4, block_size=4, budget=1000)
    a = make_seq(30, 0.0)  # needs 8 blocks; only 4 exist (the engine would reject it up front)
    sched.add(a)
    out = sched.schedule()
    assert out.scheduled == [(a, 16)] and bm.num_free_blocks == 0


def test_free_returns_every_block_and_forked_blocks_survive_a_sibling():
    sched, bm = make(num_blocks=16, block_size=4, budget=1000)
    parent = make_seq(6, 0.0, n=2)
    sched.add(parent)
    fake_step(sched)
    child = parent.fork(999, 1, 0)
    bm.fork(parent, child)
    sched.add_running(child)
    shared = list(parent.block_table)
    assert all(bm.ref_counts[b] == 2 for b in shared)
    sched.finish(parent)
    assert all(bm.ref_counts[b] == 1 for b in shared)  # the child still holds them
    sched.finish(child)
    assert bm.num_free_blocks == 16 and not any(bm.ref_counts)


def test_copy_on_write_of_a_shared_partial_block():
    sched, bm = make(num_blocks=16, block_size=4, budget=1000)
    parent = make_seq(6, 0.0)  # blocks: [full 4][2 of 4]
    sched.add(parent)
    fake_step(sched)  # 6 computed, 7th token appended
    child = parent.fork(998, 1, 0)
    bm.fork(parent, child)
    sched.add_running(child)
    out = sched.schedule()  # both write position 6, inside the shared second block
    assert len(out.block_copies) == 1
    src, dst = out.block_copies[0]
    assert src in parent.block_table or src in child.block_table
    assert parent.block_table[0] == child.block_table[0]  # the full block stays shared
    assert parent.block_table[1] != child.block_table[1]


def test_prefix_cache_reuses_full_blocks_and_evicts_lru():
    sched, bm = make(num_blocks=8, block_size=4, budget=1000, caching=True)
    a = make_seq(10, 0.0)  # blocks: [1-4][5-8][9-10]
    sched.add(a)
    fake_step(sched)
    sched.finish(a)
    b = make_seq(10, 1.0)  # same tokens
    sched.add(b)
    out = sched.schedule()
    assert out.scheduled == [(b, 2)]  # two cached blocks reused, two tokens computed
    assert b.request.num_cached_tokens == 8
    sched.finish(b)
    bm.prefix_cache.reset(bm.ref_counts)
    c = make_seq(10, 2.0)
    sched.add(c)
    assert sched.schedule().scheduled == [(c, 10)]


@pytest.mark.parametrize("caching", [False, True])
def test_random_workload_never_leaks(caching):
    import random

    rnd = random.Random(0)
    sched, bm = make(num_blocks=20, block_size=4, max_num_seqs=6, budget=24, caching=caching)
    live = []
    for step in range(300):
        if rnd.random() < 0.3:
            s = make_seq(rnd.randint(1, 20), float(step))
            sched.add(s)
            live.append(s)
        fake_step(sched)
        for s in list(live):
            if s.num_output_tokens >= rnd.randint(1, 12) or rnd.random() < 0.02:
                sched.finish(s)
                live.remove(s)
        used = sum(1 for r in bm.ref_counts if r)
        assert used == bm.num_used_blocks
    for s in live:
        sched.finish(s)
    assert bm.num_free_blocks == 20 and not any(bm.ref_counts)


def test_swap_out_and_back_in():
    bm = BlockManager(6, 4, enable_prefix_caching=False, watermark=0.0, num_cpu_blocks=4)
    sched = Scheduler(SchedulerConfig(8, 1000, 4096, "swap"), bm)
    seqs = [make_seq(8, float(i)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    fake_step(sched)
    old_table = list(seqs[2].block_table)
    out = fake_step(sched)  # the newest is swapped out
    assert out.preempted == [seqs[2]] and sched.swapped == [seqs[2]]
    assert [g for g, _ in out.swap_out] == old_table and seqs[2].num_computed_tokens == 8
    assert seqs[2].block_table == [] and len(seqs[2].cpu_block_table) == 2 and len(bm.cpu_free) == 2
    parked = list(seqs[2].cpu_block_table)
    sched.finish(seqs[0])
    out = fake_step(sched)  # room again: swapped back in, and it resumes decoding (1 token)
    assert [c for c, _ in out.swap_in] == parked and [g for _, g in out.swap_in] == seqs[2].block_table[:2]
    assert (seqs[2], 1) in out.scheduled and len(bm.cpu_free) == 4
    for s in seqs[1:]:
        sched.finish(s)
    assert bm.num_free_blocks == 6


class _Grammar:
    """What the scheduler reads of a GrammarState: is its compiled matcher ready?"""

    def __init__(self) -> None:
        self.ready = False

    def accept(self, token_id: int) -> None:
        pass


def test_a_sequence_whose_grammar_compiles_waits_and_others_go_by():
    """vLLM's WAITING_FOR_FSM: the grammar compiles off the engine thread meanwhile."""
    sched, _ = make(budget=1000)
    constrained, free = make_seq(5, 1.0), make_seq(5, 2.0)
    constrained.grammar = _Grammar()
    sched.add(constrained)
    sched.add(free)
    out = fake_step(sched)
    assert [s for s, _ in out.scheduled] == [free]
    assert sched.waiting == [constrained] and constrained.num_computed_tokens == 0
    assert constrained not in [s for s, _ in fake_step(sched).scheduled]
    constrained.grammar.ready = True
    assert [s for s, _ in fake_step(sched).scheduled] == [free, constrained]
    assert constrained.status == SequenceStatus.RUNNING
