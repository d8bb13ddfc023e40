"""The benchmark tools run (on a tiny model) and document their flags."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_ENV = dict(os.environ, PYTHONPATH=str(ROOT))  # the tools import this checkout's rawpage
TOOLS = [
    "bench_throughput.py",
    "bench_sharing.py",
    "bench_cpu_threads.py",
    "cpu_burner.py",
    "bench_serving.py",
    "bench_structured.py",
    "bench_api_overhead.py",
    "compare.py",
    "make_golden.py",
    "profile_step.py",
    "make_shaped_gguf.py",
    "bench_cpu_kernels.py",
    "bench_vision_tower.py",
    "bench_sampler.py",
    "bench_cpu_attention.py",
]


@pytest.mark.parametrize("tool", TOOLS)
def test_help(tool):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=CHECKOUT_ENV,
    )
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr


def test_bench_sampler_prints_a_row_per_parameter_set():
    out = subprocess.run(
        [
            sys.executable,
            "tools/bench_sampler.py",
            "--vocab",
            "3000",
            "--batches",
            "1",
            "4",
            "--calls",
            "2",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=CHECKOUT_ENV,
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")]  # the header, then a row each
    assert [r.split(" | ")[0][2:] for r in rows[1:]] == [
        "greedy",
        "temperature 1.0",
        "temperature 0.7, top_p 0.9",
        "top_k 40, top_p 0.95, min_p 0.05, temperature 0.8",
    ]


@pytest.mark.parametrize("shape", ["1b", "3b"])
def test_bench_cpu_attention_at_real_shapes_prints_a_row_per_cell(shape):
    """--shape 1b: Llama-3.2-1B's 32 query and 8 KV heads of 64; 3b: 24 and 8 heads of 128.
    One row per (dtype, batch, context)."""
    cmd = [sys.executable, "tools/bench_cpu_attention.py", "--shape", shape, "--batches", "1", "2", "--contexts", "40"]
    cmd += ["--dtypes", "float32", "--min-time", "0", "--min-calls", "1", "--cold-bytes", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120, env=CHECKOUT_ENV)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("float32")]
    assert [(r[1], r[2]) for r in rows] == [("1", "40"), ("2", "40")]


@pytest.mark.parametrize("static", [False, True])
def test_bench_throughput_on_a_tiny_model(tiny_model_dir, tmp_path, static):
    result = tmp_path / "r.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_throughput.py"),
        "--model",
        tiny_model_dir,
        "--num-requests",
        "6",
        "--input-len",
        "8:40",
        "--output-len",
        "4:12",
        "--vocab",
        "400",
        "--max-num-seqs",
        "4",
        "--quiet",
        "--result-file",
        str(result),
    ] + (["--static-batching"] if static else [])
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    r = json.loads(result.read_text())
    assert r["mode"] == ("static" if static else "continuous") and r["num_requests"] == 6
    assert r["output_tokens"] > 0 and r["output_tok_per_s"] > 0


def test_bench_vision_tower_prints_its_table():
    cmd = [sys.executable, str(ROOT / "tools" / "bench_vision_tower.py"), "--tokens", "40", "--repeats", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=CHECKOUT_ENV)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| qkv", "| fc2", "| attention"))]
    assert len(rows) == 3, out.stdout


def test_cpu_burner_returns_the_command_status():
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "cpu_burner.py"),
        "--cores",
        "1",
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
    ]
    assert subprocess.run(cmd, cwd=ROOT, timeout=60).returncode == 3


def test_cpu_burner_in_bursts_keeps_part_of_a_core_busy():
    """--busy-ms 5 --idle-ms 15: the burner's CPU time is about a quarter of the time
    the command runs, neither idle nor a whole core."""
    cmd = [sys.executable, str(ROOT / "tools" / "cpu_burner.py"), "--busy-ms", "5", "--idle-ms", "15", "--"]
    cmd += [sys.executable, "-c", "import time; time.sleep(1.5)"]
    start = os.times()
    assert subprocess.run(cmd, cwd=ROOT, timeout=60).returncode == 0
    end = os.times()
    # the burner runs in a grandchild (multiprocessing under the tool): its CPU lands in
    # the tool's children times once reaped, and the tool is our child
    cpu = (end.children_user + end.children_system) - (start.children_user + start.children_system)
    assert 0.1 < cpu < 1.2, cpu
    bad = [sys.executable, str(ROOT / "tools" / "cpu_burner.py"), "--idle-ms", "5", "--", "true"]
    assert subprocess.run(bad, cwd=ROOT, timeout=60, capture_output=True).returncode == 2


def test_bench_cpu_kernels_against_a_build_prints_both_rows():
    """--against: this build's decode step and another library's (here the same one)."""
    from rawpage.native.library import native_kernels

    lib = native_kernels()
    if lib is None:
        pytest.skip("the native kernels do not build here")
    cmd = [sys.executable, "tools/bench_cpu_kernels.py", "--against", str(lib.so_path), "--shape", "135m"]
    cmd += ["--formats", "Q8_0", "--threads", "1", "--rounds", "2", "--path", lib.path]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=CHECKOUT_ENV)
    assert out.returncode == 0, out.stderr
    rows = [line.split(" | ")[0] for line in out.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["| this build", "| other"], out.stdout


def test_bench_cpu_kernels_against_a_build_prefill_prints_a_row_per_gemm():
    """--against-prefill: each format's gate|up and down at each token count, both builds."""
    from rawpage.native.library import native_kernels

    lib = native_kernels()
    if lib is None:
        pytest.skip("the native kernels do not build here")
    cmd = [sys.executable, "tools/bench_cpu_kernels.py", "--against-prefill", str(lib.so_path), "--shape", "135m"]
    cmd += ["--formats", "Q8_0", "Q4_K", "--threads", "1", "--rounds", "1", "--prefill-tokens", "4", "--path", lib.path]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300, env=CHECKOUT_ENV)
    assert out.returncode == 0, out.stderr
    rows = [line.split(" | ")[:3] for line in out.stdout.splitlines() if line.startswith("| Q")]
    # 135m's 576-wide rows are no multiple of Q4_K's 256-value block: only Q8_0 runs
    assert [(r[0], r[1].split()[0], r[2]) for r in rows] == [("| Q8_0", "gate_up", "4"), ("| Q8_0", "down", "4")]
    assert all(len(line.split(" | ")) == 6 for line in out.stdout.splitlines() if line.startswith("| Q"))


def test_bench_cpu_threads_on_a_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "r.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_cpu_threads.py"),
        "--model",
        str(tiny_model_dir),
        "--batches",
        "1",
        "3",
        "--threads",
        "1",
        "2",
        "--steps",
        "3",
        "--json",
        str(out),
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=CHECKOUT_ENV)
    assert r.returncode == 0, r.stderr
    table = json.loads(out.read_text())["decode_tok_per_s"]
    assert set(table) == {"batch 1", "batch 3"} and all(v > 0 for row in table.values() for v in row.values())


def test_bench_cpu_threads_busy_ratio_on_a_tiny_model(tiny_model_dir):
    cmd = [sys.executable, str(ROOT / "tools" / "bench_cpu_threads.py"), "--model", str(tiny_model_dir)]
    cmd += ["--pairs", "2", "--batches", "1", "--steps", "3", "--settle", "0.2"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=CHECKOUT_ENV)
    assert r.returncode == 0, r.stderr
    (ratio,) = json.loads(r.stdout)["busy_ratio"]
    assert len(ratio["pairs"]) == 2 and all(p["quiet"] > 0 and p["busy"] > 0 for p in ratio["pairs"])
    assert ratio["median_ratio"] == pytest.approx(sum(p["ratio"] for p in ratio["pairs"]) / 2)


def test_bench_structured_on_a_tiny_model(tiny_model_dir):
    cmd = [
        sys.executable,
        "-m",
        "tools.bench_structured",
        "--model",
        tiny_model_dir,
        "--batch",
        "2",
        "--tokens",
        "4",
        "--repeats",
        "1",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ms per token" in out.stdout and "| 2 |" in out.stdout


def test_profile_step_shows_expert_load_of_a_moe_model(tmp_path, capsys):
    """A tiny Mixtral on the cpu: the profile prints each layer's expert load and the
    experts' GEMM FLOPs, which count the routed rows (batch x top-k per step)."""
    from tests.tiny_families import family_config, write_family
    from tools import profile_step

    folder = write_family(str(tmp_path / "mixtral"), "mixtral")
    profile_step.main(["--model", folder, "--batch", "3", "--context", "8", "--steps", "2"])
    out = capsys.readouterr().out
    cfg = family_config("mixtral")
    assert "expert load over 2 steps" in out and "layer   0:" in out
    routed = 3 * cfg["num_experts_per_tok"] * cfg["num_hidden_layers"]  # per step
    gflop = 2 * routed * 3 * cfg["intermediate_size"] * cfg["hidden_size"] / 1e9
    assert f"expert GEMMs: {gflop:.3f} GFLOP per step" in out


def test_profile_step_times_a_prefill(tiny_model_dir, capsys):
    """--prefill: 6 prompts of 40 tokens in chunks of 64, after a warm-up prompt of its own
    (untimed): all 240 prompt tokens are timed, and the ops' shares are printed."""
    from tools import profile_step

    profile_step.main(
        [
            "--model",
            str(tiny_model_dir),
            "--batch",
            "6",
            "--context",
            "40",
            "--prefill",
            "--max-num-batched-tokens",
            "64",
        ]
    )
    out = capsys.readouterr().out
    assert "prefill: 240 prompt tokens in 4 steps" in out
    # linear counts its matmul (the outermost timed call), so matmul never shows beside it
    assert "  linear " in out and "paged_attention" in out and "  matmul " not in out
    # one prompt that fits one step is measured too (it used to be the warm-up, and divide by zero)
    profile_step.main(["--model", str(tiny_model_dir), "--batch", "1", "--context", "40", "--prefill"])
    assert "prefill: 40 prompt tokens in 1 steps" in capsys.readouterr().out


@pytest.mark.parametrize("shape", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_a_shaped_file_loads_as_its_shape(tmp_path, shape):
    """tools/make_shaped_gguf.py writes what convert_hf_to_gguf would (names, keys, F16
    matrices, the default model's tokenizer): rawpage reads it back at that shape."""
    from rawpage import LLM, SamplingParams
    from tools.make_shaped_gguf import SHAPES, write_shaped_gguf

    s = SHAPES[shape]
    path = write_shaped_gguf(tmp_path / f"{shape}.gguf", shape)
    llm = LLM(str(path), max_model_len=64, kv_cache_memory="8MiB")
    c = llm.engine.model_config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (
        s.hidden,
        s.layers,
        s.heads,
        s.kv_heads,
        s.head_dim,
    )
    assert c.intermediate_size == s.ffn and c.vocab_size == s.vocab and c.tie_word_embeddings == s.tied
    out = llm.generate(["Hello"], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0))[0]
    assert len(out.outputs[0].token_ids) == 4  # random weights never stop: fixed-length replies


def test_a_shaped_vision_model_takes_images_through_its_mmproj(tmp_path):
    """A shape with a vision tower: the text GGUF knows Gemma 3's image tokens and its
    template places an image part; the mmproj (clip GGUF) gives the tower at its shape."""
    pytest.importorskip("PIL")
    from rawpage import LLM, SamplingParams
    from tests.tiny_vlm import seeded_image
    from tools.make_shaped_gguf import SHAPES, write_mmproj, write_shaped_gguf

    v = SHAPES["tiny-gemma3"].vision
    model = write_shaped_gguf(tmp_path / "m.gguf", "tiny-gemma3")
    mmproj = write_mmproj(tmp_path / "mmproj.gguf", "tiny-gemma3")
    llm = LLM(str(model), mmproj=str(mmproj), max_model_len=128, kv_cache_memory="8MiB")
    vc = llm.engine.model_config.vision
    assert (vc.hidden_size, vc.num_layers, vc.num_heads, vc.intermediate_size) == (v.hidden, v.layers, v.heads, v.ffn)
    assert (vc.image_size, vc.patch_size, vc.tokens_per_image) == (v.image, v.patch, v.tokens)
    assert [vc.boi_token_id, vc.image_token_id, vc.eoi_token_id] == [49152, 49153, 49154]  # appended to SmolLM2's
    image = {"type": "image_pil", "image_pil": seeded_image(0, 40, 30)}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0))
    assert out.prompt_token_ids.count(vc.image_token_id) == v.tokens and len(out.outputs[0].token_ids) == 4


def compare_tool():
    """tools/compare.py as a module (it runs as a script, its folder on sys.path)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import compare
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return compare


def test_compare_rounds_alternate_the_engines_and_take_the_median_ratio(monkeypatch, tmp_path):
    """--rounds N: A B, B A, A B ...; each engine's table row is its median run, and the
    ratio is the median of the rounds' own ratios (each pair adjacent in time)."""
    compare = compare_tool()
    started, speed = [], {"rawpage": [30.0, 50.0, 36.0], "llama-server-vnni": [20.0, 40.0, 30.0]}

    class Proc:
        def terminate(self):
            pass

        def wait(self, timeout):
            pass

    monkeypatch.setattr(compare, "servers", lambda args, gguf: {"rawpage": ["a"], "llama-server-vnni": ["b"]})
    monkeypatch.setattr(compare.subprocess, "Popen", lambda cmd, **kw: started.append(cmd[0]) or Proc())
    monkeypatch.setattr(compare, "wait_ready", lambda url, proc: None)
    monkeypatch.setattr(
        compare,
        "bench_serving",
        lambda args, engine, c, out, r: {"output_throughput": speed[engine][r], "round": r},
    )
    args = SimpleNamespace(rounds=3, concurrency=[1], prefill_prompt_tokens=0, port=1)
    serving, prefill, rounds = compare.run_serving(args, "m.gguf", tmp_path)
    assert started == ["a", "b", "b", "a", "a", "b"]
    assert serving["rawpage"][1]["round"] == 2 and serving["llama-server-vnni"][1]["round"] == 2  # the medians
    assert rounds == {"llama-server-vnni": {1: [1.5, 1.25, 1.2]}}
    line = compare.ratio_text(serving, rounds["llama-server-vnni"][1], "llama-server-vnni", 1)
    assert line == "c=1: 1.25x (median of 3 alternating rounds, 1.20-1.50x)"


def test_compare_keeps_the_levels_a_run_did_not_measure_with_their_own_commits():
    """A run at c=4,16 after one at c=1 keeps c=1's row (and its rounds), and the Measured
    line says which rows came from which commit."""
    compare = compare_tool()
    old, new = {"date": "d1", "commit": "aaa"}, {"date": "d2", "commit": "bbb"}
    prev = {"rawpage": {"1": {"output_throughput": 30.0, "measured": old}, "4": {"output_throughput": 60.0}}}
    now = {
        "rawpage": {4: {"output_throughput": 70.0, "measured": new}, 16: {"output_throughput": 80.0, "measured": new}}
    }
    serving = compare.merge_levels(prev, now, set())
    assert {c: s["output_throughput"] for c, s in serving["rawpage"].items()} == {1: 30.0, 4: 70.0, 16: 80.0}
    rounds = compare.merge_levels({"peer": {"1": [1.2], "4": [1.9]}}, {}, {4, 16})
    assert rounds == {"peer": {1: [1.2]}}  # c=4 was measured again without rounds
    line = compare.when_text("rawpage", new, {"serving": serving, "prefill": {"rawpage": {"measured": old}}})
    assert line == "rawpage: c=1/prefill d1 `aaa`, c=4/c=16 d2 `bbb`"
    # Rows that name their CPU say where they ran: the same commit on two machines is two groups.
    here, there = {**new, "cpu": "Intel(R) Xeon(R) Processor"}, {**new, "cpu": "AMD EPYC"}
    serving = {"rawpage": {1: {"measured": here}, 4: {"measured": there}, 16: {"measured": here}}}
    line = compare.when_text("rawpage", here, {"serving": serving, "prefill": {}})
    assert line == "rawpage: c=1/c=16 d2 `bbb` on Intel(R) Xeon(R) Processor, c=4 d2 `bbb` on AMD EPYC"
    assert compare.when_text("rawpage", here, {"serving": {"rawpage": {1: {"measured": here}}}, "prefill": {}}) == (
        "rawpage: d2, commit `bbb` on Intel(R) Xeon(R) Processor"
    )
    assert compare.cpu_model()  # /proc/cpuinfo's model name (or the platform's) names this machine


def test_compare_refuses_a_port_another_server_holds():
    """A server left from an interrupted run would answer for both engines."""
    import socket

    compare = compare_tool()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(SystemExit, match=f"port {port} is taken"):
            compare.require_free_port(port)
    compare.require_free_port(port)  # closed: free again
