"""The CPU thread policy: counts chosen from the usable cores and the batch, and applied."""

import pytest
from threadpoolctl import threadpool_info

from rawpage.backends.cpu_threads import SMALL_BATCH_ROWS, CpuThreads, threads_for, usable_cores


@pytest.mark.parametrize(
    ("rows", "usable", "flag", "want"),
    [
        (1, 2, None, 1),  # one stream: one thread, so a busy core cannot stall it
        (SMALL_BATCH_ROWS - 1, 16, None, 1),
        (SMALL_BATCH_ROWS, 2, None, 2),  # a real GEMM: every core we may use
        (SMALL_BATCH_ROWS * 4, 16, None, 16),
        (512, 1, None, 1),  # a one-core affinity mask: never more
        (1, 16, 4, 4),  # --cpu-threads fixes the count whatever the batch
        (64, 2, 8, 2),  # ... but never beyond the usable cores
        (64, 4, 0, 1),
    ],
)
def test_threads_for_a_batch_and_an_affinity(rows, usable, flag, want):
    assert threads_for(rows, usable, flag) == want


def test_usable_cores_follow_the_affinity_mask(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert usable_cores() == 3


def test_the_policy_reaches_blas():
    if not any(i["user_api"] == "blas" for i in threadpool_info()):
        pytest.skip("NumPy's BLAS is not visible to threadpoolctl here")
    threads = CpuThreads(usable=2)
    try:
        assert threads.set_for(1) == 1
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {1}
        assert threads.set_for(SMALL_BATCH_ROWS) == 2
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}
        assert "2 usable cores" in threads.describe()
    finally:
        threads.controller.limit(limits=usable_cores())
