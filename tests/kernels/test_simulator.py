"""The simulator's CUDA semantics, and the mistakes it must catch, on small
purpose-built kernels (sim_cases/*.cu). These run only under the simulator."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from rawpage.dtypes import bf16_from_f32
from rawpage.sim import SimCompileError, SimLaunchError, SimModule
from rawpage.sim.build import build_module

CASES = Path(__file__).parent / "sim_cases"


@pytest.fixture(scope="module")
def sim():
    return SimModule(CASES / "intrinsics.cu", debug=False, workers=2)


@pytest.fixture(scope="module")
def sim_debug():
    return SimModule(CASES / "intrinsics.cu", debug=True, workers=2)


def expected_source_lane(kind: str, lane: int, arg: int, width: int) -> int:
    seg = lane - lane % width
    if kind == "idx":
        return seg + arg % width
    if kind == "up":
        return lane - arg if lane - seg >= arg else lane
    if kind == "down":
        return lane + arg if lane - seg + arg < width else lane
    src = lane ^ arg  # xor: earlier width-groups are readable, later ones are not
    return lane if src >= seg + width else src


@pytest.mark.parametrize("src,delta", [(5, 3), (13, 9), (0, 1)])
def test_shuffles_follow_cuda_semantics(sim, src, delta):
    out = np.zeros((64, 8), np.int32)
    sim.get_function("shuffles")((1,), (64,), (out, np.int32(src), np.int32(delta)))
    kinds = ["idx", "up", "down", "xor"]
    for t in range(64):
        lane, warp = t % 32, t // 32
        for col, (kind, width) in enumerate([(k, 32) for k in kinds] + [(k, 8) for k in kinds]):
            arg = src if kind == "idx" else delta
            want = 100 * expected_source_lane(kind, lane, arg, width) + warp
            assert out[t, col] == want, (t, kind, width)


def test_shuffles_move_any_type_up_to_8_bytes(sim):
    f = np.arange(32, dtype=np.float32) * 1.5
    h = np.arange(32, dtype=np.float16)
    d = np.arange(32, dtype=np.float64) ** 2
    f0, h0, d0 = f.copy(), h.copy(), d.copy()
    sim.get_function("shuffle_types")((1,), (32,), (f, h, d))
    np.testing.assert_array_equal(f, f0[np.arange(32) ^ 1])
    np.testing.assert_array_equal(h, h0[np.where(np.arange(32) + 3 < 32, np.arange(32) + 3, np.arange(32))])
    np.testing.assert_array_equal(d, np.full(32, d0[31]))


def test_votes_and_counting_barriers(sim):
    pred = (np.random.default_rng(0).random(64) < 0.4).astype(np.int32)
    pred[32:] = 1  # the second warp is unanimous
    out = np.zeros((64, 6), np.uint32)
    sim.get_function("votes")((1,), (64,), (out, pred))
    for w in range(2):
        p = pred[32 * w : 32 * w + 32]
        ballot = sum(int(b) << i for i, b in enumerate(p))
        assert (out[32 * w : 32 * w + 32, 0] == ballot).all()
        assert (out[32 * w : 32 * w + 32, 1] == int(p.any())).all()
        assert (out[32 * w : 32 * w + 32, 2] == int(p.all())).all()
    assert (out[:, 3] == pred.sum()).all()
    assert (out[:, 4] == int(pred.all())).all() and (out[:, 5] == 1).all()


@pytest.mark.parametrize("workers", [1, 3])
def test_atomics_across_blocks_on_several_workers(workers):
    m = SimModule(CASES / "intrinsics.cu", debug=False, workers=workers)
    counter, fsum = np.zeros(1, np.int32), np.zeros(1, np.float32)
    maximum, cas = np.full(1, -1, np.int32), np.zeros(2, np.uint32)
    m.get_function("atomics")((8,), (64,), (counter, fsum, maximum, cas))
    assert counter[0] == 512 and fsum[0] == 256.0 and maximum[0] == 511
    assert cas[1] == 1 and 1 <= cas[0] <= 512


def test_3d_grids_and_blocks(sim):
    grid, block = (3, 2, 2), (4, 3, 2)
    out = np.full(12 * 24, -1, np.int32)
    sim.get_function("indices")(grid, block, (out,))
    want = [b * 10000 + t for b in range(12) for t in range(24)]
    np.testing.assert_array_equal(out, want)


def test_static_and_dynamic_shared_memory(sim):
    x = np.arange(256, dtype=np.float32)
    out = np.zeros_like(x)
    sim.get_function("reverse_in_shared")((4,), (64,), (out, x), shared_mem=64 * 4)
    np.testing.assert_array_equal(out, x.reshape(4, 64)[:, ::-1].ravel())


def bf16_nearest_even(x: np.ndarray) -> np.ndarray:
    """Independent reference: pick the nearer of the two bfloat16 neighbours in float64."""
    bits = x.view(np.uint32).astype(np.uint64)
    lo = bits >> 16
    lo_val = ((lo << 16).astype(np.uint32)).view(np.float32).astype(np.float64)
    hi_val = (((lo + 1) << 16).astype(np.uint32)).view(np.float32).astype(np.float64)
    d_lo, d_hi = np.abs(x - lo_val), np.abs(hi_val - x)
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo % 2 == 1))
    return (lo + up).astype(np.uint16)


def test_float16_and_bfloat16_conversions_round_to_nearest_even(sim):
    rng = np.random.default_rng(0)
    special = [0.0, -0.0, 1.0, 65504.0, 65519.0, 65520.0, 1e9, 2.0**-24, 2.0**-25, 3 * 2.0**-26]
    special += [1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 6e-5, -7.5e-6]
    x = np.concatenate(
        [
            np.array(special, np.float32),
            (rng.standard_normal(5000) * 10.0 ** rng.integers(-9, 6, 5000)).astype(np.float32),
            rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        ]
    )
    x = x[np.isfinite(x)]
    n = len(x)
    h, b = np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    h_back, b_back = np.zeros(n, np.float32), np.zeros(n, np.float32)
    sim.get_function("conversions")((8,), (128,), (h, b, h_back, b_back, x, np.int32(n)))
    with np.errstate(over="ignore"):  # large values become inf, as in CUDA
        as_half = x.astype(np.float16)  # NumPy rounds to nearest even
    np.testing.assert_array_equal(h, as_half.view(np.uint16))
    np.testing.assert_array_equal(h_back, as_half.astype(np.float32))
    np.testing.assert_array_equal(b, bf16_nearest_even(x))
    np.testing.assert_array_equal(b, bf16_from_f32(x))  # the host side agrees bit for bit
    np.testing.assert_array_equal(b_back, (b.astype(np.uint32) << 16).view(np.float32))
    specials = np.array([np.inf, -np.inf, np.nan], np.float32)
    hs, bs = np.zeros(3, np.uint16), np.zeros(3, np.uint16)
    sim.get_function("conversions")(
        (1,),
        (32,),
        (hs, bs, np.zeros(3, np.float32), np.zeros(3, np.float32), specials, np.int32(3)),
    )
    assert list(hs[:2]) == [0x7C00, 0xFC00] and (hs[2] & 0x7C00) == 0x7C00 and hs[2] & 0x3FF
    assert list(bs[:2]) == [0x7F80, 0xFF80] and (bs[2] & 0x7F80) == 0x7F80 and bs[2] & 0x7F


@pytest.mark.parametrize(
    "kernel,dtype,a_col,b_col",
    [
        ("wmma_f16_row_col", np.float16, False, True),
        ("wmma_f16_col_row", np.float16, True, False),
        ("wmma_bf16_row_row", "bf16", False, False),
    ],
)
def test_wmma_layouts_and_fragment_elementwise(sim, kernel, dtype, a_col, b_col):
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))
    C0 = rng.standard_normal((16, 16)).astype(np.float32)
    if dtype == "bf16":
        a, b = bf16_from_f32(A), bf16_from_f32(B)
        A = (a.astype(np.uint32) << 16).view(np.float32)
        B = (b.astype(np.uint32) << 16).view(np.float32)
    else:
        a, b = A.astype(dtype), B.astype(dtype)
        A, B = a.astype(np.float32), b.astype(np.float32)
    a_mem = np.ascontiguousarray(a.T if a_col else a)
    b_mem = np.ascontiguousarray(b.T if b_col else b)
    c = np.zeros((16, 16), np.float32)
    sim.get_function(kernel)((1,), (32,), (c, a_mem, b_mem, np.ascontiguousarray(C0.T), np.float32(0.5)))
    np.testing.assert_allclose(c, (A @ B + C0) * 0.5, rtol=1e-5, atol=1e-5)


# ---- mistakes the simulator must report ------------------------------------------


@pytest.mark.parametrize(
    "kernel,block,message",
    [
        ("divergent_shuffle", 32, "exited while lanes 0x0000ffff wait for it in __shfl_xor_sync"),
        ("different_collectives", 32, "warp 0 diverged"),
        ("shuffle_waits_for_a_barrier", 64, r"(?s)deadlock.*Threads 16-31,48-63 wait at __syncthr"),
        ("traps", 32, r"thread \(3,0,0\).*__trap"),
    ],
)
def test_synchronization_mistakes_are_reported(sim, kernel, block, message):
    with pytest.raises(SimLaunchError, match=message):
        sim.get_function(kernel)((1,), (block,), (np.zeros(64, np.float32),))


def test_debug_mode_catches_an_index_past_the_end(sim_debug):
    out = np.zeros(31 * 4, np.float32)  # thread 31 writes element 124, one past the end
    with pytest.raises(SimLaunchError, match=r"(?s)thread \(31,0,0\).*1 byte\(s\) past the end of argument #0"):
        sim_debug.get_function("index_past_the_end")((1,), (32,), (out, np.int32(4)))
    sim_debug.get_function("index_past_the_end")((1,), (32,), (np.zeros(125, np.float32), np.int32(4)))


def test_debug_mode_catches_an_index_before_the_start(sim_debug):
    with pytest.raises(SimLaunchError, match="before the start of argument #0"):
        sim_debug.get_function("index_before_the_start")((1,), (32,), (np.zeros(64, np.float32),))


def test_debug_mode_catches_writes_past_dynamic_shared_memory(sim_debug):
    fn = sim_debug.get_function("writes_past_dynamic_smem")
    fn((1,), (32,), (np.zeros(1, np.float32), np.int32(15)), shared_mem=64)
    with pytest.raises(SimLaunchError, match="past the end of its 64 bytes of dynamic shared"):
        fn((1,), (32,), (np.zeros(1, np.float32), np.int32(16)), shared_mem=64)


def test_wild_pointer_is_an_error_not_a_crash(sim):
    with pytest.raises(SimLaunchError, match="segmentation fault"):
        sim.get_function("index_past_the_end")((1,), (32,), (np.zeros(1, np.float32), np.int32(1 << 28)))


def test_fiber_stack_overflow_is_named(sim):
    with pytest.raises(SimLaunchError, match="stack overflow"):
        sim.get_function("deep_recursion_stack")((1,), (32,), (np.zeros(1, np.float32), np.int32(3)))


@pytest.mark.parametrize(
    "grid,block,smem,message",
    [
        ((1,), (1025,), 0, "over CUDA's limits"),
        ((1, 70000), (32,), 0, "over CUDA's limits"),
        ((0,), (32,), 0, "has a zero"),
        ((1,), (32,), 300 * 1024, "dynamic shared memory"),
    ],
)
def test_invalid_launch_configurations(sim, grid, block, smem, message):
    fn = sim.get_function("reverse_in_shared")
    with pytest.raises(SimLaunchError, match=message):
        fn(grid, block, (np.zeros(64, np.float32), np.zeros(64, np.float32)), shared_mem=smem)


def test_scalar_arguments_are_checked_against_the_signature(sim):
    fn = sim.get_function("takes_scalars")
    out = np.zeros(4, np.float32)
    fn((1,), (1,), (out, np.float32(1.5), np.int32(-2), np.uint32(3), np.int64(1 << 40)))
    np.testing.assert_array_equal(out, [1.5, -2.0, 3.0, float(1 << 40)])
    ok = [out, np.float32(1), np.int32(1), np.uint32(1), np.int64(1)]
    for i, bad in [(1, 1.5), (1, np.float64(1.5)), (2, np.int64(1)), (3, np.int32(1)), (0, 5)]:
        args = list(ok)
        args[i] = bad
        with pytest.raises(TypeError, match=f"argument {i} of takes_scalars"):
            fn((1,), (1,), tuple(args))
    with pytest.raises(TypeError, match="takes 5 arguments"):
        fn((1,), (1,), (out,))


def test_compile_errors_point_at_the_kernel_source_line():
    with pytest.raises(SimCompileError, match=r"bad_syntax\.cu:4:\d+: error"):
        SimModule(CASES / "bad_syntax.cu")


def test_builds_are_cached_by_content(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text('extern "C" __global__ void k(float* o) { o[threadIdx.x] = 1.0f; }\n')
    first = build_module(src)
    assert build_module(src).path == first.path
    (tmp_path / "clone").mkdir()  # the same source in another checkout: the same build
    assert build_module(Path(shutil.copy(src, tmp_path / "clone"))).path == first.path
    src.write_text('extern "C" __global__ void k(float* o) { o[threadIdx.x] = 2.0f; }\n')
    second = build_module(src)
    assert second.path != first.path and second.kernels == ("k",)
    out = np.zeros(32, np.float32)
    SimModule(src).get_function("k")((1,), (32,), (out,))
    assert (out == 2.0).all()


def test_threads_that_want_one_new_module_compile_it_once(tmp_path, monkeypatch):
    """The suite's prebuild thread and a test can ask for the same module at once: the
    second waits for the first's build (rawpage/sim/build.py locks each output)."""
    import threading
    import uuid

    import rawpage.sim.build as build

    src = tmp_path / "once.cu"
    fresh = uuid.uuid4().int % 10**6  # a source no earlier run has cached
    src.write_text(f'extern "C" __global__ void once(float* o) {{ o[threadIdx.x] = {fresh}.0f; }}\n')
    compiles = []
    real = build._compile_module
    monkeypatch.setattr(build, "_compile_module", lambda *a: (compiles.append(a), real(*a)))
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_module(src))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(compiles) == 1 and len({r.path for r in results}) == 1 and results[0].kernels == ("once",)
