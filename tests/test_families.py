"""Parity of every model family with transformers, on tiny random models
(tests/tiny_families.py; outputs recorded by tools/make_golden_families.py).

Each case is a prompt shorter than the sliding window and one longer: its logits
at every position (fed as a prefill chunk and then one token at a time, through
a scattered block table of 4-token blocks) must match transformers' top 10
within 1e-3, and 32 greedy tokens must be identical.
"""

import json
import os

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.errors import UnsupportedModelError
from rawpage.loader import load_checkpoint
from rawpage.models.registry import build_model
from tests.model_harness import SingleSequence
from tests.tiny_families import FAMILIES, family_config, hub_tensors, weights_digest, write_family
from tests.tiny_models import train_tokenizer, write_gguf, write_hf_folder

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "golden_families.json")
with open(GOLDEN) as f:
    DATA = json.load(f)
PREFILL = 11  # tokens fed as the first chunk; the rest of the prompt decodes one at a time


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tok, d = train_tokenizer(), tmp_path_factory.mktemp("families")
    return {f: write_family(str(d / f), f, tok=tok) for f in FAMILIES}


def model_of(folder: str, device: str = "cpu"):
    """device: a backend, or cpu-numpy / cpu-native for the CPU's kernels."""
    ckpt = load_checkpoint(folder)
    backend, _, kernels = device.partition("-")
    backend = get_backend(backend, cpu_kernels=kernels) if kernels else get_backend(backend)
    return build_model(ckpt.config, backend, ckpt.tensors)


def logits_of(model, ids: list[int]) -> np.ndarray:
    seq = SingleSequence(model, block_size=4)
    n = min(PREFILL, len(ids) - 2)
    first = seq.feed(ids[:n], all_logits=True)
    return np.concatenate([first, np.stack([seq.feed([t]) for t in ids[n:]])])


def check_case(model, case, greedy: bool = True):
    logits = logits_of(model, case["ids"])  # (n, V)
    top_ids, top = np.array(case["top_ids"]), np.array(case["top_logits"])
    diff = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top).max()
    assert diff < 1e-3, f"max |logit difference| {diff:.2e} at transformers' top-10"
    clear = top[:, 0] - top[:, 1] > 1e-2  # our top-1 is theirs wherever theirs is not a near-tie
    np.testing.assert_array_equal(logits.argmax(1)[clear], top_ids[clear, 0])
    if greedy:
        assert SingleSequence(model, block_size=4).greedy(case["ids"], len(case["greedy"])) == case["greedy"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_weights_are_the_recorded_ones(family):
    assert weights_digest(hub_tensors(family_config(family))) == DATA["families"][family]["weights"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_transformers_on_cpu(folders, family):
    model = model_of(folders[family])
    assert type(model).__name__ != "LlamaModel" or family == "llama"
    for case in DATA["families"][family]["cases"]:
        check_case(model, case)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_on_sim(folders, family):
    """Our CUDA kernels, run on the CPU, with the sliding windows (Mistral, Phi-3,
    Gemma's local layers), soft cap (Gemma 2) and head sizes of each family: the
    prompts longer than the window cross it in the prefill chunk and while decoding."""
    model = model_of(folders[family], "sim")
    for case in DATA["families"][family]["cases"]:
        check_case(model, case)


@pytest.mark.parametrize("family", ["mistral", "gemma2", "qwen3_moe"])
def test_engine_batched_chunked_and_preempted(folders, family):
    """Through the engine (which picks the class by architecture, models/registry.py):
    each case twice in one batch, prompts prefilled in 8-token chunks, and a pool of
    12 blocks too small for them all, so sequences are preempted and recomputed.
    The greedy tokens are still transformers'. Mistral releases the blocks that leave
    its window, so 12 would hold its 4 sequences: it gets 7."""
    from rawpage import LLM, SamplingParams
    from tests.model_harness import assert_no_leaks

    cases = DATA["families"][family]["cases"] * 2
    llm = LLM(
        folders[family],
        device="cpu",
        block_size=8,
        num_gpu_blocks_override=7 if family == "mistral" else 12,
        max_num_batched_tokens=8,
        max_model_len=80,
        enable_prefix_caching=False,
    )
    params = SamplingParams(temperature=0, max_tokens=len(cases[0]["greedy"]), ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": c["ids"]} for c in cases], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == [c["greedy"] for c in cases]
    assert llm.engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    assert (llm.engine.block_manager.num_window_releases > 0) == (family == "mistral")
    assert_no_leaks(llm.engine)


def test_sim_serves_windowed_and_capped_families_past_the_window(folders):
    """Nothing refuses Gemma 2 (soft cap, alternating windows) or Mistral on the kernel
    backends any more, at a context length well past their 16-token windows."""
    from rawpage import LLM, SamplingParams

    for family in ("gemma2", "mistral"):
        llm = LLM(folders[family], device="sim", max_model_len=64, kv_cache_memory="4MiB")
        case = DATA["families"][family]["cases"][1]
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        out = llm.generate([{"prompt_token_ids": case["ids"]}], params, use_tqdm=False)[0]
        assert list(out.outputs[0].token_ids) == case["greedy"][:8]


def test_moe_decodes_eagerly_where_graphs_would_be_captured(folders, monkeypatch):
    """MoE routing reads the router's output on the host: no CUDA graphs for it."""
    from rawpage import LLM
    from rawpage.backends.sim import SimBackend

    monkeypatch.setattr(SimBackend, "supports_graphs", True)  # stands in for cuda
    assert LLM(folders["qwen3"], device="sim", kv_cache_memory="4MiB", max_num_seqs=1).engine.runner.graphs is not None
    assert LLM(folders["mixtral"], device="sim", kv_cache_memory="4MiB", max_num_seqs=1).engine.runner.graphs is None


@pytest.mark.live
@pytest.mark.parametrize("family", list(FAMILIES))
def test_live_against_transformers(folders, family):
    """Re-record with transformers now (not from the file) and compare the same way."""
    from tools.make_golden_families import record_family

    model = model_of(folders[family])
    for case in record_family(family)["cases"]:
        check_case(model, case)


@pytest.mark.parametrize("family", ["qwen3", "mixtral", "qwen3_moe", "gemma2", "gemma3", "phi3"])
def test_gguf_names_of_each_family(tmp_path, family):
    """The same weights written as llama.cpp would (q/k permuted for Mixtral, a layer's
    experts stacked into one tensor, Gemma's norms as 1 + w) load to the same model as
    the Hugging Face folder. A GGUF cannot say query_pre_attn_scalar: llama.cpp takes the
    head size, so the Gemma configs here do too."""
    tok, cfg = train_tokenizer(), family_config(family)
    if family.startswith("gemma"):
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    tensors = hub_tensors(cfg)
    folder = write_hf_folder(str(tmp_path / family), cfg, tensors, tok)
    path = write_gguf(str(tmp_path / f"{family}.gguf"), cfg, tensors, tok)
    assert load_checkpoint(path).config.architecture == family
    ids = DATA["families"][family]["cases"][1]["ids"]
    np.testing.assert_allclose(logits_of(model_of(path), ids), logits_of(model_of(folder), ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "mixtral", "qwen3_moe", "gemma2", "gemma3", "phi3"])
def test_q8_0_gguf_of_each_family_stays_packed(tmp_path, family):
    """A Q8_0 GGUF of each family keeps its blocks on the native CPU backend: every
    attention and dense-MLP weight (Phi-3's fused ones too), the embedding and the LM
    head (tied or not). Its logits are those of the same blocks dequantized at load
    (NumPy), within the int8 activations' rounding, at every position but where that
    rounding flips a near-tie of an MoE router (measured: 2 of 40 Mixtral rows). Each
    expert keeps its rows of the layer's stacked blocks. (Mistral's GGUF is a Llama's.)"""
    from rawpage.quantization.weight import QuantizedWeight
    from tests.native.test_float_checkpoint import Q8_0_TOLERANCE

    tok, cfg = train_tokenizer(), family_config(family)
    if family.startswith("gemma"):
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]  # (as in test_gguf_names_of_each_family)
    path = write_gguf(str(tmp_path / f"{family}.gguf"), cfg, hub_tensors(cfg), tok, qtype="Q8_0")
    packed, dense = model_of(path, "cpu-native"), model_of(path, "cpu-numpy")
    weights = [packed.embed, packed.lm_head]
    for layer in packed.layers:
        weights += [layer.qkv, layer.o_proj, *(layer.moe.gate_up if layer.moe else [layer.gate_up, layer.down])]
        if layer.moe and packed.config.moe_intermediate_size % 32 == 0:  # (Mixtral's 48 columns stay float)
            weights += layer.moe.down
    assert all(isinstance(w, QuantizedWeight) and w.qtype == "Q8_0" for w in weights)
    assert packed.num_bytes() < 0.5 * dense.num_bytes()
    ids = DATA["families"][family]["cases"][1]["ids"]
    got, want = logits_of(packed, ids), logits_of(dense, ids)  # (n, V)
    err = np.abs(got - want).max(axis=1) / np.abs(want).max()  # (n,)
    assert np.quantile(err, 0.8 if packed.config.num_experts else 1.0) < Q8_0_TOLERANCE, err


def test_q8_0_moe_gguf_experts_stay_packed_on_sim(tmp_path):
    """Qwen3-MoE's stacked Q8_0 experts on the simulator: each expert keeps its rows of
    blocks and runs the GGUF kernels one by one (grouped GEMM takes dense experts only);
    the logits are those of the blocks dequantized at load, to the int8 rounding."""
    from rawpage.quantization.weight import QuantizedWeight
    from tests.native.test_float_checkpoint import Q8_0_TOLERANCE

    cfg = family_config("qwen3_moe")
    path = write_gguf(str(tmp_path / "moe.gguf"), cfg, hub_tensors(cfg), train_tokenizer(), qtype="Q8_0")
    sim, dense = model_of(path, "sim"), model_of(path, "cpu-numpy")
    moe = next(layer.moe for layer in sim.layers if layer.moe)
    assert all(isinstance(w, QuantizedWeight) for w in moe.gate_up + moe.down) and moe.gate_up_stacked is None
    ids = DATA["families"]["qwen3_moe"]["cases"][1]["ids"][:12]
    got, want = logits_of(sim, ids), logits_of(dense, ids)
    err = np.abs(got - want).max(axis=1) / np.abs(want).max()
    assert np.quantile(err, 0.8) < Q8_0_TOLERANCE, err


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dummy_weights_of_each_family(tmp_path, family):
    """--load-format dummy: a family's config.json alone gives a model that runs."""
    with open(tmp_path / "config.json", "w") as f:
        json.dump(family_config(family), f)
    ckpt = load_checkpoint(str(tmp_path), load_format="dummy")
    logits = logits_of(build_model(ckpt.config, get_backend("cpu"), ckpt.tensors), list(range(3, 20)))
    assert np.isfinite(logits).all() and logits.std() > 0.1


def test_config_spellings_hub_and_transformers_5():
    """Gemma 3 as on the Hub (rope_theta, rope_local_base_freq, rope_scaling, a window
    pattern) and as transformers 5 saves it (rope_parameters per layer type, layer_types)."""
    from rawpage.config import ModelConfig

    hub = family_config("gemma3")
    v5 = {
        k: v
        for k, v in hub.items()
        if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling", "sliding_window_pattern")
    }
    v5["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    v5["layer_types"] = ["sliding_attention", "sliding_attention", "full_attention"]
    assert ModelConfig.from_hf(v5) == ModelConfig.from_hf(hub)
    assert ModelConfig.from_hf(hub).rope_local_theta == 1e4
    qwen_window = family_config("qwen3") | {"use_sliding_window": True, "sliding_window": 16}
    with pytest.raises(UnsupportedModelError, match="use_sliding_window"):
        ModelConfig.from_hf(qwen_window)


def test_unsupported_architecture_names_the_supported(tmp_path):
    cfg = family_config("mistral") | {"architectures": ["FalconForCausalLM"]}
    with open(tmp_path / "config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(UnsupportedModelError, match="FalconForCausalLM.*Gemma3ForCausalLM.*Qwen3MoeForCausalLM"):
        load_checkpoint(str(tmp_path))
