"""Multi-LoRA (issue 21): PEFT adapters on a tiny random model. Each adapter's logits
match transformers + peft (or, without peft, the merged-weight reference W + scale·B·A)
within 1e-3 in float32; a batch mixing adapters and the base model gives each
sequence exactly its solo output; --max-loras evicts the least recently used."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rawpage import LLM, LoRARequest, SamplingParams
from rawpage.lora import LoRAError, LoRANotFoundError
from tests.model_harness import SingleSequence
from tests.tiny_lora import merged_tensors, write_adapter
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder

CFG = tiny_config()  # dim 64, 2 layers, 4 heads, 2 KV heads, head dim 16
# (name, rank, targets, alpha, rsLoRA)
ADAPTERS = [
    ("all8", 8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 16, False),
    ("qv4", 4, ["q_proj", "v_proj"], 8, True),
    ("mlp16", 16, ["o_proj", "gate_proj", "up_proj", "down_proj"], 32, False),
]
PROMPTS = [[5, 17, 42, 99, 3, 250], [7, 7, 120], [300, 1, 44, 45, 46, 47, 48, 49, 50], [11, 12]]


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    base = random_tensors(CFG, seed=3)
    model = write_hf_folder(str(root / "base"), CFG, base, train_tokenizer())
    paths = {
        name: write_adapter(str(root / name), CFG, r, targets, alpha, seed=i, rslora=rs)
        for i, (name, r, targets, alpha, rs) in enumerate(ADAPTERS)
    }
    return model, base, paths, root


@pytest.fixture(scope="module")
def llm(lora_setup):
    model, _, _, _ = lora_setup
    return LLM(model, device="cpu", enable_lora=True, max_loras=4, max_lora_rank=16, seed=0)


def _requests(paths):
    return {name: LoRARequest(name, i + 1, paths[name]) for i, (name, *_) in enumerate(ADAPTERS)}


def _our_logits(llm, ids, adapter):
    """All positions' logits (n, V) of one sequence run with `adapter` (None: the base model)."""
    e = llm.engine
    slot = e.lora.activate([adapter])  # (1,)
    e.lora.batch.set(np.array([0, len(ids)], np.int32), slot, np.array([len(ids)]))
    return SingleSequence(e.model).feed(ids, all_logits=True)


@pytest.mark.parametrize("name", [a[0] for a in ADAPTERS])
def test_adapter_logits_match_transformers_and_peft(lora_setup, llm, name):
    peft = pytest.importorskip("peft", reason="peft not installed; the merged-weight test still runs")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    _, base, paths, _ = lora_setup
    adapter = llm.engine.lora.add(_requests(paths)[name])
    ids = PROMPTS[0]
    hf = LlamaForCausalLM(LlamaConfig(**CFG)).float()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in base.items()})
    hf = peft.PeftModel.from_pretrained(hf, paths[name]).eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    with torch.no_grad():  # the adapter does change the model: the comparison can fail
        base = hf.get_base_model()
        with hf.disable_adapter():
            assert np.abs(base(torch.tensor([ids])).logits[0].numpy() - want).max() > 1e-2
    np.testing.assert_allclose(_our_logits(llm, ids, adapter), want, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", [a[0] for a in ADAPTERS])
def test_adapter_logits_match_merged_weights(lora_setup, llm, name):
    """Independent of peft: the base model with W + scale·B·A written into its weights."""
    model_dir, base, paths, root = lora_setup
    merged_dir = str(root / f"merged_{name}")
    if not os.path.exists(merged_dir):
        write_hf_folder(merged_dir, CFG, merged_tensors(base, paths[name]), train_tokenizer())
    merged = LLM(merged_dir, device="cpu", seed=0)
    ids = PROMPTS[2]
    want = SingleSequence(merged.engine.model).feed(ids, all_logits=True)
    adapter = llm.engine.lora.add(_requests(paths)[name])
    got = _our_logits(llm, ids, adapter)
    np.testing.assert_allclose(got, want, atol=1e-3, rtol=1e-3)
    assert np.abs(got - _our_logits(llm, ids, None)).max() > 1e-2  # and it differs from the base


def _greedy(llm, prompts, loras, n=8):
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False, lora_request=loras)
    return [o.outputs[0].token_ids for o in outs]


def test_mixed_batch_gives_each_sequence_its_solo_output(lora_setup, llm):
    """Three adapters and the base model in one batch, two prompts each (the same prompt
    under every adapter too: the prefix cache must not share KV across adapters)."""
    _, _, paths, _ = lora_setup
    reqs = list(_requests(paths).values()) + [None]
    solo = {(i, j): _greedy(llm, [p], [r])[0] for i, p in enumerate(PROMPTS[:2]) for j, r in enumerate(reqs)}
    prompts = [p for p in PROMPTS[:2] for _ in reqs]
    loras = [r for _ in PROMPTS[:2] for r in reqs]
    mixed = _greedy(llm, prompts, loras)
    assert mixed == [solo[(i, j)] for i in range(2) for j in range(len(reqs))]
    assert len({tuple(solo[(0, j)]) for j in range(len(reqs))}) > 1  # the adapters change the output


def test_max_loras_two_with_three_adapters_evicts_and_stays_exact(lora_setup):
    model, _, paths, _ = lora_setup
    small = LLM(model, device="cpu", enable_lora=True, max_loras=2, max_lora_rank=16, seed=0)
    reqs = list(_requests(paths).values())
    solo = [_greedy(small, [PROMPTS[0]], [r], n=12)[0] for r in reqs]
    evictions = small.engine.lora.num_evictions
    mixed = _greedy(small, [PROMPTS[0]] * 6, reqs * 2, n=12)
    assert mixed == solo * 2
    assert small.engine.lora.num_evictions > evictions  # a third adapter had to wait and take a slot


def test_lora_modules_flag_and_errors(lora_setup, tmp_path):
    model, _, paths, _ = lora_setup
    llm = LLM(model, device="cpu", enable_lora=True, max_lora_rank=8, lora_modules=[f"all8={paths['all8']}"])
    assert set(llm.engine.lora.adapters) == {"all8"}
    assert "LoRA slots" in llm.engine.memory.describe()
    with pytest.raises(LoRAError, match="rank 16, which is greater than max_lora_rank 8"):
        _greedy(llm, [PROMPTS[0]], [LoRARequest("mlp16", 9, paths["mlp16"])])
    with pytest.raises(LoRANotFoundError, match="No adapter found .* no adapter_config.json"):
        _greedy(llm, [PROMPTS[0]], [LoRARequest("nowhere", 10, str(tmp_path))])
    with pytest.raises(ValueError, match="needs --enable-lora"):
        LLM(model, device="cpu", lora_modules=[f"x={paths['all8']}"])
    base_only = LLM(model, device="cpu")
    with pytest.raises(LoRAError, match="without --enable-lora"):
        _greedy(base_only, [PROMPTS[0]], [LoRARequest("all8", 1, paths["all8"])])


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_decode_graphs_read_each_steps_adapter_slots(lora_setup, llm, monkeypatch, device):
    """With decode graphs on (forced here: cpu's NumPy path and sim replay by calling again), the
    adapter slots are graph inputs: a mixed batch replays and gives the eager engine's
    tokens. On sim the forward pass runs cuda/lora.cu's kernels, as on a GPU."""
    from rawpage.backends.cpu import CPUBackend
    from rawpage.backends.sim import SimBackend

    model, _, paths, _ = lora_setup
    reqs = list(_requests(paths).values()) + [None]
    kw = dict(device=device, enable_lora=True, max_loras=3, max_lora_rank=16, max_num_seqs=4, max_model_len=64)
    if device == "cpu":  # the NumPy path, whose Graph calls again (the kernels' recordings refuse LoRA)
        kw["cpu_kernels"] = "numpy"
        want = _greedy(LLM(model, kv_cache_memory="4MiB", enforce_eager=True, **kw), PROMPTS, reqs, n=5)
    else:
        want = _greedy(llm, PROMPTS, reqs, n=5)
    monkeypatch.setattr(CPUBackend if device == "cpu" else SimBackend, "supports_graphs", True)
    graphed = LLM(model, kv_cache_memory="4MiB", **kw)
    assert _greedy(graphed, PROMPTS, reqs, n=5) == want
    assert sum(graphed.engine.runner.graphs.num_replays.values()) > 0


def test_prefix_cache_keys_on_the_adapters_content(lora_setup, llm):
    """Two adapters (or an adapter and the base model) never share a KV block name; the
    same adapter does. The key is the adapter's content digest, not its name or id."""
    from rawpage.sequence import Request

    _, _, paths, _ = lora_setup
    reqs = _requests(paths)
    a, b = llm.engine.lora.add(reqs["all8"]), llm.engine.lora.add(reqs["qv4"])

    def root(lora):
        return Request("r", None, [1, 2, 3], SamplingParams(), lora=lora).root_digest

    assert len({root(None), root(a), root(b)}) == 3
    assert root(a) == root(a) and a.digest != b.digest


# --- issue 29, item 7 --------------------------------------------------------------------------


def test_names_and_shapes_are_checked_from_the_header_before_any_data_is_read(lora_setup, tmp_path, monkeypatch):
    from safetensors.numpy import save_file

    from rawpage.config import ModelConfig
    from rawpage.loader.safetensors_file import SafetensorsFile
    from rawpage.lora.adapter import load_adapter

    config = ModelConfig.from_hf(CFG)
    folder = write_adapter(str(tmp_path / "bad"), CFG, 4, ["q_proj"], 8, seed=1)
    big = np.zeros((256, 256), np.float32)
    save_file({"model.embed_tokens.weight": big}, os.path.join(folder, "adapter_model.safetensors"))

    def no_data(self, name):
        raise AssertionError(f"tensor data read: {name}")

    monkeypatch.setattr(SafetensorsFile, "tensor", no_data)
    with pytest.raises(LoRAError, match="'model.embed_tokens.weight' is not a LoRA A/B"):
        load_adapter(LoRARequest("bad", 1, folder), config, 16)
    p = "base_model.model.model.layers.0.self_attn.q_proj."
    save_file({p + "lora_A.weight": big, p + "lora_B.weight": big}, os.path.join(folder, "adapter_model.safetensors"))
    with pytest.raises(LoRAError, match="this model needs A"):
        load_adapter(LoRARequest("bad", 1, folder), config, 16)


def test_max_cpu_loras_forgets_the_least_recently_used_idle_adapter(lora_setup):
    model, _, paths, _ = lora_setup
    small = LLM(model, device="cpu", enable_lora=True, max_loras=1, max_lora_rank=16, max_cpu_loras=2)
    lora = small.engine.lora
    reqs = _requests(paths)
    lora.add(reqs["all8"])
    lora.add(reqs["qv4"])
    lora.add(reqs["all8"])  # used again: qv4 is now the least recently used
    lora.add(reqs["mlp16"])
    assert set(lora.adapters) == {"all8", "mlp16"}
    from rawpage.lora.adapter import load_adapter

    qv4 = load_adapter(reqs["qv4"], lora.config, lora.max_rank)
    lora.register(qv4, in_use={"all8"})  # all8 is in use: mlp16 goes, though used later
    assert set(lora.adapters) == {"all8", "qv4"}
    again = load_adapter(reqs["mlp16"], lora.config, lora.max_rank)
    with pytest.raises(LoRAError, match="--max-cpu-loras"):
        lora.register(again, in_use={"all8", "qv4"})
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LLM(model, device="cpu", enable_lora=True, max_loras=2, max_cpu_loras=1)


def test_a_load_forgets_only_its_owners_idle_adapters_and_replaces_in_place(lora_setup):
    """Issue 44: past --max-cpu-loras, a tenant's load forgets its own least recently used
    idle adapter, never another tenant's or a shared one; with none of its own, it is refused.
    load_inplace (register's `replaces`) swaps an adapter only if it is still the one known."""
    from rawpage.lora.adapter import load_adapter

    model, _, paths, _ = lora_setup
    lora = LLM(model, device="cpu", enable_lora=True, max_loras=1, max_lora_rank=16, max_cpu_loras=3).engine.lora

    def read(name: str, path: str, owner: str | None):
        adapter = load_adapter(LoRARequest(name, lora.next_id(), paths[path]), lora.config, lora.max_rank)
        adapter.owner = owner
        return adapter

    lora.register(read("shared", "all8", None))
    lora.register(read("a1", "qv4", "key-a"))
    lora.register(read("b1", "mlp16", "key-b"))
    lora.register(read("b2", "qv4", "key-b"))  # full: b's own oldest (b1) goes
    assert set(lora.adapters) == {"shared", "a1", "b2"}
    with pytest.raises(LoRAError, match="none of this caller's is idle"):
        lora.register(read("c1", "qv4", "key-c"))  # key-c has nothing of its own to give up
    assert set(lora.adapters) == {"shared", "a1", "b2"}
    old = lora.adapters["a1"]
    with pytest.raises(LoRAError, match="has already been loaded"):
        lora.register(read("a1", "mlp16", "key-a"))  # not in place: refused
    lora.register(read("a1", "mlp16", "key-a"), replaces=old)
    assert lora.adapters["a1"] is not old and lora.adapters["a1"].rank == 16
    with pytest.raises(LoRAError, match="has already been loaded"):  # `old` is no longer the one known
        lora.register(read("a1", "qv4", "key-a"), replaces=old)
