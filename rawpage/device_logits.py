"""Logits that stay where the model computed them until someone asks for rows.

At a 128k vocabulary a batch of 256 rows is 131 MB of float32: copying it to
the host and taking the argmax there would cost more than the decode step
itself. So the runner returns DeviceLogits: greedy rows are argmaxed on the
device and only their token ids come back (Sampler.sample_rows); rows that need
the full distribution (sampling, logprobs, penalties) come back as NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rawpage.backends.base import Array, Backend
from rawpage.dtypes import to_float32


class DeviceLogits:
    def __init__(self, backend: Backend, data: Array) -> None:
        self.backend = backend
        self.data = data  # (N, V) in the model dtype (bfloat16 as uint16 bits)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, index: Any) -> np.ndarray:
        """The selected rows (or slice) on the host, as float32."""
        if isinstance(index, (list, np.ndarray)):
            index = self.backend.asarray(np.asarray(index, dtype=np.int64), np.int64)
        return np.asarray(self.backend.to_numpy(self.data[index]), dtype=np.float32)

    def argmax(self, rows: list[int] | np.ndarray) -> np.ndarray:
        """(len(rows),) int64: the most likely token of each row, computed on the device."""
        rows = np.asarray(rows, dtype=np.int64)
        everything = np.array_equal(rows, np.arange(len(self)))
        picked = self.data if everything else self.data[self.backend.asarray(rows, np.int64)]
        ids = to_float32(picked).argmax(axis=-1)
        return np.asarray(self.backend.to_numpy(ids), dtype=np.int64)
