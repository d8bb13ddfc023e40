"""Quantized weights on the GPU (issue 18's targets), as small rows:

    python -m tools.gpu_check.quant --result-file out.json

- decode: the four Linear layers of one Llama-3-8B layer (qkv, o_proj, gate_up,
  down) at batch 1 with AWQ-shaped int4 weights (group 128, random bits) through
  the int4 GEMV, beside the same shapes in bfloat16 on cuBLAS and the int4
  roofline (weight + scale + zero bytes / copy bandwidth). Targets: <= 1.4x the
  roofline, >= 2.5x faster than bfloat16.
- prefill: the same shapes at batch 256 (dequantize to a scratch + cuBLAS) against
  bfloat16 cuBLAS alone. Target: >= 0.8x bfloat16's speed.
- crossover: the GEMV kernels (GGUF Q4_K integer MMVQ, int4) against their scratch +
  cuBLAS path at T = 1 .. 16 on a 4096 x 4096 weight: the first T where the scratch
  wins, to check GEMV_MAX_TOKENS (rawpage/ops/gemv.py) against.
- parity: Llama-3.2-1B shapes (scaled to --layers layers), every Linear packed by
  our AWQ packer and kept int4 on the device, against transformers in bfloat16
  with the dequantized weights. Target: max |ours - hf| / max |hf| <= 5e-2.

--tiny shrinks every shape (the CPU test runs the parity row on --device sim).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from tools.gpu_check.common import GB, write_json
from tools.gpu_check.parity import verdict_text

LINEARS_8B = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128
CROSSOVER_TOKENS = (1, 2, 4, 8, 16)


def int4_bytes(N: int, K: int, group: int = GROUP) -> int:
    """What an int4 GEMV must read: nibbles, and a float16 scale and zero per group."""
    return N * K // 2 + 2 * 2 * N * (K // group)


def crossover(gemv_ms: dict[int, float], scratch_ms: dict[int, float]) -> int | None:
    """The first T at which the scratch + cuBLAS path beats the GEMV; None if it never does."""
    for T in sorted(gemv_ms):
        if T in scratch_ms and scratch_ms[T] < gemv_ms[T]:
            return T
    return None


def random_int4(cupy, N: int, K: int) -> Any:
    """An int4 QuantizedWeight of random bits on the GPU (values do not matter for time)."""
    from rawpage.quantization.weight import QuantizedWeight

    words = cupy.random.randint(0, 1 << 16, (N, K // 4), dtype=cupy.int32).astype(cupy.uint16).view(cupy.uint32)
    scales = cupy.full((N, K // GROUP), 0.01, cupy.float16)
    zeros = cupy.full((N, K // GROUP), 8.0, cupy.float16)
    return QuantizedWeight("int4", (N, K), cupy.ascontiguousarray(words), scales=scales, zeros=zeros, group_size=GROUP)


def bench_linears(tokens: int) -> dict:
    """int4 (our kernels) and bfloat16 (cuBLAS) over the 8B layer's four Linears at `tokens`."""
    import cupy

    from rawpage.backends.cuda import CudaBackend
    from rawpage.dtypes import bf16_from_f32
    from tools.gpu_check.common import copy_bandwidth_gbs, median_ms_cupy

    b = CudaBackend("bfloat16")
    xs = {K: bf16_from_f32(cupy.random.standard_normal((tokens, K), dtype=cupy.float32)) for K in (4096, 14336)}
    q = {k: random_int4(cupy, *s) for k, s in LINEARS_8B.items()}
    dense = {k: bf16_from_f32(cupy.random.standard_normal(s, dtype=cupy.float32) * 0.01) for k, s in LINEARS_8B.items()}

    def run(weights):
        return lambda i: [b.linear(xs[w.shape[1]], w) for w in weights.values()]

    int4_ms, bf16_ms = median_ms_cupy(run(q), 30), median_ms_cupy(run(dense), 30)
    result = {"tokens": tokens, "int4_ms": int4_ms, "bf16_ms": bf16_ms, "bf16_over_int4": bf16_ms / int4_ms}
    if tokens == 1:
        bw = copy_bandwidth_gbs()
        roofline = sum(int4_bytes(*s) for s in LINEARS_8B.values()) / (bw * GB) * 1e3
        result |= {"roofline_ms": roofline, "over_roofline": int4_ms / roofline, "copy_gbs": bw}
        result["ok"] = result["over_roofline"] <= 1.4 and result["bf16_over_int4"] >= 2.5
    else:
        result["ok"] = result["bf16_over_int4"] >= 0.8
    return result


def bench_crossover() -> dict:
    """GEMV vs scratch + cuBLAS on one 4096 x 4096 weight, GGUF Q4_K (integer MMVQ) and int4."""
    import cupy

    from rawpage.backends.cuda import CudaBackend
    from rawpage.dtypes import bf16_from_f32
    from rawpage.ops.gguf_linear import launch_gguf_dequantize
    from rawpage.ops.gguf_mmvq import launch_gguf_mmvq
    from rawpage.ops.int4_linear import launch_int4_dequantize, launch_int4_gemv
    from tools.gpu_check.common import median_ms_cupy

    b, N, K = CudaBackend("bfloat16"), 4096, 4096
    blocks = np.random.default_rng(0).integers(0, 256, (N, K // 256, 144), dtype=np.uint8)
    blocks[:, :, 0:4] = np.frombuffer(np.float16([0.01, 0.001]).tobytes(), np.uint8)  # d, dmin: small, finite
    q4k = cupy.asarray(blocks.reshape(N, -1))
    w4 = random_int4(cupy, N, K)
    paths = {  # format -> (its GEMV, dequantize to a scratch + cuBLAS)
        "gguf_q4_k": (
            lambda x: launch_gguf_mmvq(cupy, b.loader, x, q4k, "Q4_K", (N, K)),
            lambda x: b.matmul(x, launch_gguf_dequantize(cupy, b.loader, q4k, "Q4_K", (N, K), x.dtype)),
        ),
        "int4": (
            lambda x: launch_int4_gemv(cupy, b.loader, x, w4),
            lambda x: b.matmul(x, launch_int4_dequantize(cupy, b.loader, w4, x.dtype)),
        ),
    }
    out: dict[str, Any] = {}
    for name, (gemv, scratch) in paths.items():
        g, s = {}, {}
        for T in CROSSOVER_TOKENS:
            x = bf16_from_f32(cupy.random.standard_normal((T, K), dtype=cupy.float32))
            if T <= 8:  # the GEMV kernels hold at most GEMV_MAX_TOKENS = 8 tokens
                g[T] = median_ms_cupy(lambda i, x=x, f=gemv: f(x), 30)
            s[T] = median_ms_cupy(lambda i, x=x, f=scratch: f(x), 30)
        out[name] = {"gemv_ms": g, "scratch_ms": s, "crossover_tokens": crossover(g, s)}
    return out


def parity_config(layers: int, tiny: bool) -> dict:
    with open("tools/configs/llama-3.2-1b/config.json") as f:
        cfg = json.load(f) | {"num_hidden_layers": layers}
    if tiny:
        cfg |= {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}
        cfg |= {"head_dim": 32, "vocab_size": 512}
    return cfg


def packed_llama(cfg: dict, seed: int = 0) -> tuple[dict, dict]:
    """Random weights (N(0, 0.02), norms 1) with every Linear packed by our AWQ packer:
    ({name: dense float32, Linears dequantized}, {Linear name: int4 QuantizedWeight})."""
    from rawpage.loader.quantized_checkpoint import awq_to_int4
    from rawpage.quantization.weight import dequantize
    from tools.int4_pack import pack_awq

    rng = np.random.default_rng(seed)
    dim, inter, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D
    dense = {"model.embed_tokens.weight": rng.standard_normal((cfg["vocab_size"], dim), np.float32) * 0.02}
    dense["model.norm.weight"] = np.ones(dim, np.float32)
    packed = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        dense[p + "input_layernorm.weight"] = np.ones(dim, np.float32)
        dense[p + "post_attention_layernorm.weight"] = np.ones(dim, np.float32)
        shapes = {"self_attn.q_proj": (q, dim), "self_attn.k_proj": (kv, dim), "self_attn.v_proj": (kv, dim)}
        shapes |= {"self_attn.o_proj": (dim, q), "mlp.gate_proj": (inter, dim), "mlp.up_proj": (inter, dim)}
        shapes |= {"mlp.down_proj": (dim, inter)}
        for name, shape in shapes.items():
            t = pack_awq(rng.standard_normal(shape, np.float32) * 0.02, GROUP)
            w = awq_to_int4(t["qweight"], t["qzeros"], t["scales"])
            packed[p + name + ".weight"] = w
            dense[p + name + ".weight"] = dequantize(w)
    return dense, packed


def run_parity(device: str, layers: int, tiny: bool, prompt_lens: list[int]) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rawpage.backends import get_backend
    from rawpage.config import ModelConfig
    from rawpage.loader.tensors import TensorSource
    from rawpage.models.llama import LlamaModel
    from rawpage.quantization.weight import QuantizedWeight
    from tools.gpu_check.parity import against_float32, our_logits

    cfg = parity_config(layers, tiny)
    dense, packed = packed_llama(cfg)
    tensors = TensorSource(
        {k: (lambda v=v: v) for k, v in dense.items()}, {k: (lambda w=w: w) for k, w in packed.items()}
    )
    dtype = "bfloat16" if device == "cuda" else "float32"
    ours = LlamaModel(ModelConfig.from_hf(cfg), get_backend(device, dtype), tensors)
    assert isinstance(ours.layers[0].gate_up, QuantizedWeight), "the int4 weights must stay packed on the device"
    torch_device = "cuda" if device == "cuda" else "cpu"
    with torch.device(torch_device):
        hf = LlamaForCausalLM(LlamaConfig.from_dict(cfg)).float().eval()
    missing, unexpected = hf.load_state_dict({k: torch.from_numpy(v) for k, v in dense.items()}, strict=False)
    if set(missing) - {"lm_head.weight"} or unexpected:  # (the LM head is the tied embedding)
        raise RuntimeError(f"transformers' weights: missing {missing}, unexpected {unexpected}")
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg["vocab_size"], n).tolist() for n in prompt_lens]
    nexts = rng.integers(0, cfg["vocab_size"], len(prompts)).tolist()
    prefill, decode = our_logits(ours, prompts, nexts)
    return {"layers": layers} | against_float32(hf, prompts, nexts, torch_device, dtype, prefill, decode)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="decode,prefill,crossover,parity", help="comma-separated subset")
    ap.add_argument("--device", default="cuda", choices=["cuda", "sim", "cpu"], help="for the parity row")
    ap.add_argument("--layers", type=int, default=2, help="layers of the 1B parity model")
    ap.add_argument("--tiny", action="store_true", help="small parity shapes (a CPU run of the same code)")
    ap.add_argument("--prompt-lens", default="7,64,300")
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    lens = [int(n) for n in args.prompt_lens.split(",")]
    steps = {
        "parity": lambda: run_parity(args.device, args.layers, args.tiny, lens),
        "decode": lambda: bench_linears(1),
        "prefill": lambda: bench_linears(256),
        "crossover": bench_crossover,
    }
    result = {}
    for part in args.parts.split(","):
        if part not in steps:
            ap.error(f"unknown part {part!r}; choose from {', '.join(steps)}")
        try:
            result[part] = steps[part]()
        except Exception as e:  # one row's failure must not hide the others
            result[part] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        write_json(args.result_file, {"quant": result})  # after each: a timeout keeps the rows so far
    return result


if __name__ == "__main__":
    main()


def summary_rows(result: dict | None) -> list[tuple[str, str, str, str]]:
    """(check, figure, target, verdict) rows for summary.py's table."""
    r = result or {}

    def verdict(part: dict) -> str:
        return "ok" if part.get("ok") else "MISS"

    out = []
    p = r.get("parity")
    name = "int4 (our AWQ packer) logits vs the dequantized weights in transformers float32, 1B shape"
    if p and "error" not in p:
        fig, target = verdict_text(p)
        out.append((name, f"{p['layers']} layers: {fig}", target, verdict(p)))
    else:
        out.append((name, f"failed: {p['error'][:200]}" if p else "not measured", "", "MISS" if p else "—"))
    d = r.get("decode")
    name = "int4 decode B=1, one 8B layer's Linears"
    if d and "error" not in d:
        fig = f"{d['int4_ms']:.3f} ms; roofline {d['roofline_ms']:.3f} ms = {d['over_roofline']:.2f}x; "
        fig += f"bf16 cuBLAS {d['bf16_ms']:.3f} ms ({d['bf16_over_int4']:.1f}x slower)"
        out.append((name, fig, "<= 1.4x roofline, >= 2.5x bf16", verdict(d)))
    else:
        out.append((name, f"failed: {d['error'][:200]}" if d else "not measured", "", "—"))
    g = r.get("prefill")
    name = "int4 GEMM B=256 (scratch + cuBLAS), one 8B layer"
    if g and "error" not in g:
        fig = f"{g['int4_ms']:.3f} ms vs bf16 cuBLAS {g['bf16_ms']:.3f} ms ({g['bf16_over_int4']:.2f}x)"
        out.append((name, fig, ">= 0.8x bf16", verdict(g)))
    else:
        out.append((name, f"failed: {g['error'][:200]}" if g else "not measured", "", "—"))
    for fmt, c in (r.get("crossover") or {}).items():
        if not isinstance(c, dict) or "gemv_ms" not in c:
            continue
        times = ", ".join(f"T={t}: {c['gemv_ms'].get(t, float('nan')):.3f}/{s:.3f}" for t, s in c["scratch_ms"].items())
        out.append(
            (
                f"{fmt} GEMV vs scratch+cuBLAS crossover, 4096x4096",
                f"first T where scratch wins: {c['crossover_tokens']} (ms GEMV/scratch {times})",
                "record",
                "",
            )
        )
    return out


def failed(result: dict | None) -> list[str]:
    p = (result or {}).get("parity")
    return ["int4 logit parity"] if p is not None and not p.get("ok") else []
