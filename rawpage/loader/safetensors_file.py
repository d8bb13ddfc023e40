"""A small, strict reader for `.safetensors` files, memory-mapped through NumPy.

We read the format ourselves rather than through `safetensors.numpy` because
NumPy has no bfloat16: we hand back BF16 tensors as their raw `uint16` bits,
which the backends widen to float32 on the CPU or keep as-is on the GPU.

Layout: 8-byte little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}}`, then the data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np

from rawpage.errors import ModelLoadError

_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,  # raw bits; see bf16_to_f32
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "F8_E4M3": np.uint8,  # raw e4m3 bits; see rawpage/quantization/fp8.py
    "BOOL": np.bool_,
}


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 is the top half of a float32: shift the bits up 16 places."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


class SafetensorsFile:
    """One `.safetensors` file. `tensor(name)` returns a read-only memory-mapped view."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelLoadError(f"{path}: not a safetensors file (shorter than its header)")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise ModelLoadError(f"{path}: corrupt safetensors header (claims {n} bytes, file has {size})")
            try:
                header = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ModelLoadError(f"{path}: corrupt safetensors header ({e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self._entries = header
        self._data_start = 8 + n
        self._mmap = np.memmap(path, dtype=np.uint8, mode="r") if size > 8 + n else None
        data_len = size - self._data_start
        for name, e in header.items():
            if e.get("dtype") not in _DTYPES:
                raise ModelLoadError(f"{path}: tensor {name!r} has unsupported dtype {e.get('dtype')!r}")
            begin, end = e["data_offsets"]
            itemsize = np.dtype(_DTYPES[e["dtype"]]).itemsize
            if end > data_len or end - begin != itemsize * int(np.prod(e["shape"], dtype=np.int64)):
                raise ModelLoadError(
                    f"{path}: tensor {name!r} lies outside the file or has the wrong size "
                    "(the file is truncated or corrupt)"
                )

    def keys(self) -> Iterator[str]:
        return iter(self._entries)

    def dtype_name(self, name: str) -> str:
        return self._entries[name]["dtype"]

    def shape(self, name: str) -> tuple[int, ...]:
        """From the header: no tensor data is read."""
        return tuple(self._entries[name]["shape"])

    def tensor(self, name: str) -> np.ndarray:
        e = self._entries[name]
        begin, end = e["data_offsets"]
        dtype = _DTYPES[e["dtype"]]
        if self._mmap is None or begin == end:
            return np.zeros(e["shape"], dtype=dtype)
        raw = self._mmap[self._data_start + begin : self._data_start + end]
        return raw.view(dtype).reshape(e["shape"])
