"""The pooling runner (--runner pooling, LLM.embed) on a tiny random Qwen3: its vectors
against a NumPy pass of the same weights, batched against solo, chunked against whole,
and every block back in the pool afterwards."""

import json
import os

import numpy as np
import pytest

from rawpage import LLM
from rawpage.errors import InvalidRequestError, UnsupportedModelError
from rawpage.pooling.pooler import PoolingParams, checkpoint_pooling_type, resolve_pooling_type
from tests.model_harness import assert_no_leaks
from tests.tiny_families import family_config, hub_tensors, write_family

TEXTS = ["hello world", "the cat sat on the mat", "x", "    indented code:\n\tdef f(x):\n\t\treturn x * 2\n"]
KW = dict(kv_cache_memory="16MiB")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_family(str(tmp_path_factory.mktemp("pooling") / "qwen3"), "qwen3")


@pytest.fixture(scope="module")
def engines(folder):
    return {p: LLM(folder, runner="pooling", pooling_type=p, **KW) for p in ("last", "mean", "cls")}


# --- a NumPy Qwen3, in float64 -------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """x (T, H, D), rotated by position in halves (rotate_half), as Hugging Face's Qwen3."""
    T, _, D = x.shape
    freqs = np.outer(np.arange(T), theta ** -(np.arange(0, D, 2) / D))  # (T, D/2)
    cos, sin = np.cos(np.concatenate([freqs, freqs], -1))[:, None], np.sin(np.concatenate([freqs, freqs], -1))[:, None]
    rotated = np.concatenate([-x[..., D // 2 :], x[..., : D // 2]], -1)
    return x * cos + rotated * sin


def reference_hidden(cfg: dict, w: dict, ids: list[int]) -> np.ndarray:
    """The last layer's hidden states after the final norm: (T, dim), float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    H, Hkv, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    T = len(ids)
    h = w["model.embed_tokens.weight"][ids]  # (T, dim)
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = rms_norm((x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D), w[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm((x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D), w[p + "self_attn.k_norm.weight"], eps)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)  # (T, H, D): GQA groups
        s = np.einsum("thd,shd->hts", q, k) * D**-0.5 + causal  # (H, T, T)
        a = np.exp(s - s.max(-1, keepdims=True))
        o = np.einsum("hts,shd->thd", a / a.sum(-1, keepdims=True), v).reshape(T, H * D)
        h = h + o @ w[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(h, w["model.norm.weight"], eps)


def reference_vector(ids: list[int], pooling: str, normalize: bool, dimensions: int | None = None) -> np.ndarray:
    cfg = family_config("qwen3")
    hidden = reference_hidden(cfg, hub_tensors(cfg), ids)
    v = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling][:dimensions]
    return v / np.linalg.norm(v) if normalize else v


def vectors(outs) -> np.ndarray:
    return np.array([o.outputs.embedding for o in outs])


# --- parity ------------------------------------------------------------------------------
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_pooled_vectors_match_a_numpy_pass(engines, pooling, normalize):
    outs = engines[pooling].embed(TEXTS, pooling_params=PoolingParams(normalize=normalize), use_tqdm=False)
    for out in outs:
        want = reference_vector(out.prompt_token_ids, pooling, normalize)
        np.testing.assert_allclose(out.outputs.embedding, want, atol=1e-5, rtol=0)
        assert out.finished and out.outputs.hidden_size == 64
    assert_no_leaks(engines[pooling].engine)


def test_dimensions_truncate_then_renormalise(engines):
    (out,) = engines["last"].embed("the cat sat", pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    want = reference_vector(out.prompt_token_ids, "last", True, 16)
    np.testing.assert_allclose(out.outputs.embedding, want, atol=1e-5, rtol=0)


@pytest.mark.live
def test_last_token_pooling_matches_transformers(folder, engines):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
    for out in engines["last"].embed(TEXTS, use_tqdm=False):
        with torch.no_grad():
            hidden = model(torch.tensor([out.prompt_token_ids])).last_hidden_state[0, -1].double().numpy()
        np.testing.assert_allclose(out.outputs.embedding, hidden / np.linalg.norm(hidden), atol=1e-5, rtol=0)


# --- batching, chunking, preemption ------------------------------------------------------------
def counting_steps(llm: LLM) -> list[int]:
    """Wrap the engine's step: the list gets the number of sequences each step ran."""
    counts, step = [], llm.engine.step

    def counted():
        out = step()
        counts.append(len(llm.engine.batch))
        return out

    llm.engine.step = counted
    return counts


def test_a_batch_of_64_runs_together_and_gives_each_input_its_solo_vector(engines):
    llm = engines["mean"]
    prompts = [[int(t) for t in np.random.default_rng(i).integers(3, 400, 5 + i % 23)] for i in range(64)]
    solo = np.concatenate([vectors(llm.embed([p], use_tqdm=False)) for p in prompts])
    counts = counting_steps(llm)
    try:
        batched = vectors(llm.embed(prompts, use_tqdm=False))
    finally:
        del llm.engine.step
    np.testing.assert_allclose(batched, solo, atol=1e-5, rtol=0)
    assert len(counts) < 64 and max(counts) > 1, f"sequences per step: {counts}"
    assert_no_leaks(llm.engine)


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_chunked_prefill_pools_the_same_vector(folder, engines, pooling):
    long = [int(t) for t in np.random.default_rng(7).integers(3, 400, 150)]
    whole = vectors(engines[pooling].embed([long], use_tqdm=False))
    chunked_llm = LLM(folder, runner="pooling", pooling_type=pooling, max_num_batched_tokens=16, **KW)
    counts = counting_steps(chunked_llm)
    chunked = vectors(chunked_llm.embed([long, long[:40]], use_tqdm=False))
    assert len(counts) >= 150 // 16, "the long input ran in one step: not chunked"
    np.testing.assert_allclose(chunked[0], whole[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(chunked[1], vectors(engines[pooling].embed([long[:40]], use_tqdm=False))[0], atol=1e-5)
    assert_no_leaks(chunked_llm.engine)


def test_an_input_preempted_mid_prefill_is_pooled_once(folder, engines):
    """Prefill-only batches never outgrow the pool (admission is capped by free blocks), so
    preempt by hand: the recomputed input starts over at position 0, and its running sum
    (mean) must not count the chunks it had before."""
    from rawpage.scheduler import SchedulerOutput

    long = [int(t) for t in np.random.default_rng(8).integers(3, 400, 100)]
    llm = LLM(folder, runner="pooling", pooling_type="mean", max_num_batched_tokens=16, **KW)
    engine = llm.engine
    engine.add_request("r", {"prompt_token_ids": long}, PoolingParams())
    for _ in range(3):
        engine.step()
    (seq,) = engine.scheduler.running
    assert 0 < seq.num_computed_tokens < len(long)
    engine.scheduler._preempt(seq, SchedulerOutput())  # recompute mode: blocks dropped, back to waiting
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    want = vectors(engines["mean"].embed([long], use_tqdm=False))[0]
    np.testing.assert_allclose(outs[0].outputs.embedding, want, atol=1e-5, rtol=0)
    assert_no_leaks(engine)


# --- limits and refusals ----------------------------------------------------------------------
def test_truncate_prompt_tokens_keeps_the_side_asked(folder, engines):
    """vLLM's sides: a pooling model keeps the first k tokens ("right"), or with
    truncation_side "left" the last k."""
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 400, 80)]
    llm = LLM(folder, runner="pooling", max_model_len=64, **KW)
    with pytest.raises(InvalidRequestError, match="more than --max-model-len 64"):
        llm.embed([ids], use_tqdm=False)
    (out,) = llm.embed([ids], truncate_prompt_tokens=20, use_tqdm=False)
    assert out.prompt_token_ids == ids[:20]
    np.testing.assert_allclose(out.outputs.embedding, vectors(engines["last"].embed([ids[:20]], use_tqdm=False))[0])
    (out,) = llm.embed([ids], truncate_prompt_tokens=-1, use_tqdm=False)
    assert out.prompt_token_ids == ids[:64]
    left = PoolingParams(truncation_side="left")
    (out,) = llm.embed([ids], pooling_params=left, truncate_prompt_tokens=20, use_tqdm=False)
    assert out.prompt_token_ids == ids[-20:]
    with pytest.raises(InvalidRequestError, match="truncation_side"):
        llm.embed([ids], pooling_params=PoolingParams(truncate_prompt_tokens=5, truncation_side="up"), use_tqdm=False)
    assert_no_leaks(llm.engine)


def test_bad_inputs_are_refused_and_leave_nothing_behind(engines):
    llm = engines["last"]
    for prompt, params, match in [
        ([], None, "empty"),
        ([400], None, "out of vocabulary"),
        ("hi", PoolingParams(dimensions=65), "dimensions"),
        ("hi", PoolingParams(truncate_prompt_tokens=0), "truncate_prompt_tokens"),
    ]:
        with pytest.raises(InvalidRequestError, match=match):
            llm.embed(["fine", prompt], pooling_params=params, use_tqdm=False)
        assert_no_leaks(llm.engine)


def test_a_pooling_engine_does_not_generate_and_a_generating_one_does_not_embed(folder, engines):
    with pytest.raises(InvalidRequestError, match="pooling model"):
        engines["last"].generate("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="runner='pooling'"):
        LLM(folder, **KW).embed("hello")


def test_refused_flags(folder):
    with pytest.raises(ValueError, match="--enable-lora does not work with --runner pooling"):
        LLM(folder, runner="pooling", enable_lora=True)


def test_pooling_type_auto_reads_the_sentence_transformers_config(tmp_path, folder):
    assert resolve_pooling_type("auto", folder) == "last"  # no modules.json: last
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    os.makedirs(tmp_path / "1_Pooling")
    config = {"word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    assert checkpoint_pooling_type(str(tmp_path)) == "mean"
    assert resolve_pooling_type("cls", str(tmp_path)) == "cls"  # the flag wins
    config = {"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="--pooling-type"):
        checkpoint_pooling_type(str(tmp_path))
    assert LLM(folder, runner="pooling", pooling_type="LAST", **KW).engine.pooler.pooling_type == "last"


def test_a_checkpoint_saved_without_the_model_prefix_loads(tmp_path, engines):
    """The Qwen3-Embedding checkpoints are saved from Qwen3Model: embed_tokens.weight,
    layers.0..., norm.weight, no lm_head."""
    from tests.tiny_models import train_tokenizer, write_hf_folder

    cfg = family_config("qwen3")
    tensors = {k.removeprefix("model."): v for k, v in hub_tensors(cfg).items()}
    bare = write_hf_folder(str(tmp_path / "bare"), cfg, tensors, train_tokenizer())
    got = LLM(bare, runner="pooling", **KW).embed(TEXTS, use_tqdm=False)
    np.testing.assert_allclose(vectors(got), vectors(engines["last"].embed(TEXTS, use_tqdm=False)), atol=1e-6)
