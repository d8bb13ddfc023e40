"""tools/gpu_check.sh without a GPU: the script parses, every Python step answers
--help, the steps that can run on the CPU do (tiny shapes), and the final table
reads results the way the GPU run will write them."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.tiny_models import tiny_config

STEPS = [
    "env",
    "deps",
    "parity",
    "families",
    "quant",
    "microbench",
    "throughput",
    "breakdown",
    "spec",
    "vision",
    "summary",
    "warm",
]


@pytest.mark.parametrize("script", ["tools/gpu_check.sh", "tools/gpu_wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", script], check=True)


@pytest.mark.parametrize("step", STEPS)
def test_python_steps_answer_help(step):
    out = subprocess.run(
        [sys.executable, "-m", f"tools.gpu_check.{step}", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage:" in out.stdout


@pytest.fixture
def tiny_config_file(tmp_path):
    cfg = tiny_config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        vocab_size=300,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    cfg["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_throughput_step_runs_on_the_cpu(tiny_config_file, tmp_path):
    from tools.gpu_check import throughput

    out = tmp_path / "tp.json"
    r = throughput.main(
        [
            "--config",
            tiny_config_file,
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--num-requests",
            "6",
            "--input-len",
            "10:30",
            "--output-len",
            "4",
            "--max-num-seqs",
            "4",
            "--max-model-len",
            "128",
            "--decode-batches",
            "1,3",
            "--decode-context",
            "20",
            "--decode-steps",
            "3",
            "--result-file",
            str(out),
        ]
    )
    assert r["output_tokens"] == 24 and r["output_tok_s"] > 0
    assert r["step_steps"] > 0 and r["step_build_batch_ms"] > 0
    assert r["decode_b1"]["batch"] == 1 and r["decode_b3"]["batch"] == 3
    assert r["decode_b3"]["kv_read_gb"] == pytest.approx(3 * r["decode_b1"]["kv_read_gb"])
    assert r["decode_b3"]["wall_ms"] > 0 and r["decode_b3"]["gpu_ms"] is None  # no CUDA events on the CPU
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
    (parts / "microbench.json").write_text(
        json.dumps(
            {
                "microbench": {
                    "copy_gbs": 4000.0,
                    "decode": [{"context": 4096, "gbs": 3000.0, "fraction_of_copy": 0.75}],
                    "sdpa_decode": [{"context": 4096, "gbs": 2500.0}],
                    "prefill": {"tflops": 200.0, "fraction_of_sdpa": 0.4},
                    "sdpa_prefill": {"tflops": 500.0},
                    "rms_norm": {"gbs": 3200.0},
                    "decode_fp8": {"fp8": {"ms": 0.5}, "bf16": {"ms": 1.0}, "time_ratio": 0.5},
                    "decode_window": {
                        "context": 4096,
                        "window": 1024,
                        "ms": 0.3,
                        "gbs": 2000.0,
                        "fraction_of_copy": 0.5,
                    },
                }
            }
        )
    )
    (parts / "throughput_rawpage.json").write_text(
        json.dumps(
            {
                "throughput_rawpage": {
                    "num_requests": 512,
                    "output_tok_s": 6000.0,
                    "total_tok_s": 36000.0,
                    "startup_s": 30.0,
                    "step_wall_ms": 40.0,
                    "step_build_batch_ms": 0.5,
                    "step_gpu_forward_ms": 35.0,
                    "decode_b256": {
                        "batch": 256,
                        "context": 1024,
                        "graphs": True,
                        "wall_ms": 30.0,
                        "gpu_ms": 25.0,
                        "build_batch_ms": 0.4,
                        "roofline_ms": 12.0,
                        "wall_over_roofline": 2.5,
                        "weight_gb": 16.1,
                        "kv_read_gb": 34.4,
                    },
                }
            }
        )
    )
    (parts / "throughput_hf.json").write_text(json.dumps({"throughput_hf": {"batch": 64, "output_tok_s": 1000.0}}))
    (tmp_path / "k.log").write_text(
        "....\nSKIPPED [3] tests/kernels/test_paged_attention.py:168: a trap on a GPU "
        "poisons the CUDA context\n===== 120 passed, 3 skipped in 80.1s =====\n"
    )
    (tmp_path / "m.log").write_text("========= ERROR SUMMARY: 0 errors\n")
    assert (
        summary.main(
            [
                "--parts",
                str(parts),
                "--kernel-log",
                str(tmp_path / "k.log"),
                "--out-md",
                str(tmp_path / "s.md"),
                "--memcheck-log",
                str(tmp_path / "m.log"),
                "--out-json",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    text = (tmp_path / "s.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "120 passed, 3 skipped" in rows["kernel tests (cuda)"] and rows["kernel tests (cuda)"].endswith("| ok |")
    assert rows["compute-sanitizer memcheck"].endswith("| ok |")
    assert "75% of copy" in rows["decode attention B=64 ctx=4096"] and rows["decode attention B=64 ctx=4096"].endswith(
        "ok |"
    )
    assert rows["prefill attention 8x2048 causal"].endswith("MISS |")
    assert "(0.50x)" in rows["FP8 KV decode attention B=256 ctx=1024"]
    assert rows["FP8 KV decode attention B=256 ctx=1024"].endswith("ok |")
    assert rows["sliding-window decode B=64 ctx=4096 W=1024"].endswith("MISS |")
    assert "(6.0x)" in rows["offline throughput, 512 req, Llama-3-8B shape"]
    assert rows["decode step B=256 ctx=1024, graphs"].endswith("MISS |")
    assert rows["parity vs transformers, bfloat16"].endswith("— |"), "not measured is neither ok nor MISS"
    kernel = json.loads((tmp_path / "r.json").read_text())["kernel_tests"]
    assert (kernel["passed"], kernel["skipped"], kernel["unexpected_skips"], kernel["ok"]) == (120, 3, [], True)


def test_warm_builds_every_module_and_each_decode_head_size():
    from rawpage.ops.launch import cuda_source_dir
    from tools.gpu_check.warm import builds

    jobs = builds()
    assert {name for name, _ in jobs} == {p.name for p in cuda_source_dir().glob("*.cu")}
    decode = [defines for name, defines in jobs if name == "paged_attention_decode.cu"]
    assert decode == [(f"RP_ONE_HEAD_SIZE={d}",) for d in (16, 32, 64, 80, 96, 128, 256)]


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


SAMPLE = Path(__file__).parent / "data" / "gpu_check_h200_2026-11-30"  # figures of the first H200 run; see its README


def test_record_written_from_the_recorded_h200_sample(tmp_path):
    from tools.gpu_check import summary

    status = summary.main(
        [
            "--parts",
            str(SAMPLE / "parts"),
            "--kernel-log",
            str(SAMPLE / "kernel_tests.log"),
            "--memcheck-log",
            str(SAMPLE / "memcheck.log"),
            "--record-dir",
            str(tmp_path / "gpu"),
            "--date",
            "2026-11-30",
            "--gpu",
            "NVIDIA H200",
            "--commit",
            "04f1a5f",
        ]
    )
    assert status == 1, "13 kernel test failures fail the check"
    record = json.loads((tmp_path / "gpu" / "2026-11-30-nvidia-h200-04f1a5f.json").read_text())
    assert (record["gpu"], record["commit"]) == ("NVIDIA H200", "04f1a5f")
    assert (record["kernel_tests"]["passed"], record["kernel_tests"]["failed"], record["kernel_tests"]["ok"]) == (
        198,
        13,
        False,
    )
    assert record["parity"]["bfloat16"]["ok"] and record["parity"]["float32"]["prefill"]["max_rel"] == 1.4e-5
    assert record["microbench"]["prefill"]["tflops"] == 40.0
    assert record["throughput"]["ratio"] == pytest.approx(3356 / 567)
    assert "decode_b1" not in record["throughput"]["rawpage"]
    for key, (wall, roofline) in {"decode_b1": (7.74, 3.96), "decode_b256": (23.4, 12.4)}.items():
        assert {"wall_ms", "gpu_ms", "roofline_ms"} <= set(record[key])
        assert (record[key]["wall_ms"], record[key]["roofline_ms"], record[key]["gpu_ms"]) == (wall, roofline, None)
    assert record["breakdown_b256"]["families"][0]["name"] == "paged_attention_decode"
    assert record["breakdown_b1"]["kernels"] == 424 and record["breakdown_b256"]["total_ms"] == 35.3
    md = (tmp_path / "gpu" / "2026-11-30-nvidia-h200-04f1a5f.md").read_text()
    assert md == record["table_md"] + "\n" and md.startswith("| check | result | target | |")
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    assert rows["kernel tests (cuda)"].endswith("| MISS |") and "13 failed, 198 passed" in rows["kernel tests (cuda)"]
    assert (
        "7.74 ms wall" in rows["decode step B=1 ctx=1024, graphs"]
        and "= 1.95x" in rows["decode step B=1 ctx=1024, graphs"]
    )
    assert "paged_attention_decode 26.60 ms (75%)" in rows["one eager decode step B=256, ncu"]


def test_a_record_always_has_every_key_even_when_nothing_ran():
    from tools.gpu_check.record import build_record, record_name

    record = build_record({}, "2026-12-01", "NVIDIA H200", "abc1234", "| table |")
    for key in (
        "gpu",
        "commit",
        "kernel_tests",
        "parity",
        "microbench",
        "throughput",
        "decode_b1",
        "decode_b256",
        "breakdown_b1",
        "breakdown_b256",
        "lora",
        "spec",
        "vision",
    ):
        assert key in record
    assert record["decode_b1"] is None and record["throughput"] is None
    assert record_name("2026-12-01", "NVIDIA H200 NVL", "abc1234") == "2026-12-01-nvidia-h200-nvl-abc1234"


@pytest.mark.parametrize(
    "log, ok",
    [
        (
            "SKIPPED [210] tests/kernels/conftest.py:90: no GPU visible to CuPy\n== 2 passed, 210 skipped in 3.1s ==",
            False,
        ),
        (
            "SKIPPED [3] tests/kernels/test_paged_attention.py:168: a trap on a GPU poisons the CUDA context\n"
            "== 208 passed, 3 skipped in 90.0s ==",
            True,
        ),
        ("== 200 passed, 2 errors in 90.0s ==", False),
        ("== 1 failed, 210 passed in 90.0s ==", False),
        ("== 211 skipped in 1.0s ==", False),
    ],
    ids=["gpu_skips", "trap_skips", "errors", "failed", "nothing_passed"],
)
def test_kernel_step_passes_only_without_failures_or_unexpected_skips(tmp_path, log, ok):
    from tools.gpu_check.summary import failures, pytest_result

    (tmp_path / "k.log").write_text(log + "\n")
    result = pytest_result(str(tmp_path / "k.log"))
    assert result["ok"] is ok
    assert bool(failures({"kernel_tests": result})) is not ok


# Synthetic, in the layout of `ncu --csv --print-units base` (kernel names shortened)
NCU_CSV = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
profiled one decode step
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","fused_add_rms_norm_bf16","1","13","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","15,008"
"1","4242","python3.12","127.0.0.1","nvjet_tst_64x8_64x16_4x1_v_bz_TNT","1","13","(128, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","40,512"
"2","4242","python3.12","127.0.0.1","paged_attention_decode_bf16_d128","1","13","(128, 1, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","50,000"
"3","4242","python3.12","127.0.0.1","paged_attention_decode_reduce_bf16","1","13","(128, 1, 1)","(32, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","4.5"
"4","4242","python3.12","127.0.0.1","fused_add_rms_norm_bf16","1","13","(1024, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns","14,992"
==PROF== Disconnected from process 4242
"""


def test_ncu_csv_is_summed_by_kernel_family():
    from tools.gpu_check.breakdown import parse_ncu_csv

    r = parse_ncu_csv(NCU_CSV)
    assert r["kernels"] == 5 and r["total_ms"] == pytest.approx(0.125012)
    fams = {f["name"]: f for f in r["families"]}
    assert set(fams) == {
        "paged_attention_decode",
        "gemm (cuBLAS)",
        "fused_add_rms_norm",
        "paged_attention_decode_reduce",
    }
    assert fams["fused_add_rms_norm"]["launches"] == 2 and fams["fused_add_rms_norm"]["ms"] == 0.03
    assert fams["paged_attention_decode_reduce"]["ms"] == 0.0045
    assert r["families"][0]["name"] == "paged_attention_decode"
    with pytest.raises(ValueError, match="cudaProfilerStart"):
        parse_ncu_csv("==PROF== no kernels were profiled\n")


def test_breakdown_without_ncu_says_so(monkeypatch, tmp_path):
    from tools.gpu_check import breakdown

    monkeypatch.setattr(breakdown, "find_ncu", lambda: None)
    r = breakdown.main(["--batches", "1,256", "--result-file", str(tmp_path / "b.json")])
    assert r == {"breakdown_b1": {"skipped": "ncu not found"}, "breakdown_b256": {"skipped": "ncu not found"}}


def test_check_fails_loudly_when_a_gpu_is_visible_but_cupy_cannot_import(tmp_path):
    """The whole script, on the first H200 run's failure: a GPU on nvidia-smi, CuPy
    broken by an import error. It must stop, show the error and exit 1."""
    bin_dir, broken = tmp_path / "bin", tmp_path / "broken" / "cupy"
    bin_dir.mkdir()
    broken.mkdir(parents=True)
    (bin_dir / "nvidia-smi").write_text(
        '#!/bin/sh\nif [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H200 (UUID: x)"; else echo "NVIDIA H200"; fi\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    (broken / "__init__.py").write_text("raise ImportError(\"cannot import name 'pathfinder' from 'cuda'\")\n")
    env = dict(
        os.environ,
        OUT=str(tmp_path / "out"),
        PYTHON=sys.executable,
        RECORD_DIR=str(tmp_path / "gpu"),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(broken.parent),
        GIT_COMMIT="abc1234",
    )
    out = subprocess.run(["bash", "tools/gpu_check.sh"], env=env, capture_output=True, text=True, timeout=120)
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert out.returncode == 1, log
    assert (
        "FATAL: GPU 0: NVIDIA H200 (UUID: x) is visible, but CuPy cannot use it: ImportError: cannot import name 'pathfinder'"
        in log
    )
    assert "FAILED: kernel tests: not run" in log and "== kernels" not in log
    record = json.loads(next((tmp_path / "gpu").glob("*-nvidia-h200-abc1234.json")).read_text())
    assert record["kernel_tests"] is None and record["env"]["cupy_problem"].startswith("ImportError")


def test_breakdown_child_runs_its_steps_on_the_cpu(tiny_config_file):
    from tools.gpu_check import breakdown

    # prefill, 3 warm-up steps, the profiled one: still every sequence decoding
    assert breakdown.run_step(2, 20, tiny_config_file, device="cpu") == 2


@pytest.mark.live  # compares with transformers, as the GPU rows do
def test_family_rows_run_on_the_cpu_at_tiny_widths():
    """The families step's code (config, transformers' model, Hub names incl. Mixtral's
    split expert stacks, our model, comparison) on the CPU: float32 agrees to 1e-4."""
    from tools.gpu_check import families

    r = families.main(["--device", "cpu", "--tiny", "--prompt-lens", "5,20"])
    assert set(r) == set(families.FAMILIES)
    for family, row in r.items():
        assert row["ok"] and row["prefill"]["max_rel"] < 1e-4 and row["rows_within"] == 1.0, (family, row)
    rows = families.summary_rows(r)
    assert len(rows) == 4 and all(v == "ok" for *_, v in rows)
    assert families.failed({"qwen3-8b": {"ok": False, "error": "x"}}) == ["family parity qwen3-8b"]


@pytest.mark.live  # compares with transformers, as the GPU rows do
def test_a_bfloat16_family_row_is_judged_against_transformers_own_bfloat16():
    """In bfloat16 the truth is transformers' float32 and the yardstick its own bfloat16
    run: the row reports both and passes when ours is no further from float32."""
    from tools.gpu_check import families

    r = families.main(
        ["--families", "phi-3-mini", "--device", "sim", "--tiny", "--prompt-lens", "5,20", "--dtype", "bfloat16"]
    )
    row = r["phi-3-mini"]
    assert row["dtype"] == "bfloat16" and 0 < row["theirs"]["max_rel"] < 0.05 and row["ok"], row
    fig, target, verdict = families.summary_rows(r)[3][1:]
    assert "transformers bfloat16: rel" in fig and "no further from float32" in target and verdict == "ok"


def test_family_configs_are_the_real_shapes():
    from tools.gpu_check.families import family_config

    mixtral = family_config("mixtral-8x7b")
    assert (mixtral["hidden_size"], mixtral["intermediate_size"], mixtral["num_local_experts"]) == (4096, 14336, 8)
    assert mixtral["num_hidden_layers"] == 2
    gemma = family_config("gemma-3-12b")
    assert (gemma["hidden_size"], gemma["head_dim"], gemma["vocab_size"]) == (3840, 256, 262208)
    phi = family_config("phi-3-mini")
    assert len(phi["rope_scaling"]["short_factor"]) == phi["hidden_size"] // phi["num_attention_heads"] // 2


@pytest.mark.live  # compares with transformers, as the GPU rows do
def test_int4_parity_row_runs_on_sim_with_weights_kept_packed():
    from tools.gpu_check import quant

    r = quant.main(["--parts", "parity", "--device", "sim", "--tiny", "--layers", "1", "--prompt-lens", "5,20"])
    assert r["parity"]["ok"] and r["parity"]["decode"]["max_rel"] < 1e-4, r
    assert quant.summary_rows(r)[0][3] == "ok"


def test_quant_arithmetic_and_rows():
    from tools.gpu_check import quant

    assert quant.int4_bytes(4096, 4096) == 4096 * 2048 + 4 * 4096 * 32
    assert quant.crossover({1: 1.0, 2: 1.5, 4: 3.0}, {1: 2.0, 2: 2.0, 4: 2.0, 16: 2.0}) == 4
    assert quant.crossover({1: 1.0}, {1: 2.0}) is None
    sample = {
        "decode": {
            "int4_ms": 0.1,
            "bf16_ms": 0.3,
            "bf16_over_int4": 3.0,
            "roofline_ms": 0.08,
            "over_roofline": 1.25,
            "ok": True,
        },
        "prefill": {"int4_ms": 1.0, "bf16_ms": 0.9, "bf16_over_int4": 0.9, "ok": True},
        "crossover": {"int4": {"gemv_ms": {"1": 0.1}, "scratch_ms": {"1": 0.2, "16": 0.3}, "crossover_tokens": None}},
    }
    rows = {name: (fig, verdict) for name, fig, _, verdict in quant.summary_rows(sample)}
    assert rows["int4 decode B=1, one 8B layer's Linears"][1] == "ok"
    assert "= 1.25x" in rows["int4 decode B=1, one 8B layer's Linears"][0]
    assert "T=16: nan/0.300" in rows["int4 GEMV vs scratch+cuBLAS crossover, 4096x4096"][0]
    assert quant.failed({"parity": {"ok": False}}) == ["int4 logit parity"]


def test_rows_within_counts_rows_against_the_global_scale():
    from tools.gpu_check.parity import rows_within

    theirs = [np.array([[10.0, 0.0], [1.0, 1.0]]), np.array([[0.0, 2.0]])]
    ours = [np.array([[10.0, 0.0], [1.0, 2.0]]), np.array([[0.0, 2.1]])]  # row 2 off by 1 = 10% of 10
    assert rows_within(ours, theirs, 0.05) == pytest.approx(2 / 3)


def test_lora_step_runs_on_the_cpu_and_reaches_the_table(tiny_config_file, tmp_path):
    """tools/bench_lora.py with the GPU check's arguments, on a tiny dummy model on the CPU."""
    from tools import bench_lora
    from tools.gpu_check.summary import rows

    out = tmp_path / "lora.json"
    args = ["--model", tiny_config_file, "--load-format", "dummy", "--batch", "4", "--adapters", "2"]
    bench_lora.main(
        args + ["--rank", "4", "--prompt-len", "8", "--output-len", "4", "--repeats", "1", "--result-file", str(out)]
    )
    r = json.loads(out.read_text())
    assert r["lora"]["lora_decode_tok_s"] > 0 and r["lora"]["base_decode_tok_s"] > 0
    (row,) = [x for x in rows(r, None, None) if x[0].startswith("multi-LoRA")]
    assert row[2] == ">= 0.8x no-LoRA decode" and row[3] in ("ok", "MISS")


def test_spec_step_runs_on_the_cpu_and_reaches_the_table(tiny_config_file, tmp_path):
    """tools/gpu_check/spec.py on a tiny dummy model on the CPU: both engines, the same greedy
    tokens, the figures the table reads; and the table's row, and its row when the step did not run."""
    from tools.gpu_check import spec
    from tools.gpu_check.summary import failures, rows

    out = tmp_path / "spec.json"
    args = ["--device", "cpu", "--dtype", "float32", "--config", tiny_config_file, "--prompt-len", "16"]
    r = spec.main(args + ["--output-len", "48", "--max-model-len", "256", "--result-file", str(out)])
    assert r == json.loads(out.read_text())["spec"]
    assert r["outputs_match"] and r["first_difference"] is None
    assert r["plain_decode_tok_s"] > 0 and r["ngram_decode_tok_s"] > 0 and r["k"] == 4
    assert r["speedup"] == pytest.approx(r["ngram_decode_tok_s"] / r["plain_decode_tok_s"])
    # the random model's greedy output repeats itself, so lookup drafts and some drafts are accepted
    assert r["drafted_tokens"] > 0 and 0 < r["acceptance_rate"] <= 1 and r["mean_accepted_length"] > 1
    assert r["decode_step"]["steps"] > 0 and r["decode_step"]["gpu_ms"] is None  # no CUDA events on the CPU
    assert sum(c["steps"] for c in r["verify_steps"].values()) > 0
    assert r["verification_graphs_captured"] is None and r["graph_replays_ngram"] is None  # no graphs on the CPU
    (row,) = [x for x in rows({"spec": r}, None, None) if x[0].startswith("n-gram speculation")]
    assert "tokens identical" in row[1] and row[3] == "ok"
    assert not [f for f in failures({"spec": r}) if f.startswith("spec")]
    differ = {**r, "outputs_match": False, "first_difference": 7}
    (row,) = [x for x in rows({"spec": differ}, None, None) if x[0].startswith("n-gram speculation")]
    assert row[3] == "MISS" and "spec: greedy tokens differ from no speculation at output token 7" in failures(
        {"spec": differ}
    )
    (row,) = [x for x in rows({}, None, None) if x[0].startswith("n-gram speculation")]
    assert row[1] == "not measured"


def test_spec_step_fails_loudly_when_the_tokens_differ(tiny_config_file, monkeypatch, capsys):
    from tools.gpu_check import spec

    real = spec.first_difference
    monkeypatch.setattr(spec, "first_difference", lambda a, b: 3 if real(a, b) is None else real(a, b))
    with pytest.raises(SystemExit) as e:
        spec.main(
            [
                "--device",
                "cpu",
                "--dtype",
                "float32",
                "--config",
                tiny_config_file,
                "--output-len",
                "8",
                "--max-model-len",
                "256",
            ]
        )
    assert e.value.code == 1 and "differ at output token 3" in capsys.readouterr().err


def test_spec_step_raises_when_the_engine_fails_the_request(tiny_config_file):
    """A request the engine fails (its step raised) stops the tool with the error, never a hang."""
    import argparse

    from tools.gpu_check import spec

    args = argparse.Namespace(config=tiny_config_file, device="cpu", dtype="float32", max_model_len=64)
    llm = spec.make_llm(args, spec.spec_config(4), 0.4)

    def broken(*a, **k):
        raise RuntimeError("injected")

    llm.engine.runner.execute = broken
    with pytest.raises(RuntimeError, match="request r failed in the engine: RuntimeError: injected"):
        spec.run_request(llm.engine, spec.NoTimer(), [1, 2, 3], 8, "r")


def test_vision_step_runs_under_sim_and_reaches_the_table(tmp_path):
    """tools/gpu_check/vision.py on --device sim (the cuda backend's kernels and launch code on
    the CPU): the tiny VLMs (Gemma 3, Qwen2.5-VL) within the golden tolerances; the table's row
    and the check's verdict."""
    pytest.importorskip("PIL")
    from tools.gpu_check import vision
    from tools.gpu_check.summary import failures, rows

    out = tmp_path / "vision.json"
    r = vision.main(["--device", "sim", "--result-file", str(out)])
    assert r == json.loads(out.read_text())["vision"]
    assert r["ok"] and r["greedy_matches"] and r["logits_max_diff"] < 1e-3 and r["encode_ms"] > 0
    assert r["qwen_greedy_matches"] and r["qwen_encoder_max_diff"] < 1e-4  # its ViT on the kernels too
    (row,) = [x for x in rows({"vision": r}, None, None) if x[0].startswith("tiny Gemma 3 VLM")]
    assert row[3] == "ok" and "greedy identical" in row[1] and "(sim)" in row[0]
    assert not [f for f in failures({"vision": r}) if f.startswith("vision")]
    off = {**r, "ok": False, "greedy_matches": False}
    (row,) = [x for x in rows({"vision": off}, None, None) if x[0].startswith("tiny Gemma 3 VLM")]
    assert row[3] == "MISS" and [f for f in failures({"vision": off}) if "greedy DIFFERS" in f]
    (row,) = [x for x in rows({}, None, None) if x[0].startswith("tiny Gemma 3 VLM")]
    assert row[1] == "not measured"
