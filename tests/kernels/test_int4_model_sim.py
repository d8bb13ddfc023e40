"""AWQ and GPTQ checkpoints written by our packer, loaded through config.json's
quantization_config: sim (packed int4, our kernels) against cpu (dequantized at load)."""

import numpy as np
import pytest

from rawpage.backends import get_backend
from rawpage.loader import load_checkpoint
from rawpage.models.llama import LlamaModel
from rawpage.quantization.weight import QuantizedWeight
from tests.kernels.test_model_sim import Runner, schedule
from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder
from tools.int4_pack import pack_awq, pack_gptq

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_int4_folder(folder, method: str, group_size: int, sym: bool = False, act_order: bool = False) -> str:
    """A one-layer Llama (dim 128, FFN 256) with every Linear packed as `method`."""
    cfg = tiny_config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        tie_word_embeddings=False,
    )
    tensors = {}
    for name, t in random_tensors(cfg).items():
        prefix, _, kind = name.rpartition(".")
        if kind == "weight" and prefix.rpartition(".")[2] in LINEARS:
            packed = pack_awq(t, group_size) if method == "awq" else pack_gptq(t, group_size, sym, act_order)
            tensors |= {f"{prefix}.{k}": v for k, v in packed.items()}
        else:
            tensors[name] = t
    cfg["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": group_size}
    if method == "gptq":
        cfg["quantization_config"] |= {"sym": sym, "desc_act": act_order}
    else:
        cfg["quantization_config"] |= {"zero_point": True, "version": "gemm"}
    return write_hf_folder(str(folder), cfg, tensors, train_tokenizer())


@pytest.mark.parametrize(
    "method,group_size,sym,act_order",
    [("awq", 128, False, False), ("gptq", 32, True, False), ("gptq", 64, False, True), ("gptq", -1, True, False)],
)
def test_packed_checkpoint_sim_matches_cpu(tmp_path, method, group_size, sym, act_order):
    ckpt = load_checkpoint(write_int4_folder(tmp_path, method, group_size, sym, act_order))
    sim_model = LlamaModel(ckpt.config, get_backend("sim"), ckpt.tensors)
    layer = sim_model.layers[0]
    assert isinstance(layer.o_proj, QuantizedWeight) and layer.o_proj.kind == "int4"
    # q|k|v fuse when their columns share one order; act-order permutes each its own way (dense)
    assert isinstance(layer.qkv, QuantizedWeight) != act_order
    cpu, sim = Runner(LlamaModel(ckpt.config, get_backend("cpu", cpu_kernels="numpy"), ckpt.tensors)), Runner(sim_model)
    for i, chunks in enumerate(schedule(np.random.default_rng(1), ckpt.config.vocab_size)):
        want, got = cpu.step(chunks), sim.step(chunks)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-5, f"step {i}: relative error {err:.2e}"
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_unsupported_quantization_config_says_so(tmp_path):
    folder = write_int4_folder(tmp_path, "awq", 128)
    import json

    cfg = json.load(open(f"{folder}/config.json"))
    cfg["quantization_config"]["version"] = "gemv"
    json.dump(cfg, open(f"{folder}/config.json", "w"))
    with pytest.raises(Exception, match="GEMM packing"):
        load_checkpoint(folder)
