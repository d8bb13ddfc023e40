"""Loads the CPU kernels' shared library and declares its entry points for ctypes.

`native_kernels()` returns the loaded library for this process's path (isa.py), or
None where it cannot be built (no compiler, a compiler error), after one log line
that says why; the CPU backend then runs the NumPy path. Tests ask for a given path
with `load_path(path)`.

Entry points are declared by the module that wraps them (rawpage/native/*.py): each
calls `lib.declare(name, restype, *argtypes)` once and then calls `lib.fn.<name>`.
Arrays are passed by address (`ptr(a)`, or the cheaper `addr(a)`, which takes views
too); ctypes releases the GIL for the call.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref
from typing import Any

import numpy as np

from rawpage.compile_cache import CompileError
from rawpage.native import isa
from rawpage.native.build import build_library
from rawpage.ops.launch import token_stride

logger = logging.getLogger("rawpage")

c_int, c_int64, c_float, c_void_p = ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class NativeLibrary:
    """One loaded build: `path` is its instruction-set path, `fn` the ctypes library."""

    def __init__(self, path: str, so_path: str) -> None:
        self.path = path
        self.so_path = so_path
        self.fn = ctypes.CDLL(so_path)
        self.declare("rp_pool_selftest", c_int64, c_int)

    def declare(self, name: str, restype: Any, *argtypes: Any) -> None:
        f = getattr(self.fn, name)
        f.restype, f.argtypes = restype, list(argtypes)


def ptr(a: np.ndarray | None) -> int | None:
    """The address of a C-contiguous array's first element (None for None)."""
    if a is None:
        return None
    assert a.flags.c_contiguous, "native kernels read C-contiguous arrays"
    return addr(a)


# A decode step makes ~10 kernel calls a layer, so each call's Python side counts:
# `a.ctypes.data` builds a helper object (1-2 us); ctypes' own view of the buffer
# gives the same address in a quarter of that, for the C-contiguous, writable arrays
# that almost every call passes.
_from_buffer, _addressof = ctypes.c_char.from_buffer, ctypes.addressof
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)


def addr(a: np.ndarray) -> int:
    """The address of an array's first element (a view's too: its own start)."""
    if a.flags.c_contiguous:
        try:
            return _addressof(_from_buffer(a))
        except (TypeError, ValueError):  # read-only, or empty
            pass
    return a.ctypes.data


# A weight's address is looked up once while it lives (a read-only memory-mapped one
# would take the slow path above on every call).
_weight_addresses: dict[int, tuple[weakref.ref, int]] = {}


def weight_address(w: np.ndarray) -> int:
    """A weight's address, looked up once while the array lives."""
    key = id(w)
    hit = _weight_addresses.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    _weight_addresses[key] = (weakref.ref(w, lambda _, k=key: _weight_addresses.pop(k, None)), w.ctypes.data)
    return _weight_addresses[key][1]


def float_rows(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(x, elements from one row to the next) for a float32 (T, ...) array whose rows are
    contiguous, however widely spaced (q, k, v inside the fused qkv output); else (a
    C-contiguous float32 copy, its row length): a Fortran-order matmul output, say."""
    if x.dtype == _F32:
        if x.flags.c_contiguous:
            return x, x.size // len(x) if len(x) else 0
        stride = token_stride(x)
        if stride is not None:
            return x, stride
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x, x.size // len(x) if len(x) else 0


def int32_rows(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous int32 array (itself when it already is one)."""
    return a if a.dtype == _I32 and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=np.int32)


@functools.cache
def load_path(path: str) -> NativeLibrary:
    """The library for one instruction-set path; raises CompileError if it does not build."""
    return NativeLibrary(path, str(build_library(path)))


@functools.cache
def native_kernels() -> NativeLibrary | None:
    """This process's kernels (the path isa.selected_path() names), or None after one
    log line saying why not."""
    path = isa.selected_path()
    try:
        lib = load_path(path)
    except (CompileError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        logger.warning("CPU kernels: could not build the native kernels (%s); running the NumPy path", first)
        return None
    logger.info("CPU kernels: native, %s path (%s)", path, lib.so_path)
    return lib
