"""The engine view's snapshots (GET /v1/engine/events) against the block manager's own state,
step by step, through sharing, copy-on-write, prefix caching and swapping."""

import json

import numpy as np
import pytest

from rawpage import LLM, SamplingParams
from rawpage.server.engine_view import CACHED, FREE, SHARED, USED, EngineView, run_lengths
from tests.test_engine import random_prompts


def expand(rle: list[int]) -> list[int]:
    return [v for v, n in zip(rle[::2], rle[1::2]) for _ in range(n)]


def check_snapshot(engine, snap: dict) -> None:
    """Decode the snapshot and compare every field with the engine's state right now."""
    bm, sc = engine.block_manager, engine.scheduler
    assert snap["pool"]["num_blocks"] == bm.num_blocks and snap["pool"]["block_size"] == bm.block_size
    state, owner = expand(snap["state"]), expand(snap["owner"])
    refs = expand(snap["refs"])
    assert len(state) == len(owner) == len(refs) == bm.num_blocks
    for b in range(bm.num_blocks):
        r = bm.ref_counts[b]
        want = SHARED if r > 1 else USED if r == 1 else CACHED if bm.prefix_cache.block_hash[b] is not None else FREE
        assert state[b] == want, f"block {b}"
        assert refs[b] == r
        holders = [s.seq_id for s in sc.running if b in s.block_table]
        assert owner[b] == (min(holders) if holders else -1)
    image = expand(snap["image"])
    assert len(image) == bm.num_blocks
    spans = {  # each running sequence's blocks that hold a position of one of its images
        b
        for s in sc.running
        for im in s.request.images
        for p in range(im.offset, im.offset + im.length)
        if p // bm.block_size < len(s.block_table) and (b := s.block_table[p // bm.block_size]) >= 0
    }
    assert {b for b in range(bm.num_blocks) if image[b]} == spans
    cpu_owner = expand(snap["cpu_owner"])
    assert len(cpu_owner) == bm.num_cpu_blocks
    for c in range(bm.num_cpu_blocks):
        holders = [s.seq_id for s in sc.swapped if c in s.cpu_block_table]
        assert cpu_owner[c] == (holders[0] if holders else -1)
    for name, queue in (("running", sc.running), ("waiting", sc.waiting), ("swapped", sc.swapped)):
        assert snap["counts"][name] == len(queue)
        assert [q["id"] for q in snap["queues"][name]] == [s.seq_id for s in queue]
        for q, s in zip(snap["queues"][name], queue):
            assert (q["tokens"], q["computed"], q["prompt"]) == (
                s.num_tokens,
                s.num_computed_tokens,
                s.num_prompt_tokens,
            )


def watch(llm: LLM, prompts, params) -> list[dict]:
    """Run to the end with a snapshot after every step, each checked against the engine."""
    engine, view = llm.engine, EngineView(min_interval=0, max_overhead=float("inf"))
    view.watchers = 1
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    snaps = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        view.on_step(engine, outputs)
        snaps.append(json.loads(view.latest.data))
        check_snapshot(engine, snaps[-1])
    return snaps


def test_run_lengths():
    assert run_lengths(np.array([], dtype=np.int64)) == []
    assert run_lengths(np.array([5])) == [5, 1]
    assert run_lengths(np.array([-1, -1, 3, 3, 3, -1, 2])) == [-1, 2, 3, 3, -1, 1, 2, 1]


def test_snapshots_follow_sharing_and_prefix_caching(tiny_model_dir):
    prefix = random_prompts(1, 40, 41, seed=5)[0]["prompt_token_ids"]
    prompts = [{"prompt_token_ids": prefix + p["prompt_token_ids"]} for p in random_prompts(4, 5, 30, seed=6)]
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, max_num_batched_tokens=64)
    snaps = watch(llm, prompts, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=20, ignore_eos=True))
    states = [set(expand(s["state"])) for s in snaps]
    assert any(SHARED in s for s in states)  # the n=2 prompts, and the shared prefix
    assert states[-1] <= {FREE, CACHED} and CACHED in states[-1]  # drained, with the prefixes still cached
    assert snaps[-1]["counts"] == {"running": 0, "waiting": 0, "swapped": 0}
    budget = snaps[0]["pool"]["max_num_batched_tokens"]
    for s in snaps:  # each step's split stays within the token budget
        for _, chunks, decodes in s["steps"]:
            assert sum(chunks) + decodes <= budget
    steps = [step for s in snaps for step in s["steps"]]
    assert any(chunks for _, chunks, _ in steps) and any(d for _, _, d in steps)
    assert snaps[-1]["totals"]["cow_copies"] == llm.engine.block_manager.num_cow_copies > 0


def test_snapshots_show_swapped_sequences(tiny_model_dir):
    block_bytes = 2 * 4 * 16 * 2 * 32 * 4
    llm = LLM(
        tiny_model_dir,
        num_gpu_blocks_override=20,
        max_model_len=320,
        max_num_batched_tokens=64,
        preemption_mode="swap",
        swap_space=400 * block_bytes / 2**30,
        enable_prefix_caching=False,
    )
    snaps = watch(llm, random_prompts(12, 5, 200, seed=3), SamplingParams(temperature=0, max_tokens=24))
    swapped = [s for s in snaps if s["counts"]["swapped"]]
    assert swapped and any(v >= 0 for v in expand(swapped[0]["cpu_owner"]))
    assert set(expand(snaps[-1]["cpu_owner"])) == {-1}


def test_rate_limit_and_idle_snapshot(tiny_model_dir):
    """Snapshots come at most every min_interval while busy, the step that leaves the engine
    idle is always snapshotted, and nothing is taken while nobody watches."""
    llm = LLM(tiny_model_dir)
    engine, view = llm.engine, EngineView(min_interval=3600)
    engine.add_request("a", random_prompts(1, 10, 11, seed=1)[0], SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    view.on_step(engine, [])
    assert view.latest is None  # no watcher
    view.watchers = 1
    ids = []
    while engine.has_unfinished_requests():
        view.on_step(engine, engine.step())
        ids.append(view.latest.id)
    assert ids[0] == 1 and ids[-1] == 2 and set(ids) == {1, 2}  # the first, then the idle one only
    last = json.loads(view.latest.data)
    assert last["counts"]["running"] == 0 and len(last["steps"]) == len(ids) - 1


def test_a_new_watcher_gets_the_current_state_within_the_budget(tiny_model_dir):
    """refresh() (run for each new stream) reuses a current snapshot, takes one when the
    engine is idle, and while it is busy waits for the next due one."""
    llm = LLM(tiny_model_dir)
    engine, view = llm.engine, EngineView(min_interval=3600)
    view.refresh(engine)  # idle, nothing yet: taken
    assert view.latest.id == 1 and view.is_current
    view.refresh(engine)  # nothing changed: reused
    assert view.latest.id == 1
    engine.add_request("a", random_prompts(1, 10, 11, seed=1)[0], SamplingParams(temperature=0, max_tokens=8))
    view.on_step(engine, engine.step())  # busy, nobody watching: nothing taken, but no longer current
    assert view.latest.id == 1 and not view.is_current
    view.refresh(engine)  # busy and not due (min_interval): left to the next due step
    assert view.latest.id == 1
    view.watchers = 1
    while engine.has_unfinished_requests():
        view.on_step(engine, engine.step())
    assert view.latest.id == 2 and view.is_current  # the idle step's snapshot
    view.refresh(engine)
    assert view.latest.id == 2


def test_a_tenant_sees_only_its_own_sequences(tiny_model_dir):
    """Issue 29, item 4: requests r0 and r1 are tenant a's, the rest b's. a's view lists only
    its sequences and steps; b's blocks are anonymous (OTHER_TENANT), never "shared"; no
    reference counts or prefix-cache totals, which would tell a whether its guess of b's
    prompt was right. The full view (admin, or no keys) is unchanged."""
    from rawpage.server.engine_view import OTHER_TENANT

    prefix = random_prompts(1, 40, 41, seed=5)[0]["prompt_token_ids"]
    prompts = [{"prompt_token_ids": prefix + p["prompt_token_ids"]} for p in random_prompts(4, 5, 30, seed=6)]
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, max_num_batched_tokens=64)
    engine = llm.engine
    view = EngineView(
        min_interval=0, max_overhead=float("inf"), owner_of=lambda rid: "a" if rid in ("r0", "r1") else "b"
    )
    view.watchers = 1
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    seen_other = False
    while engine.has_unfinished_requests():
        view.on_step(engine, engine.step())
        full, a = json.loads(view.latest.data), json.loads(view.latest.for_tenant("a"))
        check_snapshot(engine, full)
        mine = {
            s.seq_id
            for s in engine.scheduler.running + engine.scheduler.waiting
            if s.request.request_id in ("r0", "r1")
        }
        listed = {q["id"] for entries in a["queues"].values() for q in entries}
        assert listed == mine and sum(a["counts"].values()) == len(mine)
        assert {q["request"] for entries in a["queues"].values() for q in entries} <= {"r0", "r1"}
        owners = set(expand(a["owner"]))
        assert owners <= mine | {-1, OTHER_TENANT}
        seen_other |= OTHER_TENANT in owners
        assert SHARED not in expand(a["state"]) and "refs" not in a
        assert a["totals"] == {"steps": full["totals"]["steps"]} and "prefix_hits" in full["totals"]
        assert len(expand(a["state"])) == len(expand(full["state"]))  # the occupancy itself is all there
    assert seen_other
    assert json.loads(view.latest.for_tenant("nobody"))["queues"] == {"running": [], "waiting": [], "swapped": []}


def test_blocks_holding_image_tokens_are_marked(tmp_path):
    """Issue 45, item 5: `image` marks each block that holds a running sequence's image
    tokens (checked against the block tables in check_snapshot, step by step), whatever the
    block's state; and a tenant sees image marks on its own blocks only."""
    pytest.importorskip("PIL")
    from tests.tiny_vlm import seeded_image, write_vlm

    folder = write_vlm(str(tmp_path / "gemma3-vlm"))
    # 8-token blocks; the image's tokens cross a block boundary (asserted below), and a
    # text-only request runs alongside
    llm = LLM(folder, block_size=8, num_gpu_blocks_override=64, max_num_batched_tokens=16)
    picture = {
        "prompt": "Look at this: <start_of_image> What is it?",
        "multi_modal_data": {"image": seeded_image(3, 40, 30)},
    }
    text = {"prompt": "Just some words, no picture at all, for the other sequence."}
    engine, view = llm.engine, EngineView(min_interval=0, max_overhead=float("inf"), owner_of=lambda rid: rid)
    view.watchers = 1
    engine.add_request("pic", picture, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.add_request("txt", text, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    (im,) = engine.scheduler.waiting[0].request.images
    marked = []
    while engine.has_unfinished_requests():
        view.on_step(engine, engine.step())
        full = json.loads(view.latest.data)
        check_snapshot(engine, full)
        image, owner = np.array(expand(full["image"])), np.array(expand(full["owner"]))
        pic = {s.seq_id for s in engine.scheduler.running if s.request.request_id == "pic"}
        assert set(owner[image == 1]) <= pic  # the text sequence's blocks are never marked
        if pic:
            (seq,) = [s for s in engine.scheduler.running if s.request.request_id == "pic"]
            held = seq.block_table[im.offset // 8 : (im.offset + im.length - 1) // 8 + 1]
            assert sorted(np.flatnonzero(image)) == sorted(held)
            assert expand(json.loads(view.latest.for_tenant("pic"))["image"]) == list(image)
            assert set(expand(json.loads(view.latest.for_tenant("txt"))["image"])) == {0}
        marked.append(int(image.sum()))
    assert max(marked) == 2  # its 4 soft tokens, at 15..18, cross the boundary at 16
    assert marked[-1] == 0  # drained: nothing held, nothing marked
