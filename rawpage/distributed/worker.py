"""A tensor-parallel worker: one spawned process per rank > 0, owning its shard of the
weights and its part of the KV cache (its KV heads, every block).

It has no scheduler, block manager or sampler. The driver (rank 0, the engine's own
process) sends it, on its control pipe, the startup facts and then each step's
commands, the same ones the driver's own runner executes:

    ("swap", out, in)    ("copy", pairs)    ("run", HostBatch)    ("stop",)

A "run" is the step's batch metadata in one message, the same arrays every rank
uploads; block tables are identical on every rank, since ranks differ only in heads.
Any failure ends the process: the driver then sees its pipes close and stops the
engine with a message, instead of waiting on a collective that will never come.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from rawpage.distributed.communicator import NcclCommunicator, PipeCommunicator
from rawpage.engine_args import EngineArgs
from rawpage.model_runner import ModelRunner
from rawpage.models.sharding import ShardLayout, TensorParallel
from rawpage.rank_setup import backend_for, build_rank, plan_kv_cache

logger = logging.getLogger("rawpage")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with (pickled into the spawned process)."""

    rank: int
    size: int
    args: EngineArgs
    device: str
    batched: int  # --max-num-batched-tokens: the worst-case step the pool is sized after
    max_model_len: int


def run_worker(spec: WorkerSpec, control: Connection, comm_endpoint: Any) -> None:
    """The worker process's main: build the shard, report its KV blocks, then serve steps."""
    try:
        runner = _start(spec, control, comm_endpoint)
        if runner is None:
            return
        _serve(runner, control)
    except BaseException as e:  # noqa: BLE001 - the driver learns of it by the pipe closing
        try:
            control.send(("error", f"{type(e).__name__}: {e}"))
        except OSError:
            pass
        print(f"rawpage tensor-parallel rank {spec.rank} failed:\n{traceback.format_exc()}", file=sys.stderr)
        os._exit(1)


def _start(spec: WorkerSpec, control: Connection, comm_endpoint: Any) -> ModelRunner | None:
    rank, size, args, device = spec.rank, spec.size, spec.args, spec.device
    if device == "cuda":
        import cupy

        cupy.cuda.Device(rank).use()  # rank r drives GPU r
        comm = NcclCommunicator(rank, size, comm_endpoint)
    else:
        comm = PipeCommunicator(rank, size, [comm_endpoint])
    ckpt = args.load_checkpoint()
    backend = backend_for(args, device, ckpt.config.torch_dtype)
    tp = TensorParallel(ShardLayout.on(device, ckpt.config, rank, size), comm)
    model = build_rank(ckpt, backend, args.quantization, tp)
    plan = plan_kv_cache(args, model, backend, spec.batched, spec.max_model_len)
    control.send(("ready", plan.num_blocks))
    msg = control.recv()
    if msg[0] != "runner":
        return None
    _, pool, graph_shapes = msg
    return ModelRunner(model, backend, pool, graph_shapes, spec.max_model_len)


def _serve(runner, control: Connection) -> None:
    while True:
        try:
            msg = control.recv()
        except EOFError:  # the driver is gone
            return
        if msg[0] == "run":
            runner.run(msg[1])
        elif msg[0] == "swap":
            runner.swap(msg[1], msg[2])
        elif msg[0] == "copy":
            runner.copy_blocks(msg[1])
        elif msg[0] == "stop":
            return
        else:
            raise ValueError(f"unknown command {msg[0]!r} from the driver")
