"""How many KV blocks fit: the arithmetic behind the pool size, and its log lines.

CPU: the KV pool gets --kv-cache-memory (default 2 GiB, or less when --max-num-seqs
sequences of --max-model-len need less: a tiny test model would otherwise get 262,144
blocks it can never fill, and every snapshot of the web page's pool grid would carry them).
GPU (like vLLM): load the weights, run one worst-case forward pass to measure
peak activation memory, then give the KV cache everything left under
--gpu-memory-utilization of the device's total memory:

    KV = total x utilization - weights - peak activations - other
    other = what the device reports in use beyond our memory pool: the CUDA
            context, cuBLAS's workspace, loaded kernels, other processes

`profile_gpu` does the measuring through the small DeviceMemory interface, so
the arithmetic is tested with a fake device; `plan_gpu` is the formula.

A draft model (speculative decoding) is loaded before the plan: its weights count with
the target's, and it gets its own KV pool of as many blocks as the target's (every
running sequence may need draft K/V for every token it holds), at its own bytes per
block. Each target block thus costs bytes_per_block + draft bytes_per_block, and the
KV budget is divided by that sum, as vLLM splits one budget over every layer.

The decode CUDA graphs are captured after the KV cache is allocated, and their
temporaries (one decode step of at most --max-num-seqs tokens, or a speculative
verification step of at most 512, far smaller than the profiled prefill peak)
come out of the 1 - utilization headroom, as in vLLM; startup logs how much they hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

GiB = 1 << 30
DEFAULT_CPU_KV_CACHE = 2 * GiB


def size_text(n: float) -> str:
    """Bytes as the log shows them: GiB, or MiB below 0.1 GiB, where three decimals of GiB
    say little or nothing (a tiny test model's weights would read 0.000 GiB)."""
    return f"{n / GiB:.3f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


class OutOfMemoryError(RuntimeError):
    """The KV cache cannot hold one sequence of --max-model-len; the message says what to change."""


@dataclasses.dataclass(frozen=True)
class DraftMemory:
    """The draft model's share of the plan: its weights, and its KV bytes per block
    (2 x its layers x BS x its Hkv x its D x element bytes)."""

    weights_bytes: int
    bytes_per_block: int


@dataclasses.dataclass(frozen=True)
class PoolLayout:
    """What one KV block holds and what one sequence needs of them: every plan starts here."""

    bytes_per_block: int  # K and V of every layer: 2 x L x BS x Hkv x D x element bytes
    block_size: int
    max_model_len: int
    # Every layer attends within this window: blocks older than it are released while a
    # sequence runs, so one sequence never holds more than window_blocks() blocks.
    sliding_window: int | None = None
    kv_cache_dtype: str = "auto"  # fp8: 1-byte elements, float16 (CPU): 2-byte (bytes_per_block counts them)
    draft: DraftMemory | None = None  # speculative decoding's draft model: a pool of num_blocks blocks too


@dataclasses.dataclass
class MemoryPlan:
    weights_bytes: int
    activation_bytes: int
    kv_bytes: int  # what the pool actually takes
    bytes_per_block: int
    num_blocks: int
    block_size: int
    max_model_len: int
    total_bytes: int | None = None  # device memory, GPU only
    utilization: float | None = None
    other_bytes: int = 0  # GPU: in use outside our pool (context, cuBLAS, other processes)
    sliding_window: int | None = None  # this and kv_cache_dtype, draft: the PoolLayout's
    kv_cache_dtype: str = "auto"
    lora_bytes: int = 0  # --enable-lora: the adapter slots, counted in weights_bytes
    lora_text: str = ""
    weights_note: str = ""  # how the backend holds the weights (Backend.weights_note)
    draft: DraftMemory | None = None
    sizing: str = ""  # how the pool was sized, when not by its budget alone (a log line)

    @property
    def draft_kv_bytes(self) -> int:
        return self.num_blocks * self.draft.bytes_per_block if self.draft else 0

    @property
    def all_weights_bytes(self) -> int:
        return self.weights_bytes + (self.draft.weights_bytes if self.draft else 0)

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def tokens_per_seq(self) -> int:
        """The most KV slots one sequence of --max-model-len holds at once."""
        if not self.sliding_window:
            return self.max_model_len
        window_blocks = -(-self.sliding_window // self.block_size) + 1  # a window spans at most this many
        return min(self.max_model_len, window_blocks * self.block_size)

    @property
    def max_full_length_seqs(self) -> float:
        return self.num_tokens / self.tokens_per_seq

    def describe(self) -> str:
        lines = []
        if self.total_bytes is not None:
            lines.append(
                f"device memory {self.total_bytes / GiB:.2f} GiB x utilization {self.utilization:.2f} "
                f"= {self.total_bytes * self.utilization / GiB:.2f} GiB budget"
            )
        other = f", other {size_text(self.other_bytes)} (CUDA context, cuBLAS, kernels)" if self.other_bytes else ""
        # Activations are measured only on the GPU; a fixed budget (CPU) has no figure to show.
        peak = f"peak activations {size_text(self.activation_bytes)}, " if self.activation_bytes else ""
        lora = f" (LoRA slots {size_text(self.lora_bytes)} of it)" if self.lora_bytes else ""
        lines += [
            f"weights {size_text(self.weights_bytes)}{self.weights_note}{lora}, {peak}KV cache "
            f"{size_text(self.kv_bytes)}{other}",
            f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens "
            f"({self.bytes_per_block / 2**10:.0f} KiB per block) = {self.num_tokens:,} tokens; "
            f"{self.max_full_length_seqs:.1f} sequences of --max-model-len {self.max_model_len} fit",
        ]
        if self.kv_cache_dtype != "auto":
            size = "2 bytes" if self.kv_cache_dtype == "float16" else "1 byte"
            lines[-1] += f" (KV cache dtype {self.kv_cache_dtype}: {size} an element)"
        if self.tokens_per_seq < self.max_model_len:
            lines[-1] += (
                f" (a sliding window of {self.sliding_window} tokens in every layer: each sequence holds "
                f"at most {self.tokens_per_seq // self.block_size} blocks, older ones are released)"
            )
        if self.draft:
            lines.append(
                f"draft model: {size_text(self.draft.weights_bytes)} weights, {size_text(self.draft_kv_bytes)} KV "
                f"for {self.num_blocks} blocks ({self.draft.bytes_per_block / 2**10:.0f} KiB per block), "
                "in the same budget"
            )
        return "\n".join(lines + [t for t in (self.sizing, self.lora_text) if t])


def _unsized(layout: PoolLayout, weights_bytes: int, activation_bytes: int, **gpu: float) -> MemoryPlan:
    """A plan of no blocks yet (size_pool gives it its blocks); gpu: total_bytes, utilization, other_bytes."""
    return MemoryPlan(weights_bytes, activation_bytes, kv_bytes=0, num_blocks=0, **vars(layout), **gpu)


def plan_fixed(
    kv_budget: int,
    layout: PoolLayout,
    weights_bytes: int = 0,
    activation_bytes: int = 0,
    flag: str = "--kv-cache-memory",
) -> MemoryPlan:
    """A pool of a fixed byte budget (CPU); a draft model's pool comes out of it too."""
    return size_pool(_unsized(layout, weights_bytes, activation_bytes), kv_budget, flag)


def plan_cpu_default(max_num_seqs: int, layout: PoolLayout, weights_bytes: int = 0) -> MemoryPlan:
    """The pool when --kv-cache-memory is not given: DEFAULT_CPU_KV_CACHE, or only the blocks
    --max-num-seqs sequences of --max-model-len can hold at once when that is less. More
    would only ever hold cached prefixes, and cost their memory and the engine view's time."""
    plan = plan_fixed(DEFAULT_CPU_KV_CACHE, layout, weights_bytes)
    per_seq = -(-plan.tokens_per_seq // layout.block_size)  # blocks, the last one partly filled
    need = max_num_seqs * per_seq
    if need >= plan.num_blocks:
        return plan
    sizing = (
        f"KV pool: {need:,} blocks = what {max_num_seqs} seqs x {plan.tokens_per_seq} tokens need "
        f"(less than the {DEFAULT_CPU_KV_CACHE // GiB} GiB default; --kv-cache-memory sets it)"
    )
    return dataclasses.replace(plan, num_blocks=need, kv_bytes=need * layout.bytes_per_block, sizing=sizing)


def plan_gpu(
    total_bytes: int,
    utilization: float,
    weights_bytes: int,
    activation_bytes: int,
    layout: PoolLayout,
    other_bytes: int = 0,
) -> MemoryPlan:
    """vLLM's rule: KV gets utilization * total - weights - peak activations - other
    (a draft model's weights are weights; its pool is KV)."""
    gpu = {"total_bytes": total_bytes, "utilization": utilization, "other_bytes": other_bytes}
    unsized = _unsized(layout, weights_bytes, activation_bytes, **gpu)
    budget = int(total_bytes * utilization) - unsized.all_weights_bytes - activation_bytes - other_bytes
    return size_pool(unsized, budget, "--gpu-memory-utilization")


def size_pool(plan: MemoryPlan, kv_budget: int, flag: str) -> MemoryPlan:
    """`plan` with as many blocks as kv_budget buys, checked to hold one sequence. Each block
    of the target's pool comes with one of the draft model's: the budget buys them in pairs."""
    pair = plan.bytes_per_block + (plan.draft.bytes_per_block if plan.draft else 0)
    num_blocks = max(0, kv_budget // pair)
    plan = dataclasses.replace(plan, num_blocks=num_blocks, kv_bytes=num_blocks * plan.bytes_per_block)
    check_fits(plan, flag)
    return plan


class DeviceMemory(Protocol):
    """What memory sizing needs to know about a GPU (CupyMemory in rawpage/backends/cuda.py)."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, as the driver reports them (all processes)."""
        ...

    def pool_held_bytes(self) -> int:
        """Bytes our memory pool holds from the device: arrays in use plus freed blocks it keeps."""
        ...

    def release_cached(self) -> None:
        """Give the pool's free blocks back to the device."""
        ...

    def synchronize(self) -> None: ...


def profile_gpu(
    memory: DeviceMemory,
    weights_bytes: int,
    run_worst_case: Callable[[], None],
    utilization: float,
    layout: PoolLayout,
) -> MemoryPlan:
    """Call once the weights (a draft model's too) are loaded. Runs the worst-case forward pass and sizes the KV cache.

    The pool keeps every block it ever handed out, so after the pass it holds
    what it held before plus the pass's peak working set: that growth is the
    activation peak. Whatever else the driver reports in use (weights and
    activations aside) is "other"; so the KV cache gets utilization x total
    minus everything in use at the peak."""
    memory.synchronize()
    memory.release_cached()
    held_before = memory.pool_held_bytes()
    run_worst_case()
    memory.synchronize()
    activations = max(0, memory.pool_held_bytes() - held_before)
    free, total = memory.mem_get_info()
    draft_weights = layout.draft.weights_bytes if layout.draft else 0
    other = max(0, (total - free) - weights_bytes - draft_weights - activations)
    # The peak is reserved in the plan; hand the cached blocks back so that the KV
    # cache's large arrays can be carved from them.
    memory.release_cached()
    return plan_gpu(total, utilization, weights_bytes, activations, layout, other)


def check_fits(plan: MemoryPlan, flag: str) -> None:
    """Fail, saying which flag to change and to what, if one --max-model-len sequence cannot fit
    (with a draft model: its K/V for that sequence too)."""
    if plan.num_tokens >= plan.tokens_per_seq:
        return
    need_blocks = -(-plan.tokens_per_seq // plan.block_size)
    need_kv = need_blocks * (plan.bytes_per_block + (plan.draft.bytes_per_block if plan.draft else 0))
    if flag == "--num-gpu-blocks-override":
        fix = f"raise {flag} to {need_blocks}"
    elif flag == "--kv-cache-memory":
        fix = f"raise {flag} to {-(-need_kv // 2**20)}MiB"
    else:
        need = plan.all_weights_bytes + plan.activation_bytes + plan.other_bytes + need_kv
        want = -(-100 * need // (plan.total_bytes or 1)) / 100  # rounded up: enough, not almost
        too_big = "the model and its draft model do not" if plan.draft else "the model does not"
        fix = f"raise {flag} to {want:.2f}" if want <= 1 else f"use a GPU with more memory ({too_big} fit this GPU)"
        if plan.num_tokens == 0:  # no KV room at all: a shorter --max-model-len cannot help
            fix += ", or lower --max-num-batched-tokens to shrink the activation peak"
    if plan.draft:
        fix += ", or use a smaller draft model in --speculative-config (or its ngram method: no draft pool)"
    shorter = f"Lower --max-model-len to {plan.num_tokens} or less, or " if plan.num_tokens else "To fix it, "
    pool = f"{plan.num_blocks} blocks, each with a draft model block" if plan.draft else f"{plan.num_blocks} blocks"
    raise OutOfMemoryError(
        f"the KV cache holds {plan.num_tokens:,} tokens ({pool}), fewer than one sequence "
        f"of --max-model-len {plan.max_model_len}. {shorter}{fix}.\n{plan.describe()}"
    )
