"""Tensor parallelism (issue 22): shard shapes, logits of P in-process ranks against one
rank (every family: issue 32), greedy tokens of the spawned-worker engine against
--tensor-parallel-size 1, and a worker that dies mid-step."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import signal
import subprocess
import sys
import threading
import types
from multiprocessing import Pipe

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.config import ModelConfig
from rawpage.distributed.communicator import PipeCommunicator
from rawpage.dtypes import bf16_from_f32
from rawpage.errors import UnsupportedModelError, WorkerDiedError
from rawpage.loader import load_checkpoint
from rawpage.loader.dummy import DummyWeights
from rawpage.models import decoder
from rawpage.models.llama import LlamaModel
from rawpage.models.registry import build_model
from rawpage.models.sharding import ShardLayout, TensorParallel, check_shardable
from rawpage.ops import gguf_linear
from rawpage.quantization.fp8 import quantize_fp8
from rawpage.quantization.int4 import pack_nibbles
from rawpage.quantization.weight import QuantizedWeight, dequantize
from tests.kernels.test_gguf_model_sim import packed_weight, quantized_tiny_llama
from tests.model_harness import SingleSequence, image_rows
from tests.test_families import DATA
from tests.tiny_families import FAMILIES, write_family
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder

PROMPTS = ["The quick brown fox", "Hello world! Numbers 0123", "café, naïve", "def f(x):\n\t"]


def gqa_config(**kw) -> ModelConfig:
    base = dict(
        architecture="llama",
        hidden_size=64,
        num_layers=1,
        num_heads=8,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=96,
        vocab_size=401,
    )
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("size", [2, 4, 8])
def test_shard_shapes_with_fewer_kv_heads_than_ranks(size):
    c = gqa_config()  # H = 8, Hkv = 2: at P = 4 and 8 each KV head is replicated
    rng = np.random.default_rng(0)
    full = {
        "q_proj.weight": rng.standard_normal((c.q_size, c.hidden_size)),
        "k_proj.weight": rng.standard_normal((c.kv_size, c.hidden_size)),
        "o_proj.weight": rng.standard_normal((c.hidden_size, c.q_size)),
        "down_proj.weight": rng.standard_normal((c.hidden_size, c.intermediate_size)),
        "model.embed_tokens.weight": rng.standard_normal((c.vocab_size, c.hidden_size)),
    }
    layouts = [ShardLayout(c, r, size) for r in range(size)]
    shards = {name: [lay.shard(name, t) for lay in layouts] for name, t in full.items()}
    H, Hkv, D = c.num_heads // size, max(c.num_kv_heads // size, 1), c.head_dim
    assert all(s.shape == (H * D, 64) for s in shards["q_proj.weight"])
    assert all(s.shape == (Hkv * D, 64) for s in shards["k_proj.weight"])
    assert all(lay.local_config().num_kv_heads == Hkv for lay in layouts)
    # column/row-parallel slices put the whole tensor back together, in rank order
    np.testing.assert_array_equal(np.concatenate(shards["q_proj.weight"]), full["q_proj.weight"])
    np.testing.assert_array_equal(np.concatenate(shards["o_proj.weight"], axis=1), full["o_proj.weight"])
    np.testing.assert_array_equal(np.concatenate(shards["down_proj.weight"], axis=1), full["down_proj.weight"])
    vocab = np.concatenate(shards["model.embed_tokens.weight"])  # padded to P * ceil(V / P) rows
    np.testing.assert_array_equal(vocab[: c.vocab_size], full["model.embed_tokens.weight"])
    assert not vocab[c.vocab_size :].any()
    # each rank's query heads all belong to the one KV head it holds
    group = c.num_heads // c.num_kv_heads
    for lay in layouts:
        q_heads = range(lay.rank * H, (lay.rank + 1) * H)
        assert {h // group for h in q_heads} == set(range(lay.kv_head_start, lay.kv_head_start + Hkv))
        kv = full["k_proj.weight"][lay.kv_head_start * D : (lay.kv_head_start + Hkv) * D]
        np.testing.assert_array_equal(shards["k_proj.weight"][lay.rank], kv)


def test_unshardable_models_are_refused_with_the_reason():
    with pytest.raises(UnsupportedModelError, match="num_heads=9 is not a multiple"):
        check_shardable(gqa_config(num_heads=9, num_kv_heads=3), 2)
    with pytest.raises(UnsupportedModelError, match="num_kv_heads=3 neither divides"):
        check_shardable(gqa_config(num_heads=12, num_kv_heads=3), 2)
    with pytest.raises(UnsupportedModelError, match="moe_intermediate_size=36 is not a multiple"):
        check_shardable(gqa_config(architecture="qwen3_moe", num_experts=4, moe_intermediate_size=36), 8)
    check_shardable(gqa_config(num_heads=8, num_kv_heads=1), 8)
    check_shardable(gqa_config(architecture="gemma2"), 2)  # every family shards


def test_fused_and_expert_tensors_split_as_their_parts():
    """Phi-3's qkv_proj is [q | k | v] and gate_up_proj [gate | up]: a rank's slice is its
    slice of each part, fused back in that order (not the first rows of the whole). An
    expert's projections split like a dense MLP's, at moe_intermediate_size."""
    c = gqa_config(num_experts=4, moe_intermediate_size=32)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, c.hidden_size)) for n in (c.q_size, c.kv_size, c.kv_size))
    gate, up = rng.standard_normal((2, c.intermediate_size, c.hidden_size))
    w1, w2 = rng.standard_normal((32, c.hidden_size)), rng.standard_normal((c.hidden_size, 32))
    router = rng.standard_normal((4, c.hidden_size))
    for size in (2, 4, 8):  # at 4 and 8 the KV heads are replicated
        for lay in (ShardLayout(c, r, size) for r in range(size)):
            qkv = lay.shard("self_attn.qkv_proj.weight", np.concatenate([q, k, v]))
            parts = [lay.shard(f"self_attn.{n}_proj.weight", w) for n, w in zip("qkv", (q, k, v))]
            np.testing.assert_array_equal(qkv, np.concatenate(parts))
            gate_up = lay.shard("mlp.gate_up_proj.weight", np.concatenate([gate, up]))
            want = [lay.shard("mlp.gate_proj.weight", gate), lay.shard("mlp.up_proj.weight", up)]
            np.testing.assert_array_equal(gate_up, np.concatenate(want))
            lo, hi = lay.rank * 32 // size, (lay.rank + 1) * 32 // size
            np.testing.assert_array_equal(lay.shard("block_sparse_moe.experts.3.w1.weight", w1), w1[lo:hi])
            np.testing.assert_array_equal(lay.shard("mlp.experts.0.down_proj.weight", w2), w2[:, lo:hi])
            assert lay.shard("mlp.gate.weight", router) is router  # replicated


def test_exact_layout_cuts_o_proj_and_down_by_output_rows():
    """The CPU's layout: o_proj and a dense down are whole rows [r dim/P, (r+1) dim/P) of
    every input, and a rank's model asks for them at its local shape (out, K/P), which
    held_shape turns into the (out/P, K) it holds; an expert's down stays row-parallel."""
    c = gqa_config(num_experts=4, moe_intermediate_size=32)
    rng = np.random.default_rng(0)
    o, down = rng.standard_normal((c.hidden_size, c.q_size)), rng.standard_normal((64, c.intermediate_size))
    expert_down = rng.standard_normal((64, 32))
    assert ShardLayout.on("cpu", c, 0, 2).exact and not ShardLayout.on("cuda", c, 0, 2).exact
    for size in (2, 4, 8):
        layouts = [ShardLayout(c, r, size, exact=True) for r in range(size)]
        cuts = [lay.shard("model.layers.0.self_attn.o_proj.weight", o) for lay in layouts]
        np.testing.assert_array_equal(np.concatenate(cuts), o)
        cuts = [lay.shard("model.layers.0.mlp.down_proj.weight", down) for lay in layouts]
        np.testing.assert_array_equal(np.concatenate(cuts), down)
        lay = layouts[1]
        assert lay.held_shape("model.layers.0.mlp.down_proj.weight", (64, 96 // size)) == (64 // size, 96)
        assert lay.held_shape("model.layers.0.mlp.gate_proj.weight", (96 // size, 64)) == (96 // size, 64)
        lo = 32 // size  # rank 1's columns of each expert's FFN
        expert = lay.shard("model.layers.0.mlp.experts.2.down_proj.weight", expert_down)
        np.testing.assert_array_equal(expert, expert_down[:, lo : 2 * lo])
    with pytest.raises(UnsupportedModelError, match="hidden_size=100 is not a multiple"):
        check_shardable(gqa_config(hidden_size=100), 8, exact=True)
    check_shardable(gqa_config(hidden_size=100), 8)  # Megatron's layout does not cut dim


def test_tensor_parallelism_is_applied_from_outside_the_model(tiny_model_dir):
    """Issue 41: models/decoder.py names no collective and no rank; a model in one process
    runs the class's own methods; a rank's model has four of them wrapped, and its config
    the whole vocabulary (its logits' width) with its own heads."""
    names = set()
    for node in ast.walk(ast.parse(inspect.getsource(decoder))):
        names |= {node.id} if isinstance(node, ast.Name) else {node.attr} if isinstance(node, ast.Attribute) else set()
    assert not names & {"tp", "comm", "layout", "all_reduce", "all_gather", "gather", "rank"}, names
    ckpt, b = load_checkpoint(tiny_model_dir), get_backend("cpu")
    wrapped = {"embed_tokens", "project_out", "experts", "compute_logits"}
    one = build_model(ckpt.config, b, ckpt.tensors)
    assert not set(vars(one)) & (wrapped | {"tp"})
    rank = build_model(ckpt.config, b, ckpt.tensors, TensorParallel(ShardLayout(ckpt.config, 1, 2), None))
    assert wrapped | {"tp"} <= set(vars(rank))
    assert rank.config.vocab_size == ckpt.config.vocab_size and rank.embed.shape[0] == ckpt.config.vocab_size // 2
    assert rank.config.num_heads * 2 == ckpt.config.num_heads


def test_dummy_weights_are_drawn_at_the_shapes_a_rank_holds():
    """--load-format dummy under tensor parallelism: nothing to cut, each weight drawn at
    the rank's shape (in the exact layout, o_proj and down by output rows)."""
    c = gqa_config()
    for exact in (False, True):
        tp = TensorParallel(ShardLayout(c, 0, 2, exact=exact), None)
        layer = build_model(c, get_backend("cpu", cpu_kernels="numpy"), DummyWeights(), tp).layers[0]
        assert layer.qkv.shape == ((4 + 2 * 1) * 8, 64)
        assert layer.o_proj.shape == ((32, 64) if exact else (64, 32))
        assert layer.down.shape == ((32, 96) if exact else (64, 48))


def packed_weights(rng: np.random.Generator, N: int, K: int) -> dict[str, QuantizedWeight]:
    """One weight (N, K) of each packed kind: GGUF blocks of 32 and of 256, bf16, fp8, int4."""
    out = {q: packed_weight(rng, q, N, K) for q in ("Q4_1", "Q8_0", "Q4_K")}
    dense = rng.standard_normal((N, K)).astype(np.float32)
    out["bf16"] = QuantizedWeight("bf16", (N, K), bf16_from_f32(dense))
    bits, scales = quantize_fp8(dense)
    out["fp8"] = QuantizedWeight("fp8", (N, K), bits, scales=scales)
    G = 64
    nibbles = pack_nibbles(rng.integers(0, 16, (N, K)), axis=1)
    scales16, zeros16 = rng.random((N, K // G)).astype(np.float16), rng.integers(0, 16, (N, K // G)).astype(np.float16)
    out["int4"] = QuantizedWeight("int4", (N, K), nibbles, scales=scales16, zeros=zeros16, group_size=G)
    return out


def test_packed_weights_cut_as_their_dense_weights_do():
    """A rank's rows (column-parallel) and block-aligned columns (row-parallel) of every
    packed kind dequantize to the same cut of the dense weight; a cut inside a GGUF block
    or an int4 group, or of act-order int4, is refused (that weight then loads dense)."""
    rng = np.random.default_rng(0)
    for kind, w in packed_weights(rng, 48, 512).items():
        dense = dequantize(w)
        np.testing.assert_array_equal(dequantize(w.rows(16, 40)), dense[16:40], err_msg=kind)
        assert w.rows(16, 40).shape == (24, 512)
        cut = w.columns(256, 512)
        np.testing.assert_array_equal(dequantize(cut), dense[:, 256:512], err_msg=kind)
        assert cut.shape == (48, 256) and cut.nbytes < w.nbytes
        aligned = {"Q4_1": 32, "Q8_0": 32, "Q4_K": 256, "int4": 64, "fp8": 16, "bf16": 1}[kind]
        if aligned > 1:
            assert w.columns(aligned // 2, 256) is None, kind  # the cut would split a block or group
        else:  # bf16: any cut keeps whole weights
            np.testing.assert_array_equal(dequantize(w.columns(3, 250)), dense[:, 3:250])
    int4 = packed_weights(rng, 8, 512)["int4"]
    assert dataclasses.replace(int4, perm=np.arange(512, dtype=np.int32)).columns(0, 256) is None  # act-order


def shard_logits(ckpt, size: int, prompt: list[int], steps: int, b=None, mm=None) -> list[np.ndarray]:
    """Rank 0's logits (prefill, then greedy decode) of a model split over `size` ranks
    that run in threads of this process, joined by PipeCommunicator's pipes, on backend b
    (the CPU's by default); mm: the prompt's image rows, which every rank's prefill takes."""
    pipes = [Pipe() for _ in range(size - 1)]
    comms = [PipeCommunicator(0, size, [a for a, _ in pipes])]
    comms += [PipeCommunicator(r, size, [pipes[r - 1][1]]) for r in range(1, size)]
    b = b or get_backend("cpu")
    layouts = [ShardLayout.on(b.name, ckpt.config, r, size) for r in range(size)]
    models = [build_model(ckpt.config, b, ckpt.tensors, TensorParallel(layouts[r], comms[r])) for r in range(size)]
    out: list[np.ndarray] = []
    tokens = [prompt] + [None] * steps

    def rank(r: int) -> None:
        seq = SingleSequence(models[r])
        for i in range(steps + 1):
            ids = tokens[i]
            if r == 0:
                logits = seq.feed(ids, all_logits=True, mm=mm if i == 0 else None)
                out.append(logits)
            else:
                while tokens[i] is None:  # rank 0 picks the next token
                    threading.Event().wait(0.001)
                seq.feed(tokens[i], all_logits=True, mm=mm if i == 0 else None)
                continue
            if i < steps:
                tokens[i + 1] = [int(logits[-1].argmax())]

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return out


def reference_logits(model, prompt: list[int], steps: int, mm=None) -> list[np.ndarray]:
    seq = SingleSequence(model)
    out = [seq.feed(prompt, all_logits=True, mm=mm)]
    for _ in range(steps):
        out.append(seq.feed([int(out[-1][-1].argmax())], all_logits=True))
    return out


@pytest.mark.parametrize("size", [2, 4])
def test_float32_logits_match_one_rank(tiny_model_dir, size):
    ckpt = load_checkpoint(tiny_model_dir)
    prompt = ckpt.tokenizer.encode(PROMPTS[0])
    one_rank = LlamaModel(ckpt.config, get_backend("cpu"), ckpt.tensors)
    for got, want in zip(shard_logits(ckpt, size, prompt, 4), reference_logits(one_rank, prompt, 4), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def family_folders(tmp_path_factory):
    tok, d = train_tokenizer(), tmp_path_factory.mktemp("tp-families")
    folders = {f: write_family(str(d / f), f, tok=tok) for f in FAMILIES}
    qwen2 = tiny_config("qwen2", attention_bias=True)  # q/k/v bias, sliced with its heads
    folders["qwen2"] = write_hf_folder(str(d / "qwen2"), qwen2, random_tensors(qwen2), tok)
    return folders


@pytest.mark.parametrize(
    "family,size", [(f, 2) for f in ["qwen2", *FAMILIES]] + [("phi3", 4), ("qwen3_moe", 4), ("gemma3", 4)]
)
def test_every_family_sharded_matches_one_rank(family_folders, family, size):
    """Each family split over ranks gives one rank's logits: q/k norms, Gemma's norms and
    soft caps, Phi-3's fused tensors, experts, sliding windows (the prompt is the recorded
    one longer than the window). At 4 ranks the 2 KV heads are replicated."""
    ckpt = load_checkpoint(family_folders[family])
    prompt = DATA["families"].get(family, DATA["families"]["mistral"])["cases"][1]["ids"]
    one_rank = build_model(ckpt.config, get_backend("cpu"), ckpt.tensors)
    for got, want in zip(shard_logits(ckpt, size, prompt, 4), reference_logits(one_rank, prompt, 4), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_vision_model_sharded_matches_one_rank_with_images(tmp_path):
    """Issue 45: a Gemma 3 vision-language model over 2 ranks. Rank 0 holds the image
    encoder whole (its q/k/v_proj are not cut as the decoder's are) and encodes as one
    rank does; rank 1 holds the text model only. With rank 0's soft tokens in every
    rank's prefill the logits are one rank's."""
    pytest.importorskip("PIL")
    from tests.tiny_vlm import IMAGE, seeded_image, write_vlm

    ckpt, b = load_checkpoint(write_vlm(str(tmp_path / "vlm"))), get_backend("cpu")
    one = build_model(ckpt.config, b, ckpt.tensors)
    rank0, rank1 = (
        build_model(ckpt.config, b, ckpt.tensors, TensorParallel(ShardLayout.on("cpu", ckpt.config, r, 2), None))
        for r in (0, 1)
    )
    assert rank1.config.vision is None and not hasattr(rank1, "vision")
    ims = [seeded_image(1, 40, 30), seeded_image(2, 24, 24)]
    prompt = [1, 5, 397, *[IMAGE] * 4, 399, 17, 33, 397, *[IMAGE] * 4, 399, 8]
    mm = image_rows(rank0, prompt, ims, IMAGE)
    np.testing.assert_array_equal(mm.embeds, image_rows(one, prompt, ims, IMAGE).embeds)  # rank 0 encodes as one rank
    for got, want in zip(shard_logits(ckpt, 2, prompt, 3, b, mm), reference_logits(one, prompt, 3, mm), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_default_model_logits_match_one_rank(default_checkpoint, default_model):
    """SmolLM2-135M has 9 query and 3 KV heads: it splits over 3 ranks (not 2 or 4). Over
    its 30 layers the reordered float32 sums drift by up to 1.3e-4 on logits of size ~15,
    so the bound here is 1e-4 absolute plus 1e-4 relative."""
    prompt = default_checkpoint.tokenizer.encode("The capital of France is")
    numpy = get_backend("cpu", cpu_kernels="numpy")  # float32 throughout, as default_model
    for got, want in zip(
        shard_logits(default_checkpoint, 3, prompt, 1, numpy), reference_logits(default_model, prompt, 1), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        assert (got.argmax(-1) == want.argmax(-1)).all()


NATIVE = pytest.mark.skipif(get_backend("cpu").lib is None, reason="no C compiler: no native CPU kernels")
# Prompts whose greedy tokens parted from one rank's when the CPU's ranks summed o_proj and
# down row-parallel (Megatron's layout, which cuda keeps). SmolLM2-135M Q4_1, TP=3 against
# TP=1, 24 tokens each (shard_logits against reference_logits below, ShardLayout.on made to
# return Megatron's layout; 2026-12-03): common prefixes [24, 22, 14, 16] on the avx512vnni
# path and [1, 24, 14, 16] on avx2, where "The Nile flows through" went on " the heart of
# Africa" instead of " the Tigris and Euphrates"; prefill logits apart by up to 0.99. In the
# exact layout: [24, 24, 24, 24] on both paths, the logits equal bit for bit.
PARTED = ["The Nile flows through", "In 1492, Columbus", "My favourite food is", "import numpy as np\n"]


@NATIVE
def test_default_model_sharded_keeps_its_packed_blocks(default_checkpoint):
    """On the native kernels each of 3 ranks keeps its slice of the Q4_1 / Q8_0 blocks (a
    third of the bytes, no dense copy): whole rows of q/k/v and gate/up, and in the CPU's
    exact layout whole rows of o_proj and down too. Each number is then computed as one
    rank computes it, so the logits are one native rank's, bit for bit."""
    ckpt, b = default_checkpoint, get_backend("cpu")
    one = build_model(ckpt.config, b, ckpt.tensors)
    rank1 = build_model(ckpt.config, b, ckpt.tensors, TensorParallel(ShardLayout.on("cpu", ckpt.config, 1, 3), None))
    for name in ("qkv", "o_proj", "gate_up", "down"):
        w, w1 = getattr(one.layers[0], name), getattr(rank1.layers[0], name)
        assert isinstance(w1, QuantizedWeight) and w1.qtype == w.qtype, name
        assert w1.data.nbytes * 3 == w.data.nbytes, name
    assert rank1.layers[0].o_proj.shape == (ckpt.config.hidden_size // 3, ckpt.config.q_size)
    assert isinstance(rank1.embed, QuantizedWeight) and rank1.embed.shape[0] == ckpt.config.vocab_size // 3
    assert rank1.lm_head is rank1.embed
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        ids = ckpt.tokenizer.encode(prompt)
        (got,), want = shard_logits(ckpt, 3, ids, 0), SingleSequence(one).feed(ids, all_logits=True)
        np.testing.assert_array_equal(got, want)


@NATIVE
@pytest.mark.timeout(300)
def test_default_model_on_native_kernels_gives_one_ranks_greedy_tokens(default_checkpoint):
    """Issue 42: on the int8 kernels three ranks give one rank's greedy tokens (PARTED says
    how far they went together when o_proj and down were summed over ranks). 9 query
    heads split over 3 ranks, not 2."""
    ckpt, b = default_checkpoint, get_backend("cpu")
    one = build_model(ckpt.config, b, ckpt.tensors)
    for prompt in PARTED:
        ids = ckpt.tokenizer.encode(prompt)
        want = [int(x[-1].argmax()) for x in reference_logits(one, ids, 23)]
        assert [int(x[-1].argmax()) for x in shard_logits(ckpt, 3, ids, 23, b)] == want, prompt


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_sim_ranks_keep_packed_blocks_and_give_one_ranks_logits(qtype, monkeypatch):
    """The GGUF kernels of cuda/ (on the simulator) on each of 2 ranks' packed slices: with
    the float decode GEMV (exact up to summation order) the logits are one rank's."""
    monkeypatch.setattr(gguf_linear, "DECODE_KERNEL", "float")
    config, tensors = quantized_tiny_llama(qtype)
    ckpt, b = types.SimpleNamespace(config=config, tensors=tensors), get_backend("sim")
    rank1 = build_model(config, b, tensors, TensorParallel(ShardLayout(config, 1, 2), comm=None))
    assert isinstance(rank1.layers[0].o_proj, QuantizedWeight) and rank1.layers[0].o_proj.shape == (256, 128)
    one = build_model(config, b, tensors)
    prompt = [5, 17, 99, 3, 50, 42]
    for got, want in zip(shard_logits(ckpt, 2, prompt, 2, b), reference_logits(one, prompt, 2), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def greedy(
    model: str, device: str = "cpu", size: int = 1, max_tokens: int = 12, prompts=PROMPTS, **kw
) -> list[list[int]]:
    from rawpage import LLM, SamplingParams

    llm = LLM(model, device=device, tensor_parallel_size=size, kv_cache_memory="64MiB", max_model_len=256, **kw)
    try:
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
        return [o.outputs[0].token_ids for o in outs]
    finally:
        if llm.engine.workers is not None:
            llm.engine.workers.close()


@pytest.fixture(scope="module")
def tp1_tokens(tiny_model_dir):
    return greedy(tiny_model_dir)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 4])
def test_spawned_workers_give_the_greedy_tokens_of_one_rank(tiny_model_dir, tp1_tokens, size):
    assert greedy(tiny_model_dir, size=size) == tp1_tokens


@pytest.mark.timeout(180)
def test_fp8_kv_cache_scales_are_agreed_across_ranks(tiny_model_dir):
    """Each rank calibrates on its own KV heads; the scales are the largest over all
    ranks, so two ranks quantize as one does and give its tokens."""
    assert greedy(tiny_model_dir, size=2, kv_cache_dtype="fp8") == greedy(tiny_model_dir, kv_cache_dtype="fp8")


@pytest.mark.timeout(300)
def test_sim_two_ranks_give_the_greedy_tokens_of_one_rank(tiny_model_dir, tp1_tokens):
    """The same CUDA sources as a GPU run, on the simulator (slow: two prompts, three tokens)."""
    assert greedy(tiny_model_dir, "sim", 2, 3, PROMPTS[:2]) == [t[:3] for t in tp1_tokens[:2]]


def test_default_model_at_two_ranks_says_why_not():
    from rawpage import LLM

    with pytest.raises(UnsupportedModelError, match="num_heads=9 is not a multiple of it"):
        LLM(tensor_parallel_size=2)


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_step_stops_the_engine_with_a_message(tiny_model_dir):
    from rawpage import SamplingParams
    from rawpage.engine import LLMEngine

    engine = LLMEngine(model=tiny_model_dir, tensor_parallel_size=2, kv_cache_memory="64MiB", max_model_len=256)
    try:
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
        engine.step()
        os.kill(engine.workers.procs[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid \d+\) was killed by signal 9"):
            for _ in range(50):
                engine.step()
    finally:
        engine.workers.close()


@pytest.mark.timeout(300)
def test_a_dead_worker_fails_the_server_which_exits_with_a_message(tiny_model_dir):
    import re

    import httpx

    from tests.server.harness import ServerProcess

    s = ServerProcess("--model", tiny_model_dir, "--tensor-parallel-size", "2", "--max-model-len", "256")
    try:
        pid = int(re.search(r"workers are pids \[(\d+)\]", s.output()).group(1))
        os.kill(pid, signal.SIGKILL)
        body = {"model": "hf", "prompt": "Hello", "max_tokens": 8}
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 500 and "was killed by signal 9" in r.json()["error"]["message"]
        assert s.proc.wait(timeout=60) == 1
        assert "exiting: tensor-parallel worker rank 1" in s.output()
    finally:
        s.stop()


@pytest.mark.timeout(300)
def test_default_model_over_three_workers_gives_the_greedy_tokens_of_one_rank():
    """The default SmolLM2-135M (9 query, 3 KV heads) through the spawned-worker engine, on
    the native kernels where there is a compiler: the prompts that once parted (PARTED)."""
    one, three = (greedy(None, size=n, max_tokens=24, prompts=PARTED) for n in (1, 3))
    assert one == three


@pytest.mark.timeout(120)
def test_each_rank_sizes_its_pool_for_its_own_kv_heads(tiny_model_dir):
    """Hkv = 2 over 2 ranks: a rank's block holds one KV head, so the same --kv-cache-memory
    fits twice the blocks; the pool is the smallest any rank fits (here all agree)."""
    from rawpage.engine import LLMEngine

    kw = dict(model=tiny_model_dir, kv_cache_memory="8MiB", max_model_len=256)
    one = LLMEngine(**kw).memory
    engine = LLMEngine(**kw, tensor_parallel_size=2)
    try:
        assert engine.memory.bytes_per_block * 2 == one.bytes_per_block
        assert engine.memory.num_blocks == 2 * one.num_blocks == engine.block_manager.num_blocks
        assert engine.runner.kv_caches[0][0].shape[2] == 1  # (NB, BS, Hkv / P, D)
    finally:
        engine.workers.close()


def test_a_script_without_a_main_guard_is_told_what_to_do(tmp_path, tiny_model_dir):
    script = tmp_path / "no_guard.py"
    script.write_text(
        "from rawpage import LLM\n"
        f"LLM({str(tiny_model_dir)!r}, device='cpu', tensor_parallel_size=2, kv_cache_memory='64MiB', "
        "max_model_len=256)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode != 0
    assert 'put the code that creates LLM(...) under `if __name__ == "__main__":`' in out.stderr, out.stderr
    assert "bootstrapping phase" not in out.stderr, out.stderr


def test_qwen_vl_sharded_matches_one_rank_with_images(tmp_path):
    """Issue 45: Qwen2.5-VL over 2 ranks. Rank 0 holds the ViT whole; rank 1's plain Qwen2
    rotates the images' rows by the M-RoPE positions that come with the batch."""
    pytest.importorskip("PIL")
    from rawpage.multimodal.mm_batch import MultimodalBatch
    from rawpage.multimodal.mrope import mrope_positions
    from tests.test_vision_qwen import DATA, placed_inputs
    from tests.tiny_qwen_vl import write_qwen_vl

    ckpt, b = load_checkpoint(write_qwen_vl(str(tmp_path / "qvl"))), get_backend("cpu")
    one = build_model(ckpt.config, b, ckpt.tensors)
    placed = placed_inputs(one.config.vision)
    rows = np.concatenate([np.arange(im.offset, im.offset + im.length) for im in placed])
    embeds = np.concatenate([one.encode_image(im.pixels, im.grid) for im in placed])
    positions = mrope_positions(0, len(DATA["ids"]), placed, 2)
    mm = MultimodalBatch(rows, embeds, None, positions)
    (got,) = shard_logits(ckpt, 2, DATA["ids"], 0, b, mm)
    np.testing.assert_allclose(got, reference_logits(one, DATA["ids"], 0, mm)[0], atol=1e-4, rtol=0)
