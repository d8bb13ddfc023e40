"""How many KV blocks fit: the arithmetic behind the pool size, and its log lines.

CPU: the KV pool gets --kv-cache-memory (default 2 GiB).
GPU (like vLLM): load the weights, run one worst-case forward pass to measure
peak activation memory, then give the KV cache everything left under
--gpu-memory-utilization of the device's total memory.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
DEFAULT_CPU_KV_CACHE = 2 * GiB


class OutOfMemoryError(RuntimeError):
    """The KV cache cannot hold one sequence of --max-model-len; the message says what to change."""


@dataclass
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

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_full_length_seqs(self) -> float:
        return self.num_tokens / self.max_model_len

    def describe(self) -> str:
        lines = []
        if self.total_bytes is not None:
            lines.append(
                f"device memory {self.total_bytes / GiB:.2f} GiB x utilization {self.utilization:.2f} "
                f"= {self.total_bytes * self.utilization / GiB:.2f} GiB budget"
            )
        lines += [
            f"weights {self.weights_bytes / GiB:.3f} GiB, peak activations {self.activation_bytes / GiB:.3f} GiB, "
            f"KV cache {self.kv_bytes / GiB:.3f} GiB",
            f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens "
            f"({self.bytes_per_block / 2**10:.0f} KiB per block) = {self.num_tokens:,} tokens; "
            f"{self.max_full_length_seqs:.1f} sequences of --max-model-len {self.max_model_len} fit",
        ]
        return "\n".join(lines)


def plan_fixed(kv_budget: int, bytes_per_block: int, block_size: int, max_model_len: int,
               weights_bytes: int = 0, activation_bytes: int = 0, flag: str = "--kv-cache-memory") -> MemoryPlan:  # fmt: skip
    """A pool of a fixed byte budget (CPU)."""
    num_blocks = kv_budget // bytes_per_block
    plan = MemoryPlan(weights_bytes, activation_bytes, num_blocks * bytes_per_block, bytes_per_block,
                      num_blocks, block_size, max_model_len)  # fmt: skip
    check_fits(plan, flag)
    return plan


def plan_gpu(total_bytes: int, utilization: float, weights_bytes: int, activation_bytes: int,
             bytes_per_block: int, block_size: int, max_model_len: int) -> MemoryPlan:  # fmt: skip
    """vLLM's rule: KV gets utilization * total - weights - peak activations."""
    budget = int(total_bytes * utilization) - weights_bytes - activation_bytes
    num_blocks = max(0, budget // bytes_per_block)
    plan = MemoryPlan(weights_bytes, activation_bytes, num_blocks * bytes_per_block, bytes_per_block,
                      num_blocks, block_size, max_model_len, total_bytes, utilization)  # fmt: skip
    check_fits(plan, "--gpu-memory-utilization")
    return plan


def check_fits(plan: MemoryPlan, flag: str) -> None:
    """Fail, saying which flag to change and to what, if one --max-model-len sequence cannot fit."""
    if plan.num_tokens >= plan.max_model_len:
        return
    need_blocks = -(-plan.max_model_len // plan.block_size)
    need_kv = need_blocks * plan.bytes_per_block
    if flag == "--num-gpu-blocks-override":
        fix = f"raise {flag} to {need_blocks}"
    elif flag == "--kv-cache-memory":
        fix = f"raise {flag} to {-(-need_kv // 2**20)}MiB"
    else:
        want = (plan.weights_bytes + plan.activation_bytes + need_kv) / (plan.total_bytes or 1)
        fix = f"raise {flag} to {min(want, 1.0):.2f}" + (" (the model does not fit this GPU)" if want > 1 else "")
    raise OutOfMemoryError(
        f"the KV cache holds {plan.num_tokens:,} tokens ({plan.num_blocks} blocks), fewer than one sequence "
        f"of --max-model-len {plan.max_model_len}. Lower --max-model-len to {plan.num_tokens} or less, "
        f"or {fix}.\n{plan.describe()}"
    )
