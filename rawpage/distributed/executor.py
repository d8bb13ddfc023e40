"""The driver's side of tensor parallelism.

The engine's own process is rank 0: it holds shard 0 and runs the scheduler, the
block manager and the sampler, exactly as at --tensor-parallel-size 1. Ranks
1..P-1 are spawned worker processes (worker.py). `ParallelModelRunner` is the
ModelRunner with one change: before doing each command itself, it sends it to
every worker, so all ranks run the same forward pass on their own heads and meet
in its collectives.

    driver (rank 0)                        worker rank r
    schedule -> build HostBatch
    send ("run", HostBatch) ─────────────► upload, forward (shard r)
    upload, forward (shard 0) ◄─ all-reduce ─►
    gather logits ◄──────────────────────── its vocabulary rows
    sample
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import weakref
from typing import Any

from rawpage.config import ModelConfig
from rawpage.device_logits import DeviceLogits
from rawpage.distributed.communicator import NcclCommunicator, PipeCommunicator
from rawpage.distributed.worker import WorkerSpec, run_worker
from rawpage.engine_args import EngineArgs
from rawpage.errors import WorkerDiedError
from rawpage.forward_batch import HostBatch
from rawpage.memory import MemoryPlan
from rawpage.model_runner import KVPool, ModelRunner
from rawpage.models.sharding import ShardLayout, TensorParallel, check_shardable

logger = logging.getLogger("rawpage")

# A worker's exit status when the user's script, imported again in it, tried to start the engine.
NO_MAIN_GUARD_EXIT = 3


class TensorParallelGroup:
    """Spawns the workers and talks to them. `tp` is rank 0's share, for the driver's model."""

    def __init__(self, args: EngineArgs, device: str, config: ModelConfig, batched: int, max_model_len: int) -> None:
        if getattr(mp.current_process(), "_inheriting", False):
            # A spawned worker re-running the user's script, which has no `if __name__ ==
            # "__main__":` guard, reached LLM(...) again: starting workers from here would end in
            # multiprocessing's bootstrapping traceback. Exit quietly; rank 0 says what to do.
            raise SystemExit(NO_MAIN_GUARD_EXIT)
        size = args.tensor_parallel_size
        layout = ShardLayout.on(device, config, 0, size)
        check_shardable(config, size, layout.exact)
        if device == "cuda":
            _check_gpu_count(size)
        ctx = mp.get_context("spawn")  # a fork would copy CUDA state and the engine thread's locks
        nccl_id = NcclCommunicator.unique_id() if device == "cuda" else None
        self.procs: list[Any] = []
        self.controls: list[Any] = []
        comm_pipes = []
        for rank in range(1, size):
            control, worker_control = ctx.Pipe()
            if nccl_id is None:
                comm_pipe, endpoint = ctx.Pipe()
                comm_pipes.append(comm_pipe)
            else:
                endpoint = nccl_id
            proc = ctx.Process(
                target=run_worker,
                args=(WorkerSpec(rank, size, args, device, batched, max_model_len), worker_control, endpoint),
                name=f"rawpage-tp-rank{rank}",
                daemon=True,
            )
            proc.start()
            worker_control.close()  # so that the worker's death reads as end-of-file here
            if nccl_id is None:
                endpoint.close()
            self.procs.append(proc)
            self.controls.append(control)
        comm = PipeCommunicator(0, size, comm_pipes) if nccl_id is None else NcclCommunicator(0, size, nccl_id)
        self.tp = TensorParallel(layout, comm)
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.controls)
        logger.info("tensor parallel: %d ranks on %s; workers are pids %s", size, device, [p.pid for p in self.procs])

    def agree_on_pool(self, plan: MemoryPlan) -> MemoryPlan:
        """Each rank sized its KV pool from its own memory; every rank must hold the same
        block ids, so the pool is the smallest."""
        counts = [plan.num_blocks]
        for rank in range(1, len(self.procs) + 1):
            msg = self._recv(rank)
            if msg[0] == "error":
                raise RuntimeError(f"tensor-parallel rank {rank} failed to start: {msg[1]}")
            counts.append(msg[1])
        logger.info("tensor parallel: KV blocks per rank %s; the pool takes the smallest, %d", counts, min(counts))
        if min(counts) == plan.num_blocks:
            return plan
        per_block = plan.bytes_per_block
        return MemoryPlan(**{**vars(plan), "num_blocks": min(counts), "kv_bytes": min(counts) * per_block})

    def start_runners(self, pool: KVPool, graph_shapes: list[tuple[int, int]] | None) -> None:
        self.broadcast(("runner", pool, graph_shapes))

    def broadcast(self, msg: tuple) -> None:
        """Send one command to every worker, first checking that each is still alive."""
        self.check_alive()
        for rank, control in enumerate(self.controls, 1):
            try:
                control.send(msg)
            except OSError:
                raise self._died(rank) from None

    def check_alive(self, wait: float = 0.0) -> None:
        """Raise WorkerDiedError naming the first worker that has exited (waiting up to
        `wait` seconds for each, when a collective has already found a pipe closed)."""
        for rank, proc in enumerate(self.procs, 1):
            proc.join(timeout=wait)
            if proc.exitcode is not None:
                raise self._died(rank)

    def close(self) -> None:
        self._finalizer()

    def _recv(self, rank: int) -> tuple:
        try:
            return self.controls[rank - 1].recv()
        except (EOFError, OSError):
            raise self._died(rank) from None

    def _died(self, rank: int) -> WorkerDiedError:
        proc = self.procs[rank - 1]
        proc.join(timeout=1.0)
        code = proc.exitcode
        if code == NO_MAIN_GUARD_EXIT:
            return WorkerDiedError(
                "tensor-parallel workers are spawned processes that import your script again, and it started "
                "the engine again at import time: put the code that creates LLM(...) under "
                '`if __name__ == "__main__":` (as vLLM asks too)'
            )
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return WorkerDiedError(
            f"tensor-parallel worker rank {rank} (pid {proc.pid}) {how}; the engine cannot go on without it "
            "(its shard of the weights and of the KV cache is gone). See the worker's log above, and restart."
        )


class ParallelModelRunner(ModelRunner):
    """Rank 0's ModelRunner: each command goes to the workers first, then runs here."""

    def __init__(self, group: TensorParallelGroup, *args: Any, **kwargs: Any) -> None:
        self.group = group
        super().__init__(*args, **kwargs)

    def swap(self, swap_out: list[tuple[int, int]], swap_in: list[tuple[int, int]]) -> None:
        if swap_out or swap_in:
            self.group.broadcast(("swap", swap_out, swap_in))
        super().swap(swap_out, swap_in)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if copies:
            self.group.broadcast(("copy", copies))
        super().copy_blocks(copies)

    def run(self, hb: HostBatch) -> DeviceLogits:
        self.group.broadcast(("run", hb))
        try:
            return super().run(hb)
        except WorkerDiedError:
            self.group.check_alive(wait=1.0)  # the message that names the rank and its exit code
            raise


def _stop_workers(procs: list[Any], controls: list[Any]) -> None:
    for control in controls:
        try:
            control.send(("stop",))
        except OSError:
            pass
    for proc in procs:
        proc.join(timeout=5.0)
        if proc.is_alive():
            proc.terminate()


def _check_gpu_count(size: int) -> None:
    import cupy

    found = cupy.cuda.runtime.getDeviceCount()
    if found < size:
        raise ValueError(
            f"--tensor-parallel-size {size} needs {size} GPUs (one per rank); {found} visible "
            "(CUDA_VISIBLE_DEVICES); lower --tensor-parallel-size"
        )
