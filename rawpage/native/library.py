"""Loads the CPU kernels' shared library and declares its entry points for ctypes.

`native_kernels()` returns the loaded library for this process's path (isa.py), or
None where it cannot be built (no compiler, a compiler error), after one log line
that says why; the CPU backend then runs the NumPy path. Tests ask for a given path
with `load_path(path)`.

Every entry point is declared once, in rawpage/native/entry_points.py; a loaded
library has them all, and the module that wraps one calls `lib.call(name, arg=value,
...)` with the arguments by their C names. Arrays are passed by address (`ptr(a)`, or
the cheaper `addr(a)`, which takes views too); ctypes releases the GIL for the call.

Inside `with recording(lib)` every call also goes into a Recording, which replays the
whole list later in one C call (graph.c says how; backends/cpu.py captures a decode
step that way). While it records, the wrappers allocate their outputs with `empty()`,
and any copy or NumPy work that a replay would not repeat raises NotCapturable.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from rawpage.compile_cache import CompileError
from rawpage.native import isa
from rawpage.native.build import build_library
from rawpage.native.entry_points import ENTRY_POINTS, ctypes_of
from rawpage.ops.launch import token_stride

logger = logging.getLogger("rawpage")


class NativeLibrary:
    """One loaded build: `path` is its instruction-set path, `fn` the ctypes library."""

    def __init__(self, path: str, so_path: str) -> None:
        self.path = path
        self.so_path = so_path
        self.fn = ctypes.CDLL(so_path)
        for e in ENTRY_POINTS.values():  # a missing symbol fails here, at load
            f = getattr(self.fn, e.name)
            f.restype, f.argtypes = ctypes_of(e.restype), [ctypes_of(p.ctype) for p in e.params]

    def call(self, name: str, /, **arguments: Any) -> Any:
        """Run entry point `name` on its arguments, given by their C names (entry_points.py);
        while a graph is captured (recording()), also append the call to the recording."""
        names = ENTRY_POINTS[name].names
        if len(arguments) != len(names):
            raise TypeError(f"{name} takes {', '.join(names)}; got {', '.join(arguments)}")
        args = [arguments[n] for n in names]  # a wrong name: KeyError naming it
        if _recording is not None:
            _recording.append(name, args)
        return getattr(self.fn, name)(*args)


class NotCapturable(RuntimeError):
    """A forward pass asked for work a recording cannot replay (a NumPy op, a copy)."""


class Recording:
    """The kernel calls of one captured forward pass, for graph.c's rp_graph_replay
    (its header says what a record holds and what a replay reads)."""

    def __init__(self, lib: NativeLibrary) -> None:
        self.lib = lib
        self.width = 1 + lib.fn.rp_graph_max_args()  # int64 words a record: op, then its arguments
        self.rows: list[list[int]] = []
        self.arrays: list[np.ndarray] = []  # every array an address was taken of, held
        self.temporaries = 0  # bytes of the outputs allocated while recording (empty())
        self.calls: np.ndarray | None = None  # (n, width) int64, once finished

    def append(self, name: str, args: list) -> None:
        op = self.lib.fn.rp_graph_op(name.encode())
        if op < 0 or len(args) >= self.width:
            raise NotCapturable(f"{name} cannot be replayed from a recording")
        row = [op]
        for a in args:
            if isinstance(a, float | np.floating):
                row.append(int(np.float64(a).view(np.int64)))  # the double's bits
            else:
                row.append(0 if a is None else int(a))
        self.rows.append(row + [0] * (self.width - len(row)))

    def op_names(self) -> list[str]:
        """Each recorded call's entry point, in order."""
        return [self.lib.fn.rp_graph_op_name(int(op)).decode() for op in self.calls[:, 0]]

    def finish(self) -> None:
        self.calls = np.array(self.rows, dtype=np.int64).reshape(-1, self.width)

    def replay(self, nthreads: int, seconds: np.ndarray | None = None) -> None:
        """Runs the calls; with `seconds` (float64, one a call) adds each call's wall time."""
        if seconds is not None:
            assert seconds.dtype == np.float64 and seconds.shape == (len(self.calls),)
        out = None if seconds is None else seconds.ctypes.data
        rc = self.lib.fn.rp_graph_replay(self.calls.ctypes.data, len(self.calls), nthreads, out)
        if rc != 0:
            raise RuntimeError(f"rp_graph_replay refused the recording (code {rc})")


class Arena:
    """Memory that recordings share for their temporaries (every kernel output of the
    pass): one replay runs at a time, and a replay writes each temporary before it reads
    it (graph.c), so the recordings of different batch sizes may all use the same
    bytes, and hold as much as the largest one needs, not their sum. Chunks never move
    (recorded addresses stay valid); a recording that needs more than the ones before
    gets a new chunk (DecodeGraphs records the largest first).

    Within one recording, a temporary whose last Python reference is gone (its array and
    every view of it: each view's base is the array take() made) gives its bytes back, and
    the next temporary of the same size takes them, so a pass holds about one layer's
    temporaries, not every layer's (1B's four recordings: 18 -> 2 MiB). That is safe because a
    call reads an address only while Python holds the array (addr() does not hold arena
    memory, so a temporary dies with its last reference), and a replay makes the calls in
    the order they were recorded: every call that read the old temporary comes before the
    one that writes the new one into the same bytes."""

    CHUNK = 2 << 20

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.rewind()

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    def rewind(self) -> None:
        """Start a recording: every byte is free again. A temporary of the last recording
        that dies later (a graph's output) gives its bytes to that recording's free lists
        (give_back holds them), which this one no longer reads."""
        self.chunk, self.offset = 0, 0
        self.free: dict[int, list[tuple[int, int]]] = {}  # nbytes -> (chunk, offset) given back
        self.alive: dict[int, weakref.ref] = {}  # id -> a weak reference to each temporary taken

    def holds(self, address: int) -> bool:
        return any(c.ctypes.data <= address < c.ctypes.data + c.nbytes for c in self.chunks)

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        """A float32 array of `shape`, 64-byte aligned, in bytes no live temporary of this
        recording holds."""
        n = int(np.prod(shape))
        nbytes = -(-n * 4 // 64) * 64
        if self.free.get(nbytes):
            chunk, offset = self.free[nbytes].pop()
        else:
            while self.chunk < len(self.chunks) and self.offset + nbytes > self.chunks[self.chunk].nbytes:
                self.chunk, self.offset = self.chunk + 1, 0
            if self.chunk == len(self.chunks):
                raw = np.empty(max(nbytes, self.CHUNK) + 64, np.uint8)
                self.chunks.append(raw[-raw.ctypes.data % 64 :][: max(nbytes, self.CHUNK)])
            chunk, offset = self.chunk, self.offset
            self.offset += nbytes
        # frombuffer: the array's base is a memoryview, so every view of it has this array
        # as its base (NumPy stops collapsing bases at another type), and it lives as long
        # as any of them.
        flat = np.frombuffer(self.chunks[chunk][offset : offset + nbytes].data, np.float32, n)

        def give_back(ref: weakref.ref, free: dict = self.free, alive: dict = self.alive) -> None:
            alive.pop(id(ref), None)
            free.setdefault(nbytes, []).append((chunk, offset))

        ref = weakref.ref(flat, give_back)
        self.alive[id(ref)] = ref
        return flat.reshape(shape)


_recording: Recording | None = None  # the one being captured (one forward pass runs at a time)
_arena: Arena | None = None  # where its temporaries go, if it shares an arena


@contextlib.contextmanager
def recording(lib: NativeLibrary, arena: Arena | None = None) -> Iterator[Recording]:
    """Record the kernel calls made inside the block (they also run, as always); their
    outputs come from `arena` when one is given (Arena says when that is safe)."""
    global _recording, _arena
    if _recording is not None:
        raise RuntimeError("a recording is already being captured")
    _recording, _arena = rec, _ = Recording(lib), arena
    if arena is not None:
        arena.rewind()
    try:
        yield rec
    finally:
        _recording, _arena = None, None
    rec.finish()


def capturing() -> bool:
    """Whether a recording is being captured: work outside the kernels must not run then
    (raise NotCapturable), since a replay would not repeat it."""
    return _recording is not None


def keep(obj: Any) -> None:
    """Hold obj (a scratch buffer whose address a kernel call takes) while the recording lives."""
    if _recording is not None:
        _recording.arrays.append(obj)


def empty(shape: tuple[int, ...]) -> np.ndarray:
    """A kernel's float32 output; while a recording is captured, taken from its arena or
    counted as its memory."""
    if _arena is not None:
        return _arena.take(shape)
    out = np.empty(shape, np.float32)
    if _recording is not None:
        _recording.temporaries += out.nbytes
    return out


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
    """The address of an array's first element (a view's too: its own start). While a
    graph is captured the recording holds the array, so the address stays valid."""
    if _recording is not None and not (_arena is not None and _arena.holds(a.ctypes.data)):
        _recording.arrays.append(a)  # (arena memory never moves, and its temporaries may die)
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
    x = contiguous_rows(x)
    return x, x.size // len(x) if len(x) else 0


def _c_order(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """a itself where it is C-contiguous of dtype; else a copy, refused while recording."""
    if a.dtype == dtype and a.flags.c_contiguous:
        return a
    if capturing():
        raise NotCapturable(f"a {a.dtype} array of strides {a.strides} would be copied to {dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


def contiguous_rows(x: np.ndarray) -> np.ndarray:
    """x as a C-contiguous float32 array (itself when it already is one: a kernel's output)."""
    return _c_order(x, _F32)


def int32_rows(a: np.ndarray) -> np.ndarray:
    """a as a C-contiguous int32 array (itself when it already is one)."""
    return _c_order(a, _I32)


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
        lines = str(e).strip().splitlines() or [type(e).__name__]
        first = " ".join(
            [lines[0]] + [ln.strip() for ln in lines if "error" in ln][:1]
        )  # and the compiler's first error
        logger.warning("CPU kernels: could not build the native kernels (%s); running the NumPy path", first)
        return None
    logger.info("CPU kernels: native, %s path (%s)", path, lib.so_path)
    return lib
