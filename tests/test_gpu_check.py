"""tools/gpu_check.sh without a GPU: the script parses, every Python step answers
--help, the steps that can run on the CPU do (tiny shapes), and the final table
reads results the way the GPU run will write them."""

import json
import subprocess
import sys
import zipfile

import pytest

from tests.tiny_models import tiny_config

STEPS = ["env", "deps", "parity", "microbench", "throughput", "summary"]


@pytest.mark.parametrize("script", ["tools/gpu_check.sh", "tools/gpu_wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", script], check=True)


@pytest.mark.parametrize("step", STEPS)
def test_python_steps_answer_help(step):
    out = subprocess.run([sys.executable, "-m", f"tools.gpu_check.{step}", "--help"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "usage:" in out.stdout


@pytest.fixture
def tiny_config_file(tmp_path):
    cfg = tiny_config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=300,
                      max_position_embeddings=512, tie_word_embeddings=True)  # fmt: skip
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 64}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_throughput_step_runs_on_the_cpu(tiny_config_file, tmp_path):
    from tools.gpu_check import throughput

    out = tmp_path / "tp.json"
    r = throughput.main(["--config", tiny_config_file, "--device", "cpu", "--dtype", "float32",
                         "--num-requests", "6", "--input-len", "10:30", "--output-len", "4", "--max-num-seqs", "4",
                         "--max-model-len", "128", "--decode-batch", "3", "--decode-context", "20",
                         "--decode-steps", "3", "--result-file", str(out)])  # fmt: skip
    assert r["output_tokens"] == 24 and r["output_tok_s"] > 0
    assert r["step_steps"] > 0 and r["step_build_batch_ms"] > 0
    assert r["decode"]["batch"] == 3 and r["decode"]["kv_read_gb"] > 0
    assert json.loads(out.read_text())["throughput_rawpage"]["num_requests"] == 6


@pytest.mark.live
def test_parity_step_runs_on_the_cpu(tiny_config_file):
    from tools.gpu_check import parity

    r = parity.main(["--config", tiny_config_file, "--device", "cpu", "--dtypes", "float32", "--prompt-lens", "5,33"])
    assert r["float32"]["ok"], r
    assert r["float32"]["prefill"]["rows"] == 38 and r["float32"]["decode"]["rows"] == 2


def test_microbench_arithmetic():
    from tools.gpu_check.microbench import decode_bytes, prefill_flops

    # batch 64 x 4096 tokens x 8 KV heads x 128 x 2 bytes, K and V; plus q and out
    assert decode_bytes(64, 4096) == 2 * 64 * 4096 * 8 * 128 * 2 + 2 * 64 * 32 * 128 * 2
    assert prefill_flops(1, 1) == 4 * 32 * 128  # one query, one key: QK^T and PV
    assert prefill_flops(8, 2048) == pytest.approx(2.75e11, rel=0.01)


def test_summary_table_from_parts(tmp_path):
    from tools.gpu_check import summary

    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "env.json").write_text(json.dumps({"env": {"gpu": "NVIDIA H200", "runtime_cuda": "13.0"}}))
    (parts / "microbench.json").write_text(json.dumps({"microbench": {
        "copy_gbs": 4000.0,
        "decode": [{"context": 4096, "gbs": 3000.0, "fraction_of_copy": 0.75}],
        "sdpa_decode": [{"context": 4096, "gbs": 2500.0}],
        "prefill": {"tflops": 200.0, "fraction_of_sdpa": 0.4},
        "sdpa_prefill": {"tflops": 500.0},
        "rms_norm": {"gbs": 3200.0}}}))  # fmt: skip
    (parts / "throughput_rawpage.json").write_text(json.dumps({"throughput_rawpage": {
        "num_requests": 512, "output_tok_s": 6000.0, "total_tok_s": 36000.0, "startup_s": 30.0,
        "step_wall_ms": 40.0, "step_build_batch_ms": 0.5, "step_gpu_forward_ms": 35.0,
        "decode": {"batch": 256, "context": 1024, "step_wall_ms": 30.0, "step_gpu_forward_ms": 25.0,
                   "step_build_batch_ms": 0.4, "roofline_ms": 12.0, "wall_over_roofline": 2.5,
                   "weight_gb": 16.1, "kv_read_gb": 34.4}}}))  # fmt: skip
    (parts / "throughput_hf.json").write_text(json.dumps({"throughput_hf": {"batch": 64, "output_tok_s": 1000.0}}))
    (tmp_path / "k.log").write_text("....\n===== 120 passed, 3 skipped in 80.1s =====\n")
    (tmp_path / "m.log").write_text("========= ERROR SUMMARY: 0 errors\n")
    text = summary.main(["--parts", str(parts), "--kernel-log", str(tmp_path / "k.log"),
                         "--memcheck-log", str(tmp_path / "m.log"), "--out-json", str(tmp_path / "r.json")])  # fmt: skip
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "120 passed, 3 skipped" in rows["kernel tests (cuda)"] and rows["kernel tests (cuda)"].endswith("| ok |")
    assert rows["compute-sanitizer memcheck"].endswith("| ok |")
    assert "75% of copy" in rows["decode attention B=64 ctx=4096"] and rows["decode attention B=64 ctx=4096"].endswith(
        "ok |"
    )
    assert rows["prefill attention 8x2048 causal"].endswith("MISS |")
    assert "(6.0x)" in rows["offline throughput, 512 req, Llama-3-8B shape"]
    assert rows["decode step B=256 ctx=1024"].endswith("MISS |")
    assert rows["parity vs transformers, bfloat16"].endswith("— |"), "not measured is neither ok nor MISS"
    assert json.loads((tmp_path / "r.json").read_text())["kernel_tests"] == "120 passed, 3 skipped in 80.1s"


def test_deps_picks_wheels_for_this_interpreter(tmp_path):
    from tools.gpu_check.deps import fits_this_python, top_level

    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert fits_this_python("pytest-9.0-py3-none-any.whl")
    assert fits_this_python(f"regex-1-{here}-{here}-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")
    assert not fits_this_python("regex-1-cp39-cp39-manylinux2014_x86_64.whl")
    assert fits_this_python("tokenizers-0.23-cp39-abi3-manylinux_2_17_x86_64.whl")
    assert not fits_this_python(f"regex-1-{here}-{here}-macosx_11_0_arm64.whl")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("demo/__init__.py", "")
        z.writestr("demo_helper.py", "")
        z.writestr("demo-1.0.dist-info/METADATA", "")
    assert top_level(str(wheel)) == {"demo", "demo_helper"}
