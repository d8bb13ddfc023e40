"""GPU memory sizing with a fake device: the profile measures the activation peak,
the KV cache gets the rest of total x utilization, and a model that leaves no
room for one --max-model-len sequence fails with a message naming the flags.
A draft model's weights and its pool (as many blocks as the target's) share the budget."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rawpage.memory import (
    DraftMemory,
    GiB,
    OutOfMemoryError,
    PoolLayout,
    plan_cpu_default,
    plan_fixed,
    plan_gpu,
    profile_gpu,
)

MiB = 1 << 20


class FakeDevice:
    """A GPU of `total` bytes: `context` bytes taken before we start, and a pool that,
    like CuPy's, keeps every block it hands out until release_cached()."""

    def __init__(self, total: int, context: int = 0) -> None:
        self.total, self.context = total, context
        self.live = 0  # bytes in arrays that exist
        self.cached = 0  # bytes the pool holds for reuse
        self.released = 0

    def alloc(self, n: int) -> None:
        reuse = min(n, self.cached)
        self.cached -= reuse
        self.live += n

    def free(self, n: int) -> None:
        self.live -= n
        self.cached += n

    # memory.DeviceMemory
    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.context - self.live - self.cached, self.total

    def pool_held_bytes(self) -> int:
        return self.live + self.cached

    def release_cached(self) -> None:
        self.released += 1
        self.cached = 0

    def synchronize(self) -> None:
        pass


def forward_pass(dev: FakeDevice, *steps: int):
    """A worst-case pass that allocates and frees activations; its peak is max(steps)
    when each step frees the previous one's arrays first."""

    def run() -> None:
        for n in steps:
            dev.alloc(n)
            dev.free(n)

    return run


def test_kv_gets_what_is_left_under_utilization():
    dev = FakeDevice(total=80 * GiB, context=700 * MiB)
    weights = 16 * GiB
    dev.alloc(weights)
    per_block = 2 * MiB  # e.g. Llama-3-8B: 32 layers x 16 tokens x 8 heads x 128 x 2 bytes x 2
    plan = profile_gpu(dev, weights, forward_pass(dev, 1 * GiB, 3 * GiB, 2 * GiB), 0.9, PoolLayout(per_block, 16, 8192))
    assert plan.activation_bytes == 3 * GiB
    assert plan.other_bytes == 700 * MiB
    want_blocks = (int(80 * GiB * 0.9) - weights - 3 * GiB - 700 * MiB) // per_block
    assert plan.num_blocks == want_blocks
    assert plan.kv_bytes == want_blocks * per_block
    assert dev.cached == 0, "the profile's cached blocks go back before the KV cache is allocated"
    text = plan.describe()
    assert "80.00 GiB x utilization 0.90" in text and f"{want_blocks} blocks x 16 tokens" in text
    assert f"{want_blocks * 16 / 8192:.1f} sequences of --max-model-len 8192 fit" in text


def test_memory_in_use_before_profiling_counts_against_the_budget():
    """Arrays that are not weights (a rope table, another process) shrink the KV cache."""
    dev = FakeDevice(total=40 * GiB)
    dev.alloc(10 * GiB)  # weights
    dev.alloc(1 * GiB)  # something else the model keeps
    plan = profile_gpu(dev, 10 * GiB, forward_pass(dev, 2 * GiB), 0.5, PoolLayout(MiB, 16, 1024))
    assert plan.num_blocks == (20 * GiB - 10 * GiB - 2 * GiB - 1 * GiB) // MiB


def test_utilization_too_low_says_which_flag_and_what_value():
    dev = FakeDevice(total=24 * GiB, context=500 * MiB)
    dev.alloc(15 * GiB)
    with pytest.raises(OutOfMemoryError) as e:
        profile_gpu(dev, 15 * GiB, forward_pass(dev, 4 * GiB), 0.8, PoolLayout(2 * MiB, 16, 8192))
    msg = str(e.value)
    # 15 + 4 + 0.49 GiB in use, and 8192 tokens need 512 blocks = 1 GiB: 20.49 / 24 = 0.854, rounded up
    assert "raise --gpu-memory-utilization to 0.86" in msg
    assert "lower --max-num-batched-tokens" in msg  # no KV room at all: the peak is what to shrink
    assert "weights 15.000 GiB, peak activations 4.000 GiB" in msg


def test_room_for_part_of_a_sequence_suggests_a_shorter_max_model_len():
    # 20 GiB budget - 15 - 4 = 1 GiB = 512 blocks of 2 MiB = 8192 tokens < 16384;
    # 16384 tokens need 2 GiB: (15 + 4 + 2) / 25 = 0.84
    plan_args = (int(20 * GiB / 0.8), 0.8, 15 * GiB, 4 * GiB, PoolLayout(2 * MiB, 16, 16384))
    with pytest.raises(OutOfMemoryError) as e:
        plan_gpu(*plan_args)
    msg = str(e.value)
    assert "Lower --max-model-len to 8192 or less, or raise --gpu-memory-utilization to 0.84" in msg


def test_a_model_bigger_than_the_gpu_says_so():
    with pytest.raises(OutOfMemoryError, match="the model does not fit this GPU"):
        plan_gpu(16 * GiB, 0.9, 20 * GiB, GiB, PoolLayout(MiB, 16, 4096))


def test_plan_gpu_exact_arithmetic():
    plan = plan_gpu(100_000, 0.5, 20_000, 5_000, PoolLayout(1_000, 16, 100), other_bytes=4_500)
    assert plan.num_blocks == (50_000 - 20_000 - 5_000 - 4_500) // 1_000 == 20
    assert plan.num_tokens == 320


@settings(deadline=None)
@given(  # budgets that always hold one 256-token sequence: >= 10 - 4 - 1 - 2 GiB of KV room
    total=st.integers(20 * GiB, 200 * GiB),
    utilization=st.floats(0.5, 0.95),
    weights=st.integers(0, 4 * GiB),
    draft_weights=st.integers(0, GiB),
    per_block=st.integers(16 * 2**10, 4 * MiB),
    draft_per_block=st.integers(2**10, 4 * MiB),
)
def test_target_and_draft_pools_share_the_gpu_budget(
    total, utilization, weights, draft_weights, per_block, draft_per_block
):
    """Weights of both, activations, other, the target's pool and the draft's pool (one
    block each per block of the target) fit under total x utilization, and one more pair
    would not; both pools hold the same number of tokens."""
    draft = DraftMemory(draft_weights, draft_per_block)
    plan = plan_gpu(total, utilization, weights, 2 * GiB, PoolLayout(per_block, 16, 256, draft=draft), other_bytes=MiB)
    used = weights + draft_weights + 2 * GiB + MiB + plan.kv_bytes + plan.draft_kv_bytes
    budget = int(total * utilization)
    assert used <= budget < used + per_block + draft_per_block
    assert plan.kv_bytes == plan.num_blocks * per_block
    assert plan.draft_kv_bytes == plan.num_blocks * draft_per_block  # the draft's token capacity = the target's
    alone = plan_gpu(total, utilization, weights, 2 * GiB, PoolLayout(per_block, 16, 256), other_bytes=MiB)
    assert plan.num_blocks <= alone.num_blocks  # the target's pool shrinks to make room


def test_fixed_budget_holds_both_pools_and_the_log_shows_the_draft_share():
    draft = DraftMemory(300 * MiB, 256 * 2**10)
    plan = plan_fixed(GiB, PoolLayout(768 * 2**10, 16, 1024, draft=draft), weights_bytes=2 * GiB)
    assert plan.num_blocks == GiB // (1 * MiB) == 1024  # 768 KiB + 256 KiB a block pair
    assert plan.kv_bytes + plan.draft_kv_bytes == GiB
    assert plan.all_weights_bytes == 2 * GiB + 300 * MiB
    text = plan.describe()
    assert "KV cache: 1024 blocks x 16 tokens (768 KiB per block)" in text
    assert "draft model: 0.293 GiB weights, 0.250 GiB KV for 1024 blocks (256 KiB per block)" in text
    assert "draft model" not in plan_fixed(GiB, PoolLayout(768 * 2**10, 16, 1024)).describe()


def test_profile_counts_the_loaded_draft_as_weights_not_other():
    dev = FakeDevice(total=80 * GiB, context=700 * MiB)
    dev.alloc(16 * GiB)  # target weights
    dev.alloc(GiB)  # draft weights
    draft = DraftMemory(GiB, MiB)
    plan = profile_gpu(dev, 16 * GiB, forward_pass(dev, 3 * GiB), 0.9, PoolLayout(2 * MiB, 16, 8192, draft=draft))
    assert plan.other_bytes == 700 * MiB
    assert plan.num_blocks == (int(80 * GiB * 0.9) - 17 * GiB - 3 * GiB - 700 * MiB) // (3 * MiB)


def test_a_budget_that_holds_the_target_but_not_its_draft_says_what_to_change():
    # 20.5 GiB budget - 15 - 4 = 1.5 GiB: 768 target blocks of 2 MiB alone (12,288 tokens);
    # less the draft's 0.5 GiB of weights, 1 GiB buys 256 pairs of 2 + 2 MiB (4,096 tokens).
    # 8192 tokens need 512 pairs = 2 GiB: (15 + 0.5 + 4 + 2) / 25.625 = 0.839, rounded up
    draft = DraftMemory(GiB // 2, 2 * MiB)
    plan_args = (int(20.5 * GiB / 0.8), 0.8, 15 * GiB, 4 * GiB)
    assert plan_gpu(*plan_args, PoolLayout(2 * MiB, 16, 8192)).num_tokens == 12288  # fits without the draft
    with pytest.raises(OutOfMemoryError) as e:
        plan_gpu(*plan_args, PoolLayout(2 * MiB, 16, 8192, draft=draft))
    msg = str(e.value)
    assert "holds 4,096 tokens (256 blocks, each with a draft model block)" in msg
    assert "Lower --max-model-len to 4096 or less, or raise --gpu-memory-utilization to 0.84" in msg
    assert "or use a smaller draft model in --speculative-config" in msg
    assert "draft model: 0.500 GiB weights, 0.500 GiB KV for 256 blocks" in msg
    with pytest.raises(OutOfMemoryError, match="the model and its draft model do not fit this GPU"):
        plan_gpu(16 * GiB, 0.9, 14 * GiB, GiB, PoolLayout(MiB, 16, 4096, draft=DraftMemory(2 * GiB, MiB)))
    with pytest.raises(OutOfMemoryError, match="raise --kv-cache-memory to 128MiB"):  # 64 pairs of 2 MiB
        plan_fixed(100 * MiB, PoolLayout(MiB, 16, 1024, draft=DraftMemory(0, MiB)))


def test_gpu_path_profiles_the_draft_and_plans_its_pool(tiny_model_dir, monkeypatch):
    """rank_setup on a (fake) GPU: the worst-case pass runs the target then the draft,
    and the plan counts the loaded draft's weights and gives it as many blocks."""
    from rawpage import rank_setup
    from rawpage.backends import get_backend
    from rawpage.engine_args import EngineArgs
    from rawpage.model_runner import kv_bytes_per_block
    from rawpage.spec_decode.draft_model import load_draft_model

    backend = get_backend("cpu")
    target = load_draft_model(tiny_model_dir, backend, 400)  # any checkpoint loads this way
    draft = load_draft_model(tiny_model_dir, backend, 400)
    dev = FakeDevice(total=GiB, context=100 * MiB)
    dev.alloc(target.num_bytes() + draft.num_bytes())
    monkeypatch.setattr(backend, "memory", dev)
    profiled = []
    monkeypatch.setattr(rank_setup, "profile_run", lambda m, *_: profiled.append(m))
    a = EngineArgs(model=tiny_model_dir, gpu_memory_utilization=0.5)
    plan = rank_setup.plan_kv_cache(a, target, backend, 2048, 1024, draft=draft)
    assert profiled == [target, draft]
    assert plan.other_bytes == 100 * MiB and plan.draft.weights_bytes == draft.num_bytes()
    per_block = kv_bytes_per_block(target.config, 16, 4)
    room = GiB // 2 - target.num_bytes() - draft.num_bytes() - 100 * MiB
    assert plan.num_blocks == room // (2 * per_block)  # a draft of the same shape: pairs of equal blocks


def test_small_sizes_are_shown_in_mib():
    from rawpage.memory import size_text

    assert (size_text(85 * MiB), size_text(0 * MiB), size_text(3 * GiB)) == ("85.0 MiB", "0.0 MiB", "3.000 GiB")


def test_the_default_cpu_pool_is_what_max_num_seqs_sequences_need_when_less_than_2_gib():
    """A tiny model's 2 GiB would be 262,144 blocks; 4 sequences of 100 tokens need 4 x 7."""
    plan = plan_cpu_default(4, PoolLayout(8 * 2**10, 16, 100))
    assert plan.num_blocks == 4 * 7 and plan.kv_bytes == 28 * 8 * 2**10
    assert "KV pool: 28 blocks = what 4 seqs x 100 tokens need (less than the 2 GiB default" in plan.describe()
    window = plan_cpu_default(
        4, PoolLayout(8 * 2**10, 16, 4096, sliding_window=32)
    )  # a sequence holds 3 blocks at most
    assert window.num_blocks == 4 * 3
    big = plan_cpu_default(
        256, PoolLayout(768 * 2**10, 16, 8192)
    )  # SmolLM2's blocks: 2 GiB is less than 256 x 8192 tokens
    assert big.num_blocks == 2 * GiB // (768 * 2**10) and "KV pool" not in big.describe()
    assert plan_cpu_default(4, PoolLayout(8 * 2**10, 16, 100, draft=DraftMemory(0, 2**10))).draft_kv_bytes == 28 * 2**10


def test_the_engine_sizes_its_default_pool_to_its_sequences(tiny_model_dir, caplog):
    from rawpage.engine import LLMEngine

    with caplog.at_level("INFO", logger="rawpage"):
        engine = LLMEngine(model=tiny_model_dir, max_num_seqs=3, max_model_len=64)
    assert engine.memory.num_blocks == engine.block_manager.num_blocks == 3 * 4
    assert "KV pool: 12 blocks = what 3 seqs x 64 tokens need" in caplog.text


def test_the_worst_case_pass_keeps_each_sequence_inside_max_model_len():
    """One sequence (--max-num-seqs 1) cannot take the whole token budget past
    --max-model-len: the rotary tables stop there (an H200 run read past them)."""
    from rawpage.profile_run import worst_case_batch

    one = worst_case_batch(8192, 1, 16, 1024)
    assert one.positions.max() == 1023 and one.seq_lens.tolist() == [1024]
    assert one.block_tables.shape == (1, 64)
    many = worst_case_batch(8192, 256, 16, 1024)
    assert many.seq_lens.tolist() == [32] * 256  # the budget, spread: unchanged


def test_the_worst_case_pass_runs_the_real_kernels_inside_their_tables(tiny_model_dir, monkeypatch):
    """The pass on the simulator with every argument fenced: 700 tokens, one sequence,
    --max-model-len 64 (before the cap, rope read past its 64-row table)."""
    from rawpage.backends import get_backend
    from rawpage.profile_run import profile_run
    from rawpage.spec_decode.draft_model import load_draft_model

    monkeypatch.setenv("RAWPAGE_SIM_DEBUG", "1")
    backend = get_backend("sim")
    model = load_draft_model(tiny_model_dir, backend, 400)
    model.limit_positions(64)  # what the engine does for --max-model-len 64
    profile_run(model, backend, 700, 1, 16, 64)
