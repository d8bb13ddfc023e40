"""The CPU kernels' build: paths, the cache key, the pool, and the NumPy fallback."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from rawpage.compile_cache import CompileError
from rawpage.native import build, isa, library


def test_paths_are_ordered_and_scalar_always_runs():
    paths = isa.runnable_paths()
    assert paths[-1] == "scalar"
    assert paths == [p for p in isa.PATHS if p in paths]
    assert isa.runnable_paths(frozenset()) == ["scalar"]
    # AVX-VNNI on its own (no AVX-512) still runs the 256-bit VNNI path
    assert isa.runnable_paths(frozenset({"avx2", "fma", "f16c", "avx_vnni"})) == ["avxvnni", "avx2", "scalar"]


def test_forcing_a_lower_path(monkeypatch):
    monkeypatch.setenv("RAWPAGE_CPU_ISA", "scalar")
    assert isa.selected_path() == "scalar"
    monkeypatch.setenv("RAWPAGE_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="choose one of"):
        isa.selected_path()


def test_a_path_above_the_cpu_is_refused(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"avx2", "fma", "f16c"}))
    monkeypatch.setenv("RAWPAGE_CPU_ISA", "avx512vnni")
    with pytest.raises(ValueError, match="runs only avx2, scalar"):
        isa.selected_path()


def test_the_cache_key_holds_the_cpu_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("RAWPAGE_CPU_CACHE", str(tmp_path))
    # The key is under test, not the compiler (two full builds took 10-25 s): write an empty -o file.
    monkeypatch.setattr(build, "run_compiler", lambda cmd, what: Path(cmd[cmd.index("-o") + 1]).write_bytes(b""))
    first = build.build_library("scalar")
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset({"another", "cpu"}))
    second = build.build_library("scalar")
    assert first != second and first.exists() and second.exists()


@pytest.mark.parametrize("nth", [1, 2, 3, 7, 2, 1])
def test_pool_runs_every_part_once(lib, nth):
    assert lib.fn.rp_pool_selftest(nth) == nth * (nth + 1) // 2


def busy_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) each thread of this process has used, by thread id."""
    ticks = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        ticks[task.name] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_workers_a_call_leaves_out_sleep(lib):
    """After a 7-part call has started 6 workers, a stream of 2-part calls keeps 2 threads
    busy (the caller and worker 1), not 7: the workers the calls leave out go to sleep
    instead of spinning through every call. CPU time, not wall time: a spinning thread
    gathers ticks whenever it runs, on a busy machine too."""
    lib.fn.rp_pool_selftest(7)
    before, start = busy_ticks(), time.monotonic()
    while time.monotonic() - start < 1.0:
        for _ in range(200):
            lib.fn.rp_pool_selftest(2)
    after = busy_ticks()
    busy = [t for t in after if after[t] - before.get(t, 0) >= 10]  # 0.1 s or more of the 1 s
    assert len(busy) <= 3, f"{len(busy)} threads busy: {busy}"  # 2, and one to spare for pytest's own


@pytest.mark.parametrize("nth", [1, 2, 3])
@pytest.mark.parametrize("words", [1, 7, 4096, 100_003])
def test_the_read_probe_reads_every_word(lib, nth, words):
    """read_probe.c, the benchmarks' read reference: its result is the OR of every word,
    so one set bit anywhere (here in the last word, past the vector loop) must show."""

    import numpy as np

    buf = np.zeros(words, np.uint64)
    assert lib.fn.rp_read_probe(buf.ctypes.data, buf.nbytes, nth) == 0
    buf[words // 2] = 3
    buf[-1] |= np.uint64(1 << 40)
    assert lib.fn.rp_read_probe(buf.ctypes.data, buf.nbytes, nth) == (1 << 40) | 3


def test_without_a_compiler_the_numpy_path_runs_and_says_so(no_compiler, caplog):
    with caplog.at_level(logging.WARNING, logger="rawpage"):
        assert library.native_kernels() is None
    assert "running the NumPy path" in caplog.text
    with pytest.raises(CompileError):
        build.build_library("scalar")


def test_every_exported_function_is_declared_once_in_the_table():
    """entry_points.py is the one declaration: each RP_EXPORT definition in the C sources
    has its entry, and each entry its definition (a missing symbol fails at load)."""
    import re

    from rawpage.native.entry_points import ENTRY_POINTS

    defined = set()
    for src in build.sources():
        defined |= set(re.findall(r"^RP_EXPORT [\w ]+?\**\s*(rp_\w+)\(", src.read_text(), re.M))
    assert defined == set(ENTRY_POINTS)


def test_a_definition_that_differs_from_its_entry_does_not_compile(tmp_path):
    """The prototypes come from the table, so a kernel whose definition drifts from its
    entry (here rp_rms_norm with eps as a double) is a compile error, not a bad call."""
    from rawpage.compile_cache import run_compiler
    from rawpage.native.entry_points import header

    (tmp_path / "rp_entry_points.h").write_text(header())
    good = "void rp_rms_norm(float *out, const float *x, int64_t x_stride, const float *weight, int64_t T, int64_t n, float eps, int nthreads) {}\n"
    bad = good.replace("float eps", "double eps")
    for name, body, ok in (("good.c", good, True), ("bad.c", bad, False)):
        (tmp_path / name).write_text('#include "common.h"\n' + body)
        cmd = [build.compiler(), *build.cflags("scalar"), f"-I{tmp_path}", f"-I{build.NATIVE_DIR}", "-c"]
        cmd += [str(tmp_path / name), "-o", str(tmp_path / (name + ".o"))]
        if ok:
            run_compiler(cmd, "the matching definition")
        else:
            with pytest.raises(CompileError, match="conflicting types"):
                run_compiler(cmd, "the drifted definition")


def test_calls_take_the_arguments_by_their_c_names(lib):
    with pytest.raises(TypeError, match="takes nth"):
        lib.call("rp_pool_selftest", nth=1, extra=2)
    with pytest.raises(KeyError, match="nth"):
        lib.call("rp_pool_selftest", n=1)
    assert lib.call("rp_pool_selftest", nth=3) == 6
