"""native/huge_pages.py: repacked weights placed one after another in maps advised huge,
each map unmapped with the last weight in it."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from rawpage.native import huge_pages

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


def vma_of(address: int) -> dict[str, str] | None:
    """The /proc/self/smaps entry of the mapping holding `address` (its header line as
    'range', then its fields), or None when nothing is mapped there."""
    entry = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                entry = {"range": head} if lo <= address < hi else None
            elif entry is not None:
                key, _, value = line.partition(":")
                entry[key] = value.strip()
                if key == "VmFlags":
                    return entry
    return None


@linux_only
def test_weights_follow_each_other_in_one_map_advised_huge():
    a = huge_pages.panels((100, 576))
    b = huge_pages.panels((7, 33))
    c = huge_pages.panels((3, 1000))
    assert a.shape == (100, 576) and a.dtype == np.uint8 and a.flags.writeable and a.flags.c_contiguous
    ends = [(x.ctypes.data, x.ctypes.data + x.nbytes) for x in (a, b, c)]
    for (_, end), (next_start, _) in zip(ends, ends[1:]):
        assert next_start >= end and next_start - end < huge_pages.ALIGN  # packed, never overlapping
    assert all(start % huge_pages.ALIGN == 0 for start, _ in ends)
    vma = vma_of(a.ctypes.data)
    assert vma is not None and vma == vma_of(c.ctypes.data)  # the same map
    assert "hg" in vma["VmFlags"].split()  # madvise(MADV_HUGEPAGE)
    a[:] = 1
    b[:] = 2
    c[:] = 3
    assert a.sum() == a.size and (b == 2).all() and (c == 3).all()  # no weight writes over another


@linux_only
def test_a_weight_larger_than_a_map_gets_one_from_a_huge_page_boundary(monkeypatch):
    monkeypatch.setattr(huge_pages, "MAP_BYTES", 4 << 20)
    monkeypatch.setattr(huge_pages, "_current", None)
    big = huge_pages.panels((5, 1 << 20))  # 5 MiB: more than a map
    assert big.ctypes.data % huge_pages.HUGE_PAGE == 0
    big[-1, -1] = 7
    others = [huge_pages.panels((1, 3 << 20)) for _ in range(3)]  # past that map's room: new maps
    for x in others:
        x[:] = 1
    assert big[-1, -1] == 7 and big.sum() == 7
    spans = sorted((x.ctypes.data, x.ctypes.data + x.nbytes) for x in [big, *others])
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


@linux_only
def test_a_map_is_unmapped_with_the_last_weight_in_it(monkeypatch):
    monkeypatch.setattr(huge_pages, "_current", None)
    a = huge_pages.panels((1024, 1024))
    b = huge_pages.panels((16, 64))
    address = a.ctypes.data
    del a
    gc.collect()
    assert vma_of(address) is not None  # b still lives in it
    del b
    gc.collect()
    assert vma_of(address) is None


def test_without_huge_pages_the_weights_are_plain_arrays(monkeypatch):
    monkeypatch.setattr(huge_pages, "_new_map", lambda nbytes: None)
    monkeypatch.setattr(huge_pages, "_current", None)
    a = huge_pages.panels((3, 5))
    assert a.shape == (3, 5) and a.dtype == np.uint8 and a.flags.owndata
