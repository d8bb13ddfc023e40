"""The CPU thread policy: counts chosen from the usable cores and the batch, and applied."""

import ctypes
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from rawpage.backends.cpu_threads import (
    LOAD_PERIOD_S,
    CoreLoad,
    CpuThreads,
    read_proc_stat,
    threads_for,
    usable_cores,
)


@pytest.mark.parametrize(
    ("usable", "flag", "others", "want"),
    [
        (2, None, 0.0, 2),  # a quiet machine: every core (1.5x one thread, at batch 1 and 64)
        (2, None, 1.0, 1),  # one core busy elsewhere: one thread (1.7x two at batch 1)
        (2, None, 0.6, 1),
        (2, None, 0.4, 2),
        (16, None, 5.0, 11),
        (2, None, 3.0, 1),  # more load than cores: still one
        (4, None, None, 4),  # load unknown (no /proc/stat): every usable core
        (1, None, 0.0, 1),  # a one-core affinity mask: never more
        (16, 4, 10.0, 4),  # --cpu-threads fixes the count whatever the load
        (2, 8, 0.0, 2),  # ... but never beyond the usable cores
        (4, 0, 0.0, 1),
    ],
)
def test_threads_follow_the_load_and_the_affinity(usable, flag, others, want):
    assert threads_for(usable, flag, others) == want


STAT = """cpu  100 0 100 800 0 0 0 0 0 0
cpu0 {u0} 0 0 {i0} 0 0 0 0 0 0
cpu1 {u1} 0 0 {i1} 0 0 0 0 0 0
cpu2 500 0 0 0 0 0 0 0 0 0
intr 1 2 3
"""


def test_proc_stat_counts_only_our_cores():
    text = STAT.format(u0=30, i0=70, u1=10, i1=90)
    assert read_proc_stat({0, 1}, text) == (40.0, 200.0)
    assert read_proc_stat({2}, text) == (500.0, 500.0)


def test_core_load_is_the_busy_time_less_our_own():
    """Two cores over one period: both fully busy while this process used one core's
    worth of CPU, so other processes keep one core busy."""
    P = LOAD_PERIOD_S
    clock, stat, own = [0.0], [(0.0, 0.0)], [0.0]
    load = CoreLoad({0, 1}, stat=lambda: stat[0], own_cpu=lambda: own[0], clock=lambda: clock[0])
    assert load.update() is None  # nothing measured yet
    clock[0], stat[0], own[0] = P, (200.0, 200.0), P
    assert load.update() == pytest.approx(1.0)
    clock[0], stat[0], own[0] = 1.5 * P, (300.0, 300.0), 1.5 * P  # within the period: the last figure
    assert load.update() == pytest.approx(1.0)
    clock[0], stat[0], own[0] = 2 * P, (300.0, 400.0), 2 * P  # half busy, all of it ours
    assert load.update() == 0.0

    def no_descriptor_left():
        raise OSError(24, "Too many open files")

    load.stat, clock[0] = no_descriptor_left, 3 * P  # /proc/stat unreadable: the last figure, no error
    assert load.update() == 0.0


def test_an_idle_engine_keeps_the_load_recent(monkeypatch):
    """A figure is the load since the one before: measured only at forward passes, the
    first pass after a pause would take the pause's average, and a burst of another
    process that ended before the request would still put it on one thread. The server's
    engine thread calls the backend's idle() while it waits, and the CPU backend measures."""
    from rawpage.server import async_engine

    P = LOAD_PERIOD_S
    clock, stat, own = [0.0], [(0.0, 0.0)], [0.0]

    def threads_after_a_burst(ticks: bool) -> int:
        clock[0], stat[0] = 0.0, (0.0, 0.0)
        load = CoreLoad({0, 1}, stat=lambda: stat[0], own_cpu=lambda: own[0], clock=lambda: clock[0])
        threads = CpuThreads(usable=2, load=load)
        try:
            # 8 periods: another process keeps a core busy for the first 6, then stops
            for i in range(1, 9):
                clock[0] = i * P
                stat[0] = (stat[0][0] + (100.0 if i <= 6 else 0.0), i * 200.0)
                if ticks:
                    threads.observe()  # the idle engine thread
            return threads.set_for(64)  # the request's prefill
        finally:
            threads.controller.limit(limits=usable_cores())

    assert threads_after_a_burst(ticks=True) == 2  # the last period was quiet
    assert threads_after_a_burst(ticks=False) == 1  # the pause's average: 0.75 of a core busy

    ticks = []
    engine = async_engine.AsyncEngine.__new__(async_engine.AsyncEngine)
    engine._inbox = async_engine.queue.SimpleQueue()
    engine._engine = SimpleNamespace(backend=SimpleNamespace(idle=lambda: ticks.append(1)))
    monkeypatch.setattr(async_engine, "IDLE_TICK_S", 0.01)
    engine._drain_inbox(block=True)  # nothing came: one look around, then back to the loop
    assert ticks == [1]
    engine._drain_inbox(block=False)  # between a running engine's steps: no look around
    assert ticks == [1]


def test_cpu_threads_drop_to_one_beside_a_busy_core():
    others = [0.0]

    class FixedLoad:
        def update(self):
            return others[0]

    threads = CpuThreads(usable=2, load=FixedLoad())
    try:
        assert threads.set_for(1) == 2
        others[0] = 1.0
        assert threads.set_for(1) == 1
        assert threads.set_for(4096) == 1
    finally:
        threads.controller.limit(limits=usable_cores())


def test_a_long_pass_takes_the_cores_back_when_the_other_process_stops():
    """A prefill of seconds that started beside a busy core runs on one thread only while
    that core stays busy: its kernels ask again (at most every LOAD_PERIOD_S, CoreLoad's
    own limit), and the pass goes on with two. A fixed --cpu-threads never moves."""
    stat, own, clock = [(0.0, 0.0)], [0.0], [0.0]
    load = CoreLoad({0, 1}, stat=lambda: stat[0], own_cpu=lambda: own[0], clock=lambda: clock[0])
    threads = CpuThreads(usable=2, load=load)
    fixed = CpuThreads(cpu_threads=2, usable=2)
    try:

        def tick(busy_cores: float, ours: float) -> None:
            """0.25 s: /proc/stat's two cores gain 50 jiffies at 100 Hz, busy_cores' worth
            of them busy, ours of those this process's."""
            clock[0] += 0.25
            stat[0] = (stat[0][0] + 25 * busy_cores, stat[0][1] + 50)
            own[0] += 0.25 * ours

        tick(1.0, 0.0)  # a client starting up keeps one core busy while our engine waits
        assert threads.set_for(2048) == 1  # the prefill starts on one thread
        assert threads.during_pass() == 1  # within the period: no new reading
        tick(1.0, 1.0)  # the client is done: the one busy core is ours
        assert threads.during_pass() == 2
        assert fixed.set_for(2048) == 2 and fixed.during_pass() == 2
    finally:
        threads.controller.limit(limits=usable_cores())


def test_usable_cores_follow_the_affinity_mask(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert usable_cores() == 3


def test_the_policy_reaches_blas():
    if not any(i["user_api"] == "blas" for i in threadpool_info()):
        pytest.skip("NumPy's BLAS is not visible to threadpoolctl here")
    threads = CpuThreads(1, usable=2)
    try:
        assert threads.set_for(1) == 1
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {1}
        threads.cpu_threads = 2
        assert threads.set_for(1) == 2
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}
        assert "2 usable cores" in threads.describe()
    finally:
        threads.controller.limit(limits=usable_cores())


@pytest.mark.parametrize(("value", "short"), [("20", True), ("4", True), ("28", False), (None, False), ("x", False)])
def test_blas_spin_is_short_up_to_two_to_the_twentieth_cycles(value, short):
    from rawpage._blas_env import is_short

    assert is_short(value) is short


@pytest.mark.parametrize(
    ("code", "preset", "want"),
    [
        ("import rawpage", None, "20 True"),  # rawpage first: it sets the spin before OpenBLAS loads
        ("import rawpage", "24", "24 False"),  # a user's value is kept
        ("import numpy, rawpage", None, "None False"),  # too late: OpenBLAS already read its environment
    ],
)
def test_rawpage_sets_openblas_spin_before_numpy_loads(code, preset, want):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    script = f"{code}, os; from rawpage._blas_env import spin_is_short; "
    script += "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), spin_is_short())"
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == want, out.stderr


def test_malloc_keeps_freed_memory_unless_the_environment_says_otherwise(monkeypatch):
    from rawpage.backends import cpu_malloc

    class FakeLibc:
        def __init__(self, answer=1):
            self.calls, self.answer = [], answer

        def mallopt(self, param, value):
            self.calls.append((param, value))
            return self.answer

    libc = FakeLibc()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")  # the user's setting wins
    assert cpu_malloc.keep_freed_memory(libc) is True
    # one arena, mmap and trim thresholds; no top pad
    assert sorted(libc.calls) == [(-8, 1), (-3, 256 << 20), (-1, 1 << 30)]
    assert cpu_malloc.keep_freed_memory(FakeLibc(answer=0)) is False  # a C library that refuses
    assert cpu_malloc.keep_freed_memory(object()) is False  # one without mallopt (macOS)


HEAP_SCRIPT = """
import re, numpy as np
from rawpage.backends.cpu_malloc import keep_freed_memory, release_freed_memory
def anon_mib():
    return int(re.search(r"RssAnon:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
assert keep_freed_memory()
base = anon_mib()
# a 2048-token prefill step's temporaries at Llama-3.2-1B's shapes: gate|up, silu's output, more
layer = [np.ones((2048, 16384), np.float32), np.ones((2048, 8192), np.float32), np.ones((2048, 12288), np.float32)]
del layer  # the layer ends: ~300 MB at the heap's top, all free
kept = anon_mib() - base
release_freed_memory()  # CPUBackend.idle, once the server has nothing to run
print(round(kept), round(anon_mib() - base))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and /proc")
def test_a_prefill_steps_temporaries_stay_in_the_heap_until_the_server_is_idle():
    """A 2048-token step frees ~300 MB at each layer's end: under the trim threshold the
    next layer reuses those pages (above it, glibc gave them back and every layer faulted
    them in again: 1.37 s of a 12.6 s prefill); malloc_trim gives them back when idle."""
    out = subprocess.run([sys.executable, "-c", HEAP_SCRIPT], capture_output=True, text=True, timeout=120)
    kept, after_trim = map(int, out.stdout.split())
    assert kept > 250, out.stderr  # kept: the next layer writes into pages it already has
    assert after_trim < 50


def test_idle_gives_a_prefills_temporaries_back_once(monkeypatch):
    from rawpage.backends import cpu

    released = []
    monkeypatch.setattr(cpu, "release_freed_memory", lambda: released.append(1))
    backend = cpu.CPUBackend(None, cpu_threads=1)
    backend.idle()
    assert released == []  # nothing ran: nothing to give back
    backend.embedding(np.array([0, 1]), np.zeros((4, 8), np.float32))  # the first op of an eager pass
    backend.idle()
    backend.idle()  # the next idle ticks find nothing new
    assert released == [1]


def test_llm_generate_gives_the_temporaries_back_when_it_is_done(monkeypatch, tiny_model_dir):
    from rawpage import LLM, SamplingParams
    from rawpage.backends import cpu

    released = []
    llm = LLM(tiny_model_dir, max_model_len=128, cpu_kernels="numpy")
    monkeypatch.setattr(cpu, "release_freed_memory", lambda: released.append(1))
    llm.generate(["a b c"], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert released == [1]


def test_the_server_sets_malloc_before_its_engine_thread_allocates(monkeypatch):
    """The engine thread's first malloc picks its arena; under glibc's default a thread of its
    own gets 64 MB heaps, and a vision encoder's 64-70 MB blocks were mapped afresh each time
    (42 s of kernel time an image). AsyncEngine.start applies the settings before it starts."""
    from types import SimpleNamespace

    from rawpage.server import async_engine

    order = []
    monkeypatch.setattr(async_engine, "keep_freed_memory", lambda: order.append("malloc settings"))
    engine = async_engine.AsyncEngine.__new__(async_engine.AsyncEngine)
    engine._thread = SimpleNamespace(start=lambda: order.append("engine thread"))
    engine.start()
    assert order == ["malloc settings", "engine thread"]


ARENAS_SCRIPT = """
import ctypes, os, sys, tempfile, threading
import rawpage.cli, rawpage.server.app
from rawpage.backends.cpu_malloc import keep_freed_memory

def allocate():
    blocks = [bytearray(4096) for _ in range(64)]  # above pymalloc's 512 bytes: malloc's

def serve(args):  # as rawpage serve starts: helper threads first, the engine thread last
    for _ in range(2):
        t = threading.Thread(target=allocate); t.start(); t.join()
    keep_freed_memory()  # AsyncEngine.start
    t = threading.Thread(target=allocate); t.start(); t.join()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    path = tempfile.mktemp()
    f = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(f)); libc.fclose(ctypes.c_void_p(f))
    print(open(path).read().count("<heap nr="))
    os.remove(path)
    return 0

rawpage.server.app.run_server = serve
sys.exit(rawpage.cli.main(["serve", "unused-model"]))
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "malloc_info"), reason="glibc's malloc_info")
def test_rawpage_serve_keeps_one_malloc_arena_though_threads_start_before_its_engine():
    """glibc fixes its arena limit at the first malloc of a thread without an arena, and a
    later mallopt(M_ARENA_MAX) changes nothing. `rawpage serve` starts helper threads before
    its engine: with the limit set only at the engine's start, the threads that repack a GGUF
    each kept an arena of 16 MB (1B Q4_K_M served in 759 MiB, 726 with one arena)."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", ARENAS_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "1", out.stdout
