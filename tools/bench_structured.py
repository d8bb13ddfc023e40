"""What a JSON schema costs: offline throughput with and without structured outputs.

    python tools/bench_structured.py [--batch 1 32] [--tokens 64] [--repeats 3] [--model PATH]

Same prompts, same number of generated tokens (ignore_eos, and a schema that cannot
finish within --tokens: an array of at least 1000 objects), so the only difference is
the grammar: the masks computed during the forward pass, applied in the sampler, and
the matcher advanced per token. Runs alternate (plain, schema, plain, schema, ...) and
each side keeps its best, which cancels most of a shared machine's noise.

Also times the mask work alone per token (compute + apply to a (1, V) row), which is
the overhead a batch-1 step cannot hide.
"""

from __future__ import annotations

import rawpage  # noqa: F401  (first: it sets how long OpenBLAS spins before NumPy loads it)

# isort: split
import argparse
import functools
import time

import numpy as np

SCHEMA = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["name", "age", "role", "tags"],
        "additionalProperties": False,
    },
}


def run(llm, batch: int, tokens: int, schema: bool) -> float:
    """Output tokens per second for `batch` chat prompts of `tokens` tokens each."""
    from rawpage import SamplingParams, StructuredOutputsParams

    prompts = [[{"role": "user", "content": f"List {i + 3} people as JSON."}] for i in range(batch)]
    params = SamplingParams(
        temperature=1.0,
        seed=0,
        max_tokens=tokens,
        ignore_eos=True,
        structured_outputs=StructuredOutputsParams(json=SCHEMA) if schema else None,
    )
    t0 = time.perf_counter()
    outs = llm.chat(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def mask_cost(llm, tokens: int) -> float:
    """Milliseconds per token of mask compute + apply, along one constrained output."""
    from rawpage import SamplingParams, StructuredOutputsParams
    from rawpage.structured_output import apply_masks

    eng = llm.engine
    (out,) = llm.chat(
        [{"role": "user", "content": "People as JSON."}],
        SamplingParams(
            temperature=1.0, seed=1, max_tokens=tokens, ignore_eos=True, structured_outputs={"json": SCHEMA}
        ),
        use_tqdm=False,
    )
    state = eng.grammars.new_state(
        StructuredOutputsParams(json=SCHEMA), functools.partial(eng.tokenizer.encode, add_special_tokens=False)
    )
    seq = type("Seq", (), {"grammar": state})()
    logits = np.zeros((1, eng.model_config.vocab_size), dtype=np.float32)
    t = 0.0
    for tok in out.outputs[0].token_ids:
        t0 = time.perf_counter()
        apply_masks(logits, [seq], None)
        t += time.perf_counter() - t0
        state.accept(tok)
    return 1000 * t / len(out.outputs[0].token_ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", help="default: the embedded SmolLM2-135M-Instruct")
    a = ap.parse_args()
    from rawpage import LLM  # here, so that --help works without the package's dependencies

    llm = LLM(a.model, log_stats_interval=0)
    run(llm, 2, 8, True)  # warm-up: the llguidance tokenizer, first compilations
    print(f"mask compute + apply: {mask_cost(llm, a.tokens):.3f} ms per token (batch 1, one row)")
    print("| batch | plain tok/s | JSON schema tok/s | change |")
    print("|---|---|---|---|")
    for b in a.batch:
        plain, constrained = 0.0, 0.0
        for _ in range(a.repeats):
            plain = max(plain, run(llm, b, a.tokens, False))
            constrained = max(constrained, run(llm, b, a.tokens, True))
        print(f"| {b} | {plain:.1f} | {constrained:.1f} | {100 * (constrained / plain - 1):+.1f}% |")


if __name__ == "__main__":
    main()
