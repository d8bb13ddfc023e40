"""The whole forward pass on `--device sim` against `--device cpu`: the same
LlamaModel and batches, with every op but the GEMMs running our CUDA kernels.

The schedule mixes what the engine sends: whole prompts, a chunked prefill
over a cached prefix, a decode row next to a prefill chunk (prefill kernel),
and pure decode steps (decode kernel), over scattered block tables.
"""

import time

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.config import ModelConfig
from rawpage.forward_batch import ForwardBatch
from rawpage.models.llama import LlamaModel
from tests.gpu_required import skip_without_cuda
from tests.kernels.conftest import devices

BLOCK_SIZE, NUM_BLOCKS = 16, 24


def tiny_llama(seed=0, dim=64, layers=2, H=4, Hkv=2, D=16, inter=96, vocab=100):
    """A random Llama as Hugging Face-named float32 tensors, scaled to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    config = ModelConfig(
        architecture="llama",
        hidden_size=dim,
        num_layers=layers,
        num_heads=H,
        num_kv_heads=Hkv,
        head_dim=D,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=256,
    )

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab, dim), "model.norm.weight": norm()}
    t["lm_head.weight"] = w(vocab, dim)
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = w(H * D, dim)
        t[p + "self_attn.k_proj.weight"] = w(Hkv * D, dim)
        t[p + "self_attn.v_proj.weight"] = w(Hkv * D, dim)
        t[p + "self_attn.o_proj.weight"] = w(dim, H * D)
        t[p + "mlp.gate_proj.weight"] = w(inter, dim)
        t[p + "mlp.up_proj.weight"] = w(inter, dim)
        t[p + "mlp.down_proj.weight"] = w(dim, inter)
    return config, t


class Runner:
    """Feeds chunks of several sequences through one model, owning their blocks."""

    def __init__(self, model, seed=0):
        c, b = model.config, model.backend
        self.model, self.b = model, b
        shape = (NUM_BLOCKS, BLOCK_SIZE, c.num_kv_heads, c.head_dim)
        self.kv = [(b.zeros(shape), b.zeros(shape)) for _ in range(c.num_layers)]
        self.free = list(np.random.default_rng(seed).permutation(NUM_BLOCKS))
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, chunks: dict[int, list[int]]) -> np.ndarray:
        """chunks: sequence id -> new token ids. Returns the last token's logits per sequence."""
        ids, pos, slots, q_lens, seq_lens, tables = [], [], [], [], [], []
        for sid, toks in chunks.items():
            start = self.lens.get(sid, 0)
            table = self.tables.setdefault(sid, [])
            for p in range(start, start + len(toks)):
                if p % BLOCK_SIZE == 0:
                    table.append(int(self.free.pop()))
                slots.append(table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE)
            ids += toks
            pos += range(start, start + len(toks))
            self.lens[sid] = start + len(toks)
            q_lens.append(len(toks))
            seq_lens.append(self.lens[sid])
            tables.append(table)
        width = max(len(t) for t in tables)
        bt = np.zeros((len(tables), width), np.int32)
        for i, t in enumerate(tables):
            bt[i, : len(t)] = t
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        b = self.b
        batch = ForwardBatch(
            input_ids=b.asarray(np.array(ids, np.int32), np.int32),
            positions=b.asarray(np.array(pos, np.int32), np.int32),
            slot_mapping=b.asarray(np.array(slots, np.int32), np.int32),
            block_tables=b.asarray(bt, np.int32),
            seq_lens=b.asarray(np.array(seq_lens, np.int32), np.int32),
            query_start_loc=b.asarray(qsl, np.int32),
            logits_indices=b.asarray(qsl[1:] - 1, np.int32),
            host_query_lens=np.array(q_lens),
            host_seq_lens=np.array(seq_lens),
        )
        hidden = self.model.forward(batch, self.kv)
        return b.to_numpy(self.model.compute_logits(hidden)).astype(np.float32)


def schedule(rng, vocab):
    def toks(n):
        return [int(t) for t in rng.integers(0, vocab, n)]

    return [
        {0: toks(20), 1: toks(7)},  # a whole prompt, and the first chunk of another
        {0: toks(1), 1: toks(23), 2: toks(3)},  # decode beside a chunk over a cached prefix
        {0: toks(1), 1: toks(1), 2: toks(1)},  # pure decode
        {0: toks(1), 1: toks(1), 2: toks(1)},
    ]


# max |device - cpu| / max |cpu logit|, per dtype: the kernels' rounding through 2 layers
LOGIT_TOLERANCE = {"float32": 1e-5, "float16": 6e-3, "bfloat16": 4e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("device", devices())
def test_tiny_llama_logits_match_cpu(device, dtype):
    if device == "cuda":
        skip_without_cuda()
    config, tensors = tiny_llama()
    cpu = Runner(LlamaModel(config, get_backend("cpu", cpu_kernels="numpy"), tensors))
    dev = Runner(LlamaModel(config, get_backend(device, dtype), tensors))
    for i, chunks in enumerate(schedule(np.random.default_rng(1), config.vocab_size)):
        want, got = cpu.step(chunks), dev.step(chunks)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < LOGIT_TOLERANCE[dtype], f"step {i}: relative error {err:.2e}"
        if dtype == "float32":
            np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_sim_backend_round_trips_bfloat16():
    b = get_backend("sim", "bfloat16")
    x = np.array([1.0, -2.5, 3.140625, 1e-3], np.float32)
    dev = b.asarray(x)
    assert dev.dtype == np.uint16 and b.dtype == np.uint16
    np.testing.assert_allclose(b.to_numpy(dev), x, rtol=4e-3)
    np.testing.assert_array_equal(b.to_numpy(b.asarray(b.to_numpy(dev))), b.to_numpy(dev))


@pytest.mark.slow
def test_default_model_greedy_matches_cpu():
    """SmolLM2-135M (30 layers, 9 heads / 3 KV heads, head_dim 64): the same
    greedy tokens and near-identical logits on sim and cpu in float32."""
    from rawpage.loader import load_checkpoint

    try:
        ckpt = load_checkpoint()
    except Exception as e:  # the default model is an optional install
        pytest.skip(str(e))
    tensors = {name: ckpt.tensors[name] for name in ckpt.tensors}
    cpu = Runner(LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), tensors))
    sim = Runner(LlamaModel(ckpt.config, get_backend("sim"), tensors))
    prompt = ckpt.tokenizer.encode("The capital of France is")
    start = time.perf_counter()
    cpu_tokens, sim_tokens = [], []
    cpu_logits, sim_logits = cpu.step({0: prompt}), sim.step({0: prompt})
    for _ in range(4):
        np.testing.assert_allclose(sim_logits, cpu_logits, rtol=1e-3, atol=1e-3)
        cpu_tokens.append(int(cpu_logits[0].argmax()))
        sim_tokens.append(int(sim_logits[0].argmax()))
        cpu_logits, sim_logits = cpu.step({0: cpu_tokens[-1:]}), sim.step({0: sim_tokens[-1:]})
    assert sim_tokens == cpu_tokens
    print(f"5 steps of the default model on cpu and sim: {time.perf_counter() - start:.1f} s")
