"""GGUF weights on the CPU kernels (gguf_matmul.c): repacked once at load into panels
of 16 rows, then multiplied and looked up in that layout.

    repack(lib, data, qtype, (N, K), nthreads)                    (P, panel_bytes) uint8 panels
    gguf_matmul(lib, x, panels, qtype, (N, K), nthreads, bias, parts)   y (T, N) = x (T, K) W^T (+ bias)
    gguf_rows(lib, panels, qtype, (N, K), ids, nthreads)          W[ids] (T, K), dequantized

`data` is (N, row_bytes) uint8, each row whole blocks exactly as in the .gguf file.
The panel layout is drawn in gguf_matmul.c's header; `repack` writes it from each
block's canonical form (rawpage/quantization/gguf.py FORMATS: the decode in NumPy,
the layout in C, rp_gguf_pack; repack_ref is its NumPy reference). The activation is
rounded to int8 per 32 values (quantize_ref; `parts=2` rounds the remainder again:
the LM head), so gguf_matmul's reference is the exact product with x replaced by its
rounding (matmul_ref); gguf_rows' is the format's dequantization.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rawpage.native import huge_pages
from rawpage.native.library import (
    NativeLibrary,
    addr,
    contiguous_rows,
    empty,
    int32_rows,
    keep,
    ptr,
    weight_address,
)
from rawpage.quantization.gguf import FORMATS, BlockFormat, Blocks, decode

PANEL = 16  # rows a panel (the 16 int32 lanes of a zmm)

NATIVE_GGUF = frozenset(FORMATS)  # the formats the kernels read: every row of the table

# Bytes of one 32-value chunk's planes, by the integers' width (gguf_matmul.c's header).
_CHUNK_BYTES = {8: 512, 6: 256 + 128, 5: 256 + 64, 4: 256, 3: 128 + 64, 2: 128}


def panel_block_bytes(f: BlockFormat) -> int:
    """One block of a panel: header (d, dm, sc, m) and the chunks' planes."""
    header = 2 * PANEL + (2 * PANEL if f.mins else 0)
    if f.scale_bits in (4, 6):
        header += f.groups * PANEL + (4 * PANEL if f.scale_bits == 6 else 0)
    else:
        header += (f.groups * PANEL if f.sub_scales else 0) + (f.groups * PANEL if f.mins == 2 else 0)
    return header + f.block // 32 * _CHUNK_BYTES[f.bits]


def panel_bytes(qtype: str, K: int) -> int:
    f = FORMATS[qtype]
    return K // f.block * panel_block_bytes(f)


def _check(qtype: str, shape: tuple[int, int]) -> tuple[int, int]:
    if qtype not in NATIVE_GGUF:
        raise ValueError(f"GGUF type {qtype} has no native CPU kernel (supported: {', '.join(sorted(NATIVE_GGUF))})")
    N, K = shape
    block = FORMATS[qtype].block
    if K <= 0 or K % block:
        raise ValueError(f"{qtype} weight {shape}: K = {K} must be a positive multiple of the {block}-value block")
    return N, K


# --- the repack ----------------------------------------------------------------------


def _planes(q: np.ndarray, bits: int) -> np.ndarray:
    """q (P, nb, C, 8 quads, 16 rows, 4) uint8 -> (P, nb, C, chunk bytes): the planes."""
    if bits == 8:
        return q.reshape(*q.shape[:3], 512)
    parts = []
    if bits >= 4:  # nibbles: vector v holds quad v (low) and quad v + 4 (high)
        lo = q & 15
        parts.append(lo[:, :, :, :4] | (lo[:, :, :, 4:] << 4))
    if bits in (2, 3, 6):  # two bits of each quad, 4 quads a vector
        t = ((q >> (4 if bits == 6 else 0)) & 3).reshape(*q.shape[:3], 2, 4, PANEL, 4)
        parts.append(sum(t[:, :, :, :, i] << (2 * i) for i in range(4)).astype(np.uint8))
    if bits in (3, 5):  # one bit of each quad, 8 quads a vector
        b = (q >> (2 if bits == 3 else 4)) & 1
        parts.append(sum(b[:, :, :, u] << u for u in range(8)).astype(np.uint8)[:, :, :, None])
    return np.concatenate([p.reshape(*q.shape[:3], -1) for p in parts], axis=3)


def _panel_major(a: np.ndarray, P: int, nb: int) -> np.ndarray:
    """(P 16, nb, ...) per row and block -> (P, nb, ..., 16): a panel's 16 rows last."""
    a = a.reshape(P, PANEL, nb, -1)
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _repack_panels(b: Blocks, f: BlockFormat, P: int, nb: int) -> np.ndarray:
    """Blocks of P 16 rows (padded) x nb blocks -> (P, nb panel_block_bytes) uint8."""
    fields = [_panel_major(b.d.astype(np.float16), P, nb).view(np.uint8).reshape(P, nb, -1)]
    if f.mins:
        fields.append(_panel_major(b.dm.astype(np.float16), P, nb).view(np.uint8).reshape(P, nb, -1))
    if f.scale_bits in (4, 6):  # the low nibbles of sc and m; for 6 bits, each row's word of top bits
        sc = b.sc.view(np.uint8).reshape(-1, f.groups)
        m = b.m.reshape(-1, f.groups)
        fields.append(_panel_major((sc & 15) | ((m & 15) << 4), P, nb).reshape(P, nb, -1))
        if f.scale_bits == 6:
            shifts = 4 * np.arange(f.groups, dtype=np.uint32)
            top = (((sc >> 4) | ((m >> 4) << 2)).astype(np.uint32) << shifts).sum(axis=1, dtype=np.uint32)
            fields.append(_panel_major(top, P, nb).view(np.uint8).reshape(P, nb, -1))
    else:
        if f.sub_scales:
            fields.append(_panel_major(b.sc, P, nb).view(np.uint8).reshape(P, nb, -1))
        if f.mins == 2:
            fields.append(_panel_major(b.m, P, nb).reshape(P, nb, -1))
    C = f.block // 32
    q = b.q.reshape(P, PANEL, nb, C, 8, 4).transpose(0, 2, 3, 4, 1, 5)  # (P, nb, C, quad, row, 4)
    fields.append(_planes(q, f.bits).reshape(P, nb, -1))
    return np.concatenate(fields, axis=2).reshape(P, -1)


def _pad_rows(b: Blocks, rows: int, nb: int) -> Blocks:
    """The blocks of `rows` rows, zero rows appended (d = 0: they add nothing)."""
    have = len(b.d) // nb
    if have == rows:
        return b

    def pad(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = a.reshape(have, nb, *a.shape[1:])
        return np.concatenate([a, np.zeros((rows - have, *a.shape[1:]), a.dtype)]).reshape(rows * nb, *a.shape[2:])

    return Blocks(pad(b.d), pad(b.q), pad(b.dm), pad(b.sc), pad(b.m))


def _check_blocks(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> tuple[int, int, int]:
    N, K = _check(qtype, shape)
    f = FORMATS[qtype]
    if tuple(data.shape) != (N, K // f.block * f.block_bytes) or data.dtype != np.uint8:
        raise ValueError(
            f"{qtype} weight {shape}: want ({N}, {K // f.block * f.block_bytes}) uint8 blocks, got {data.shape}"
        )
    return N, K, -(-N // PANEL)


def repack_ref(data: np.ndarray, qtype: str, shape: tuple[int, int]) -> np.ndarray:
    """(N, row_bytes) uint8 GGUF blocks -> (ceil(N / 16), panel_bytes) uint8 panels, in
    NumPy (a few panels at a time, so that the temporaries stay in cache)."""
    N, K, P = _check_blocks(data, qtype, shape)
    f, nb = FORMATS[qtype], K // FORMATS[qtype].block
    out = np.empty((P, panel_bytes(qtype, K)), np.uint8)
    step = max(1, (1 << 19) // (PANEL * K))  # ~0.5M values a step
    for p0 in range(0, P, step):
        p1 = min(P, p0 + step)
        rows = data[p0 * PANEL : min(N, p1 * PANEL)]
        b = _pad_rows(decode(rows, qtype), (p1 - p0) * PANEL, nb)
        out[p0:p1] = _repack_panels(b, f, p1 - p0, nb)
    return out


def repack(lib: NativeLibrary, data: np.ndarray, qtype: str, shape: tuple[int, int], nthreads: int) -> np.ndarray:
    """repack_ref's panels, laid out by the kernel (rp_gguf_pack) from the NumPy decode of
    about 4M values at a time, the steps on `nthreads` Python threads (NumPy's array
    operations let go of the GIL): 8B Q4_K_M loads in 10 s, not the NumPy layout's 40."""
    N, K, P = _check_blocks(data, qtype, shape)
    out = huge_pages.panels((P, panel_bytes(qtype, K)))
    step = PANEL * max(1, (1 << 22) // (PANEL * K))

    def pack(r0: int) -> None:
        b = decode(data[r0 : r0 + step], qtype)
        rc = lib.call(
            "rp_gguf_pack",
            qtype=FORMATS[qtype].ggml_type,
            out=out[r0 // PANEL :].ctypes.data,
            d=b.d.ctypes.data,
            dm=(b.d if b.dm is None else b.dm).ctypes.data,  # (read only with mins)
            sc=None if b.sc is None else np.ascontiguousarray(b.sc).ctypes.data,
            m=None if b.m is None else np.ascontiguousarray(b.m).ctypes.data,
            q=np.ascontiguousarray(b.q).ctypes.data,
            N=min(step, N - r0),
            K=K,
            nthreads=1,
        )
        if rc != 0:
            raise ValueError(f"rp_gguf_pack refused {qtype} {shape} (code {rc})")

    with ThreadPoolExecutor(max(1, min(nthreads, -(-N // step)))) as pool:
        list(pool.map(pack, range(0, N, step)))
    return out


# --- the activation's rounding and the product's reference ----------------------------


def quantize_ref(x: np.ndarray, parts: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """x (T, K) float32 -> (xq (T parts, K) int8, dx (T parts, K / 32) float32): per
    32-value chunk dx = max|x| / 127 and xq = rint(x / dx), in float32; part 1 rounds
    the remainder x - dx xq of part 0 (rounded once to float32) the same way. Row
    t parts + p is token t's part p."""
    x = np.asarray(x, np.float32)
    T, K = x.shape
    rows, scales = [], []
    rest = x.reshape(T, K // 32, 32)
    for _ in range(parts):
        dx = np.abs(rest).max(axis=2) / np.float32(127)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(dx[..., None] > 0, np.rint(rest / dx[..., None]), 0).astype(np.int8)
        rows.append(q.reshape(T, K))
        scales.append(dx.astype(np.float32))
        # x - dx xq rounded once, as the kernel's fmaf (dx xq is exact in float64)
        rest = (rest - dx[..., None].astype(np.float64) * q).astype(np.float32)
    return np.stack(rows, axis=1).reshape(T * parts, K), np.stack(scales, axis=1).reshape(T * parts, K // 32)


def matmul_ref(x: np.ndarray, w: np.ndarray, parts: int = 1) -> np.ndarray:
    """x (T, K), w (N, K) dense -> (T, N) float64: the product with x as its rounding."""
    xq, dx = quantize_ref(x, parts)
    T, K = x.shape
    xr = (xq.reshape(T, parts, K // 32, 32) * dx.reshape(T, parts, K // 32, 1).astype(np.float64)).sum(axis=1)
    return xr.reshape(T, K) @ np.asarray(w, np.float64).T


# --- the kernels ------------------------------------------------------------------------


def scratch_bytes(qtype: str, T: int, K: int, parts: int) -> int:
    """The scratch rp_gguf_matmul takes: xq (R, K) int8, dx (R, K / 32), s and xo (R, K / G)."""
    R, G = T * parts, FORMATS[qtype].group
    return R * K + 4 * R * (K // 32) + 8 * R * (K // G)


# The scratch is one buffer per calling thread, grown as needed (library.py's addr says
# why addresses are worth caching).
_scratch_buffers = threading.local()


def _scratch_address(nbytes: int) -> int:
    buf = getattr(_scratch_buffers, "buf", None)
    if buf is None or len(buf) < nbytes:
        _scratch_buffers.buf = buf = np.empty(max(nbytes, 1 << 16), np.uint8)
        _scratch_buffers.address = buf.ctypes.data
    keep(buf)  # a recorded call's scratch must outlive a later, larger one
    return _scratch_buffers.address


def _check_panels(panels: np.ndarray, qtype: str, N: int, K: int) -> None:
    want = (-(-N // PANEL), panel_bytes(qtype, K))
    if tuple(panels.shape) != want or panels.dtype != np.uint8 or not panels.flags.c_contiguous:
        raise ValueError(
            f"{qtype} ({N}, {K}): want C-contiguous {want} uint8 panels, got {panels.shape} {panels.dtype}"
        )


def gguf_matmul(
    lib: NativeLibrary,
    x: np.ndarray,
    panels: np.ndarray,
    qtype: str,
    shape: tuple[int, int],
    nthreads: int,
    bias: np.ndarray | None = None,
    parts: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """x (T, K) float32 (any layout; made C-contiguous), panels (repack) -> y (T, N) float32,
    a new C-contiguous array, or written into `out`: (T, N) float32 whose rows are
    contiguous, however far apart (the columns of a fused layer's output this part makes)."""
    N, K = _check(qtype, shape)
    _check_panels(panels, qtype, N, K)
    x = contiguous_rows(x)
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x has shape {x.shape}, the {qtype} weight {shape} wants (T, {K})")
    T = x.shape[0]
    y = empty((T, N)) if out is None else out
    if y.shape != (T, N) or y.dtype != np.float32:
        raise ValueError(f"out {y.shape} {y.dtype} is not a (T, N) = ({T}, {N}) float32 array")
    if T == 0 or N == 0:
        return y
    if (N > 1 and y.strides[1] != 4) or y.strides[0] % 4:
        raise ValueError(f"out's rows must be contiguous float32 (strides {y.strides})")
    if bias is not None:
        bias = np.ascontiguousarray(bias, dtype=np.float32)  # a weight: the same array each step
        if bias.shape != (N,):
            raise ValueError(f"bias has shape {bias.shape}, want ({N},)")
    rc = lib.call(
        "rp_gguf_matmul",
        qtype=FORMATS[qtype].ggml_type,
        y=addr(y),
        ldy=y.strides[0] // 4 if T > 1 else N,
        x=addr(x),
        w=weight_address(panels),
        bias=ptr(bias),
        T=T,
        N=N,
        K=K,
        parts=parts,
        scratch=_scratch_address(scratch_bytes(qtype, T, K, parts)),
        nthreads=nthreads,
    )
    if rc != 0:
        raise ValueError(f"rp_gguf_matmul refused {qtype} {shape} (code {rc})")
    return y


def quantize(lib: NativeLibrary, x: np.ndarray, qtype: str, parts: int = 1) -> dict[str, np.ndarray]:
    """The kernel's own rounding of x (for the tests): xq, dx, s, xo as its scratch holds them."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    T, K = x.shape
    R, G = T * parts, FORMATS[qtype].group
    scratch = np.zeros(scratch_bytes(qtype, T, K, parts), np.uint8)
    if lib.fn.rp_gguf_quantize(FORMATS[qtype].ggml_type, x.ctypes.data, T, K, parts, scratch.ctypes.data):
        raise ValueError(f"rp_gguf_quantize refused {qtype} K = {K}")
    xq, rest = scratch[: R * K].view(np.int8).reshape(R, K), scratch[R * K :]
    dx, rest = rest[: 4 * R * (K // 32)].view(np.float32).reshape(R, K // 32), rest[4 * R * (K // 32) :]
    s, xo = rest[: 4 * R * (K // G)].view(np.float32).reshape(R, K // G), rest[4 * R * (K // G) :].view(np.int32)
    return {"xq": xq, "dx": dx, "s": s, "xo": xo.reshape(R, K // G)}


def gguf_rows(
    lib: NativeLibrary, panels: np.ndarray, qtype: str, shape: tuple[int, int], ids: np.ndarray, nthreads: int
) -> np.ndarray:
    """ids (T,) -> the dequantized rows (T, K) float32."""
    N, K = _check(qtype, shape)
    _check_panels(panels, qtype, N, K)
    ids = int32_rows(np.asarray(ids).reshape(-1))  # token ids: the batch's own int32 array, read in place
    if ids.size and (ids.min() < 0 or ids.max() >= N):
        raise ValueError(f"row ids must be in 0 .. {N - 1}; got {ids.min()} .. {ids.max()}")
    out = empty((ids.size, K))
    if ids.size:
        rc = lib.call(
            "rp_gguf_rows",
            qtype=FORMATS[qtype].ggml_type,
            out=addr(out),
            w=weight_address(panels),
            ids=addr(ids),
            T=ids.size,
            N=N,
            K=K,
            nthreads=nthreads,
        )
        if rc != 0:
            raise ValueError(f"rp_gguf_rows refused {qtype} {shape} (code {rc})")
    return out
