"""A fast, strict reader for the GGUF container (metadata and tensor directory).

The `gguf` package's reader builds a NumPy view per metadata item, which takes
seconds for a 49k-entry vocabulary. The container is simple, so we parse it
with `struct` here and check every length against the file size. The block formats
are rawpage/quantization/gguf.py's table; GGML_TYPES below names every other type
(so that a refusal names it) and gives its size (so that the directory is checked).
Loading needs nothing of the `gguf` package, which the tests and tools use to write
files (it pulls in PyYAML and requests).

Layout (little-endian, version 2 and 3):
    "GGUF" u32 version, u64 n_tensors, u64 n_kv
    n_kv x   (string key, u32 type, value)             string = u64 len + utf-8
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims] innermost first,
                 u32 ggml_type, u64 offset into the data section)
    padding to `general.alignment` (default 32), then the data section.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawpage.errors import ModelLoadError
from rawpage.quantization.gguf import FORMATS

# GGML type id -> (name, values a block, bytes a block), as ggml's type traits (and the
# `gguf` package's GGML_QUANT_SIZES: tests/test_loading.py holds the two together). The
# formats rawpage keeps in their blocks come from FORMATS; these are the rest.
_OTHER_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    9: ("Q8_1", 32, 40),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
GGML_TYPES = {f.ggml_type: (name, f.block, f.block_bytes) for name, f in FORMATS.items()} | _OTHER_TYPES


def ggml_type_name(ggml_type: int) -> str:
    """A GGML type's name ("Q4_K"), or "type N" for an id this table does not know."""
    return GGML_TYPES[ggml_type][0] if ggml_type in GGML_TYPES else f"type {ggml_type}"


# GGUF metadata value types -> struct format (scalars) ; 8 = string, 9 = array
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}


@dataclass
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order (outermost first): (rows, cols) for a matrix
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    def __init__(self, buf: memoryview, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.buf):
            raise ModelLoadError(
                f"{self.path}: GGUF file is truncated (needs byte {self.pos + n:,}, has {len(self.buf):,})"
            )
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("Q"))).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            item_type, n = self.scalar("I"), self.scalar("Q")
            if item_type in _NUMPY:
                dt = np.dtype(_NUMPY[item_type]).newbyteorder("<")
                return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).tolist()
            return [self.value(item_type) for _ in range(n)]
        raise ModelLoadError(f"{self.path}: corrupt GGUF metadata (unknown value type {vtype})")


def read_gguf(path: str) -> tuple[dict[str, Any], list[GGUFTensorInfo], np.memmap]:
    """Returns (metadata, tensor directory, the whole file memory-mapped as uint8)."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except ValueError:  # an empty file cannot be mapped
        raise ModelLoadError(f"{path}: empty file, not a GGUF model") from None
    cur = _Cursor(memoryview(data), path)
    if bytes(cur.take(4)) != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (bad magic)")
    version = cur.scalar("I")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    if n_tensors > len(data) or n_kv > len(data):
        raise ModelLoadError(f"{path}: corrupt GGUF header ({n_tensors} tensors, {n_kv} metadata items)")
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("Q") for _ in range(cur.scalar("I"))]
        ggml_type, offset = cur.scalar("I"), cur.scalar("Q")
        infos.append((name, dims, ggml_type, offset))
    align = int(meta.get("general.alignment", 32))
    data_start = -(-cur.pos // align) * align
    tensors = []
    for name, dims, ggml_type, offset in infos:
        if ggml_type not in GGML_TYPES:
            raise ModelLoadError(f"{path}: tensor {name!r} has unknown GGML type {ggml_type}")
        _, block, type_size = GGML_TYPES[ggml_type]
        n = int(np.prod(dims, dtype=np.int64))
        nbytes = n // block * type_size
        start = data_start + offset
        if start + nbytes > len(data):
            raise ModelLoadError(f"{path}: tensor {name!r} runs past the end of the file (the file is truncated)")
        tensors.append(GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, start, nbytes))
    return meta, tensors, data
