"""`rawpage bench serve` (vLLM's `vllm bench serve`) against a real rawpage server, on a tiny
workload: vLLM's table on stdout, vLLM's keys and rawpage's records in the saved result."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rawpage_bench_serve_against_rawpage(server, tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "rawpage", "bench", "serve", "--base-url", server.url, "--backend", "openai-chat"]
    cmd += ["--dataset-name", "random", "--random-input-len", "16:32", "--random-output-len", "8", "--ignore-eos"]
    cmd += ["--num-prompts", "4", "--request-rate", "inf", "--max-concurrency", "2", "--save-result", "--save-detailed"]
    cmd += ["--result-filename", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    table = done.stdout[done.stdout.index("============ Serving Benchmark Result ============") :].splitlines()
    labels = [line[:40].strip() for line in table if line[40:41] == " "]
    assert labels[:4] == [
        "Successful requests:",
        "Failed requests:",
        "Maximum request concurrency:",
        "Benchmark duration (s):",
    ]
    for label in ["Total input tokens:", "Total generated tokens:", "Request throughput (req/s):"]:
        assert label in labels
    for label in ["Output token throughput (tok/s):", "Total token throughput (tok/s):"]:
        assert label in labels
    for metric in ["TTFT", "TPOT", "ITL"]:
        assert [f"{kind} {metric} (ms):" in labels for kind in ("Mean", "Median", "P99")] == [True] * 3
    assert "Successful requests:                     4 " in table[1]
    assert "Total generated tokens:                  32 " in "\n".join(table)
    r = json.loads(out.read_text())
    assert (r["completed"], r["failed"], r["total_output_tokens"], r["max_concurrency"]) == (4, 0, 32, 2)
    assert r["median_ttft_ms"] > 0 and r["p99_tpot_ms"] > 0 and r["output_lens"] == [8] * 4
    s = r["summary"]
    assert s["output_len_mismatches"] == 0 and s["token_count_sources"] == {"usage": 4}
    assert [q["output_tokens"] for q in r["requests"]] == [8] * 4
