"""End-to-end parity with transformers on real shapes: our forward pass and
LlamaForCausalLM, with the same random weights, on the same device.

    python -m tools.gpu_check.parity --config tools/configs/llama-3.2-1b/config.json --device cuda

For each dtype: build our model with dummy weights, hand exactly those weights
to LlamaForCausalLM, then run a few prompts of different lengths. Ours prefills
them as one batch over a scattered paged KV cache (the prefill kernel), then
decodes one more token for each (the decode kernel); transformers runs each
prompt plus that token in one plain forward. Reported per dtype and phase:
max |ours - hf|, that divided by max |hf| (the relative figure), and how often
the argmax agrees.
"""

from __future__ import annotations

import argparse

import numpy as np

from tools.gpu_check.common import hf_llama, hf_state_dict, write_json

# max |ours - hf| / max |hf| below which the check passes: float32 is a few ulps
# of accumulated rounding; bfloat16 keeps 8 bits, and 16 layers of them add up.
TOLERANCE = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}


def our_logits(model, prompts: list[list[int]], next_tokens: list[int], block_size: int = 16, seed: int = 0):
    """(prefill logits per prompt (L_i, V), decode logits (B, V)), float32 on the host."""
    from rawpage.dtypes import to_float32
    from rawpage.forward_batch import BatchBuffer, HostBatch

    c, b = model.config, model.backend
    lens = np.array([len(p) for p in prompts])
    blocks = -(-(lens + 1) // block_size)
    num_blocks = int(blocks.sum())
    shape = (num_blocks, block_size, c.num_kv_heads, c.head_dim)
    kv = [(b.zeros(shape), b.zeros(shape)) for _ in range(c.num_layers)]
    perm = np.random.default_rng(seed).permutation(num_blocks).astype(np.int32)
    tables = np.zeros((len(prompts), int(blocks.max())), np.int32)
    tables[np.repeat(np.arange(len(prompts)), blocks), np.concatenate([np.arange(n) for n in blocks])] = perm
    buffer = BatchBuffer(b)

    def step(tokens: list[list[int]], starts: np.ndarray) -> np.ndarray:
        q_lens = np.array([len(t) for t in tokens], np.int32)
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        seq = np.repeat(np.arange(len(tokens)), q_lens)
        pos = (np.arange(qsl[-1]) - qsl[:-1][seq] + starts[seq]).astype(np.int32)
        slots = (tables[seq, pos // block_size] * block_size + pos % block_size).astype(np.int32)
        hb = HostBatch(
            np.concatenate(tokens).astype(np.int32),
            pos,
            slots,
            (starts + q_lens).astype(np.int32),
            qsl,
            np.arange(qsl[-1], dtype=np.int32),
            tables,
        )
        logits = model.compute_logits(model.forward(buffer.upload(hb), kv))
        return np.asarray(b.to_numpy(to_float32(logits)), np.float32)

    prefill = step(prompts, np.zeros(len(prompts), np.int32))
    decode = step([[t] for t in next_tokens], lens.astype(np.int32))
    return np.split(prefill, np.cumsum(lens)[:-1]), decode


def hf_logits(hf, prompts: list[list[int]], next_tokens: list[int], device: str) -> list[np.ndarray]:
    """Per prompt: logits (L_i + 1, V) of prompt + next token, float32 on the host."""
    import torch

    out = []
    with torch.no_grad():
        for p, t in zip(prompts, next_tokens):
            ids = torch.tensor([p + [t]], device=device)
            out.append(hf(input_ids=ids).logits[0].float().cpu().numpy())
    return out


def compare(ours: list[np.ndarray], theirs: list[np.ndarray]) -> dict:
    a, b = np.concatenate(ours), np.concatenate(theirs)
    max_abs = float(np.abs(a - b).max())
    return {
        "max_abs": max_abs,
        "max_rel": max_abs / float(np.abs(b).max()),
        "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()),
        "rows": int(a.shape[0]),
    }


def rows_within(ours: list[np.ndarray], theirs: list[np.ndarray], tolerance: float) -> float:
    """The fraction of logit rows whose max |ours - theirs| is under tolerance x max |theirs|
    (the scale compare() divides by)."""
    a, b = np.concatenate(ours), np.concatenate(theirs)
    return float((np.abs(a - b).max(axis=1) < tolerance * np.abs(b).max()).mean())


# In 16 bits ours may be this much further from float32 than transformers' own run in
# that dtype: SLACK x its max rel, and ROWS_SLACK fewer rows within the tolerance.
SLACK, ROWS_SLACK = 1.25, 0.05


def against_float32(hf, prompts, nexts, device: str, dtype: str, prefill, decode) -> dict:
    """Our logits (our_logits' prefill and decode) against transformers' model `hf` in
    float32, the truth. In float32 every row must be within TOLERANCE. In a 16-bit dtype
    the yardstick is transformers' own run in that dtype (hf is cast to it here): two
    16-bit runs differ by their roundings, and a random-weight Phi-3 or Mixtral in
    bfloat16 is 0.14 or 1.06 max rel from its own float32 (transformers on the CPU), so
    ours passes when it is no further from float32 than theirs (SLACK, ROWS_SLACK)."""
    import torch

    def split(per_prompt: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return [r[:-1] for r in per_prompt], [np.stack([r[-1] for r in per_prompt])]

    truth = split(hf_logits(hf.float(), prompts, nexts, device))
    tol = TOLERANCE[dtype]
    r = {"dtype": dtype, "prefill": compare(prefill, truth[0]), "decode": compare([decode], truth[1])}
    r |= {"tolerance": tol, "rows_within": rows_within(prefill + [decode], truth[0] + truth[1], tol)}
    worst = max(r["prefill"]["max_rel"], r["decode"]["max_rel"])
    if dtype == "float32":
        r["ok"] = worst < tol and r["rows_within"] == 1.0
        return r
    theirs = split(hf_logits(hf.to(getattr(torch, dtype)), prompts, nexts, device))
    t_all, truth_all = theirs[0] + theirs[1], truth[0] + truth[1]
    r["theirs"] = {"max_rel": compare(t_all, truth_all)["max_rel"], "rows_within": rows_within(t_all, truth_all, tol)}
    r["ok"] = (
        worst <= max(tol, SLACK * r["theirs"]["max_rel"])
        and r["rows_within"] >= r["theirs"]["rows_within"] - ROWS_SLACK
    )
    return r


def verdict_text(r: dict) -> tuple[str, str]:
    """(figure, target) of an against_float32 result for summary.py's table."""
    fig = f"prefill rel {r['prefill']['max_rel']:.2e}, decode rel {r['decode']['max_rel']:.2e}; "
    fig += f"argmax agree {r['prefill']['argmax_agree']:.1%}; rows within {r['rows_within']:.1%}"
    if "theirs" not in r:
        return fig, f"rel < {r['tolerance']:g} vs float32, every row"
    t = r["theirs"]
    fig += f"; transformers {r['dtype']}: rel {t['max_rel']:.2e}, rows within {t['rows_within']:.1%}"
    return fig, f"no further from float32 than transformers {r['dtype']} (x{SLACK}, rows -{ROWS_SLACK:.0%})"


def run_dtype(args, dtype: str) -> dict:
    import torch

    from rawpage.backends import get_backend
    from rawpage.loader.dummy import DummyWeights, config_path, load_dummy_config
    from rawpage.models.llama import LlamaModel

    path = config_path(args.config)
    config = load_dummy_config(path)
    model = LlamaModel(config, get_backend(args.device, dtype), DummyWeights(args.seed))
    torch_device = "cuda" if args.device == "cuda" else "cpu"
    hf = hf_llama(path, getattr(torch, dtype), torch_device, hf_state_dict(model))
    rng = np.random.default_rng(args.seed)
    lens = [int(n) for n in args.prompt_lens.split(",")]
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in lens]
    nexts = rng.integers(0, config.vocab_size, len(prompts)).tolist()
    prefill, decode = our_logits(model, prompts, nexts)
    ref = hf_logits(hf, prompts, nexts, torch_device)
    result = {
        "prefill": compare(prefill, [r[:-1] for r in ref]),
        "decode": compare([decode], [np.stack([r[-1] for r in ref])]),
    }
    worst = max(result["prefill"]["max_rel"], result["decode"]["max_rel"])
    result["tolerance"] = TOLERANCE[dtype]
    result["ok"] = worst < TOLERANCE[dtype]
    del model, hf
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tools/configs/llama-3.2-1b/config.json", help="a config.json (dummy weights)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "sim", "cpu"])
    ap.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated (cpu: float32 only)")
    ap.add_argument("--prompt-lens", default="7,64,300,1000", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file")
    args = ap.parse_args(argv)
    result = {"config": args.config, "device": args.device}
    for dtype in args.dtypes.split(","):
        result[dtype] = run_dtype(args, dtype)
        _free_gpu_memory(args.device)
    write_json(args.result_file, {"parity": result})
    return result


def _free_gpu_memory(device: str) -> None:
    """Between dtypes: the next model should not find this one's arrays in the pools."""
    if device != "cuda":
        return
    import gc

    import cupy
    import torch

    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
