"""Collectives between the ranks of one tensor-parallel model (models/sharding.py's
`Communicator`): an all-reduce (sum), an all-gather and a gather to rank 0.

Two implementations:
- `PipeCommunicator` (cpu, sim): a star of `multiprocessing` pipes around rank 0. A test
  double's size, on purpose: it moves each activation through the driver, which is
  fine for checking correctness on a laptop and nothing more.
- `NcclCommunicator` (cuda): NCCL through `cupy.cuda.nccl`, on the backend's current
  stream, so a decode step's all-reduces are captured in its CUDA graph like any kernel.

A peer that went away (its process died) makes a collective raise `WorkerDiedError` at
once: the pipe reports end-of-file, and the driver stops waiting.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from rawpage.dtypes import BFLOAT16, from_float32, to_float32
from rawpage.errors import WorkerDiedError


class PipeCommunicator:
    """Rank 0 holds one pipe to each other rank; rank r > 0 holds its pipe to rank 0.
    Rank 0 adds the ranks' arrays in rank order (float32) and sends the same sum back, so
    every rank continues from identical bits."""

    def __init__(self, rank: int, world_size: int, pipes: list[Connection]) -> None:
        self.rank, self.world_size, self.pipes = rank, world_size, pipes  # rank 0: P - 1 pipes; else 1

    def all_reduce(self, x: np.ndarray) -> np.ndarray:
        if self.rank != 0:
            self._send(self.pipes[0], to_float32(x), 0)
            return self._recv(self.pipes[0], 0)
        total = to_float32(x).copy()
        for r, pipe in enumerate(self.pipes, 1):
            total += self._recv(pipe, r)
        out = from_float32(total, x.dtype)
        for r, pipe in enumerate(self.pipes, 1):
            self._send(pipe, out, r)
        return out

    def gather(self, x: np.ndarray) -> np.ndarray | None:
        if self.rank != 0:
            self._send(self.pipes[0], x, 0)
            return None
        return np.concatenate([x] + [self._recv(pipe, r) for r, pipe in enumerate(self.pipes, 1)], axis=-1)

    def all_gather(self, x: np.ndarray) -> np.ndarray:
        full = self.gather(x)
        if self.rank != 0:
            return self._recv(self.pipes[0], 0)
        for r, pipe in enumerate(self.pipes, 1):
            self._send(pipe, full, r)
        return full

    def _send(self, pipe: Connection, x: np.ndarray, peer: int) -> None:
        try:
            pipe.send(x)
        except (OSError, EOFError) as e:
            raise WorkerDiedError(f"tensor-parallel rank {peer} is gone ({type(e).__name__})") from None

    def _recv(self, pipe: Connection, peer: int) -> Any:
        try:
            return pipe.recv()
        except (OSError, EOFError) as e:
            raise WorkerDiedError(f"tensor-parallel rank {peer} is gone ({type(e).__name__})") from None


class NcclCommunicator:
    """NCCL on the GPUs of one host: rank r uses device r. Every call is enqueued on the
    current CuPy stream, which is the stream a CUDA graph captures, so a replayed decode
    step runs its all-reduces with no host involvement. (Not run in CI: no GPUs there.)"""

    def __init__(self, rank: int, world_size: int, unique_id: tuple[int, ...]) -> None:
        from cupy.cuda import nccl

        self.rank, self.world_size, self.nccl = rank, world_size, nccl
        self.comm = nccl.NcclCommunicator(world_size, unique_id, rank)

    @staticmethod
    def unique_id() -> tuple[int, ...]:
        """Made by the driver before the workers start, and handed to each of them."""
        from cupy.cuda import nccl

        return nccl.get_unique_id()

    def _dtype(self, x: Any) -> int:
        # bfloat16 is stored as uint16 bits (rawpage/dtypes.py): NCCL must add it as bfloat16.
        kinds = {np.dtype(np.float32): self.nccl.NCCL_FLOAT32, np.dtype(np.float16): self.nccl.NCCL_FLOAT16}
        return kinds.get(np.dtype(x.dtype), 9 if x.dtype == BFLOAT16 else None)  # 9 = ncclBfloat16

    def all_reduce(self, x: Any) -> Any:
        import cupy

        x = cupy.ascontiguousarray(x)
        stream = cupy.cuda.get_current_stream().ptr
        self.comm.allReduce(x.data.ptr, x.data.ptr, x.size, self._dtype(x), self.nccl.NCCL_SUM, stream)
        return x

    def all_gather(self, x: Any) -> Any:
        import cupy

        return cupy.concatenate(list(self._all_gather(x)), axis=-1)

    def gather(self, x: Any) -> Any | None:
        """NCCL has no gather: an all-gather, whose other ranks' copies are the price of one
        collective call that graphs can capture."""
        import cupy

        out = self._all_gather(x)
        return cupy.concatenate(list(out), axis=-1) if self.rank == 0 else None

    def _all_gather(self, x: Any) -> Any:
        """(N, C) on each rank -> (P, N, C) on every rank."""
        import cupy

        x = cupy.ascontiguousarray(x)
        out = cupy.empty((self.world_size, *x.shape), dtype=x.dtype)
        stream = cupy.cuda.get_current_stream().ptr
        self.comm.allGather(x.data.ptr, out.data.ptr, x.size, self._dtype(x), stream)
        return out
