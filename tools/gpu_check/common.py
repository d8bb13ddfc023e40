"""What the GPU check's steps share: timing with CUDA events, result files, and
our model's weights as a Hugging Face state dict.

Every import of CuPy or torch is inside a function, so that `--help` (and the
CI test that runs it) works on a machine that has neither.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from typing import Any

GB = 1e9


def median_ms_cupy(fn: Callable[[int], Any], iters: int = 50, warmup: int = 5) -> float:
    """Median over `iters` runs of fn(i), each timed by a pair of CUDA events on the
    current CuPy stream; fn(i) picks rotating buffer set i so that a small working
    set is not served from L2 across runs."""
    import cupy

    for i in range(warmup):
        fn(i)
    times = []
    for i in range(iters):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def median_ms_torch(fn: Callable[[int], Any], iters: int = 50, warmup: int = 5) -> float:
    """median_ms_cupy for torch work, with torch's events on torch's current stream."""
    import torch

    for i in range(warmup):
        fn(i)
    times = []
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written
    (2 x nbytes per copy), the way the attention and norm figures count theirs."""
    import cupy

    src = [cupy.ones(nbytes // 4, cupy.float32) for _ in range(2)]
    dst = [cupy.empty_like(s) for s in src]

    def copy(i: int) -> None:
        dst[i % 2].data.copy_from_device_async(src[i % 2].data, nbytes)

    ms = median_ms_cupy(copy, iters)
    return 2 * nbytes / (ms * 1e-3) / GB


def write_json(path: str | None, result: dict) -> None:
    print(json.dumps(result, indent=1))
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def to_torch(x: Any) -> Any:
    """A NumPy or CuPy array as a torch tensor on the same device. uint16 arrays are
    bfloat16 bits: they cross as float32 (exact) and come out as torch.bfloat16, so
    that nothing depends on DLPack's support for unsigned 16-bit integers."""
    import numpy as np
    import torch

    from rawpage.dtypes import BFLOAT16, to_float32

    bf16 = x.dtype == BFLOAT16
    x = to_float32(x) if bf16 else x
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else torch.from_dlpack(x)
    return t.to(torch.bfloat16) if bf16 else t


def hf_state_dict(model) -> dict[str, Any]:
    """Our LlamaModel's weights under Hugging Face names, as torch tensors: the fused
    qkv and gate_up weights split back into their projections."""
    c = model.config
    q, kv, inter = c.q_size, c.kv_size, c.intermediate_size

    def linear(w: Any, out_features: int) -> Any:
        """A Linear weight as HF stores it, (out, in), as every backend keeps it."""
        t = to_torch(w)
        assert t.shape[0] == out_features, (t.shape, out_features)
        return t

    sd = {"model.embed_tokens.weight": to_torch(model.embed), "model.norm.weight": to_torch(model.norm)}
    sd["lm_head.weight"] = linear(model.lm_head, c.vocab_size)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv = linear(layer.qkv, q + 2 * kv)
        sd[p + "self_attn.q_proj.weight"] = qkv[:q]
        sd[p + "self_attn.k_proj.weight"] = qkv[q : q + kv]
        sd[p + "self_attn.v_proj.weight"] = qkv[q + kv :]
        if layer.qkv_bias is not None:
            bias = to_torch(layer.qkv_bias)
            for name, part in zip("qkv", (bias[:q], bias[q : q + kv], bias[q + kv :])):
                sd[p + f"self_attn.{name}_proj.bias"] = part
        sd[p + "self_attn.o_proj.weight"] = linear(layer.o_proj, c.hidden_size)
        gate_up = linear(layer.gate_up, 2 * inter)
        sd[p + "mlp.gate_proj.weight"] = gate_up[:inter]
        sd[p + "mlp.up_proj.weight"] = gate_up[inter:]
        sd[p + "mlp.down_proj.weight"] = linear(layer.down, c.hidden_size)
        sd[p + "input_layernorm.weight"] = to_torch(layer.input_norm)
        sd[p + "post_attention_layernorm.weight"] = to_torch(layer.pre_ffn_norm)
    return sd


def hf_llama(config_path: str, torch_dtype: Any, device: str, state_dict: dict | None = None):
    """transformers' LlamaForCausalLM of the config's shapes on `device`: random
    (transformers' own init) or, given a state dict, exactly those weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    with open(config_path) as f:
        cfg = LlamaConfig.from_dict(json.load(f))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # build in the target dtype: no float32 copy of an 8B model
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(default)
    if state_dict is not None:
        model.load_state_dict({k: v.to(device=device, dtype=torch_dtype) for k, v in state_dict.items()})
    return model.eval()
