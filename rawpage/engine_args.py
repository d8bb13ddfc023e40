"""EngineArgs: every engine setting, as `LLM(...)` keywords and as vLLM-named CLI flags."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import Any

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def parse_bytes(text: str | int | float) -> int:
    """'2GiB', '512MiB', '1.5GB' or a plain number of bytes -> bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MiB, 1000000)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@dataclass
class EngineArgs:
    model: str | None = None  # HF folder or .gguf; None = the embedded SmolLM2-135M-Instruct
    served_model_name: str | None = None
    device: str = "auto"  # cpu | sim | cuda | auto
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    load_format: str = "auto"  # auto | dummy (random weights of the config's shapes)
    quantization: str = "auto"  # auto (as the checkpoint packs) | fp8 (quantize at load) | none
    max_model_len: int | None = None  # default: the model's context length
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # default: 2048 (cpu), 8192 (cuda)
    block_size: int = 16
    kv_cache_memory: int | str | None = None  # bytes for the KV pool (CPU default 2 GiB)
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None  # force the pool size (tests, experiments)
    swap_space: float = 4.0  # GiB of CPU memory for swapped-out blocks
    preemption_mode: str = "recompute"  # recompute | swap
    enable_prefix_caching: bool = True
    share_forked_blocks: bool = True  # False (tests, benchmarks): n > 1 children recompute their own prompt copy
    enforce_eager: bool = False
    chat_template: str | None = None
    max_logprobs: int = 20  # most logprobs / prompt_logprobs a request may ask for
    scheduling_policy: str = "fcfs"  # fcfs | priority (requests' `priority` is honoured only here)
    seed: int = 0
    log_stats_interval: float = 5.0  # seconds between stats lines while busy; 0 = off

    def __post_init__(self) -> None:
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes(self.kv_cache_memory)
        checks = [
            (self.block_size in (8, 16, 32), "block_size", "must be 8, 16 or 32"),
            (self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1"),
            (
                self.max_model_len is None or self.max_model_len >= 1,
                "max_model_len",
                "must be >= 1",
            ),
            (
                self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                "max_num_batched_tokens",
                "must be >= 1",
            ),  # fmt: skip
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]"),
            (
                self.preemption_mode in ("recompute", "swap"),
                "preemption_mode",
                "must be recompute or swap",
            ),
            (
                self.device in ("auto", "cpu", "sim", "cuda"),
                "device",
                "must be auto, cpu, sim or cuda",
            ),
            (
                self.dtype in ("auto", "float32", "float16", "bfloat16", "half"),
                "dtype",
                "must be auto, float32, float16 or bfloat16",
            ),  # fmt: skip
            (self.load_format in ("auto", "dummy"), "load_format", "must be auto or dummy"),
            (self.swap_space >= 0, "swap_space", "must be >= 0"),
            (self.max_logprobs >= 0, "max_logprobs", "must be >= 0"),
            (self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy", "must be fcfs or priority"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("engine")
        g.add_argument(
            "--model",
            help="Hugging Face model folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
        )
        g.add_argument(
            "--served-model-name",
            help="model name reported by the API (default: derived from --model)",
        )
        g.add_argument("--device", default="auto", choices=["auto", "cpu", "sim", "cuda"],
                       help="cpu: NumPy; sim: our CUDA kernels run on the CPU (slow, for testing); "
                            "cuda: CuPy and our kernels; auto: cuda if a GPU is present (default: auto)")  # fmt: skip
        g.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16", "half"],
                       help="weight and activation dtype; auto = float32 on cpu, the checkpoint's dtype on cuda")  # fmt: skip
        g.add_argument("--quantization", default="auto", choices=["auto", "fp8", "none"],
                       help="Linear weights: auto = as the checkpoint packs them (GGUF, AWQ, GPTQ, FP8); "
                            "fp8 = quantize a float checkpoint to FP8 e4m3 at load; none = dequantize at load")  # fmt: skip
        g.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                       help="dummy: random weights of the shapes in --model's config.json, for benchmarks")  # fmt: skip
        g.add_argument(
            "--max-model-len",
            type=int,
            help="longest prompt + output, in tokens (default: the model's)",
        )
        g.add_argument(
            "--max-num-seqs",
            type=int,
            default=256,
            help="most sequences in one batch (default: 256)",
        )
        g.add_argument("--max-num-batched-tokens", type=int,
                       help="most tokens in one forward pass; longer prompts are prefilled in chunks "
                            "(default: 2048 on cpu, 8192 on cuda)")  # fmt: skip
        g.add_argument(
            "--block-size",
            type=int,
            default=16,
            choices=[8, 16, 32],
            help="tokens per KV block (default: 16)",
        )
        g.add_argument("--kv-cache-memory", type=parse_bytes,
                       help="memory for the KV cache, e.g. 2GiB (cpu default: 2GiB; cuda: from --gpu-memory-utilization)")  # fmt: skip
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                       help="fraction of GPU memory for weights, activations and KV cache (default: 0.9)")  # fmt: skip
        g.add_argument("--num-gpu-blocks-override", type=int, help="use exactly this many KV blocks")
        g.add_argument(
            "--swap-space",
            type=float,
            default=4.0,
            help="GiB of CPU memory for swapped-out KV blocks (default: 4)",
        )
        g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"],
                       help="what happens to a preempted sequence's KV cache (default: recompute)")  # fmt: skip
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="reuse KV blocks of identical prompt prefixes across requests (default: on)")  # fmt: skip
        g.add_argument("--enforce-eager", action="store_true", help="cuda: do not capture CUDA graphs")
        g.add_argument(
            "--chat-template",
            help="Jinja chat template, or a file holding one (default: the model's)",
        )
        g.add_argument("--max-logprobs", type=int, default=20,
                       help="most logprobs (and prompt logprobs) one request may ask for (default: 20)")  # fmt: skip
        g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                       help="fcfs: first come, first served; priority: a request's 'priority' field orders the "
                            "queue (lower first; default: fcfs)")  # fmt: skip
        g.add_argument(
            "--seed",
            type=int,
            default=0,
            help="seed for requests that do not bring their own (default: 0)",
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        names = cls.field_names()
        return cls(**{k: v for k, v in vars(args).items() if k in names and v is not None})

    def replace(self, **kw: Any) -> EngineArgs:
        return dataclasses.replace(self, **kw)
