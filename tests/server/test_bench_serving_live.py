"""tools/bench_serving.py against a real rawpage server, on a tiny workload."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_serving_against_rawpage(server, tmp_path):
    out = tmp_path / "result.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_serving.py"),
        "--base-url",
        server.url,
        "--dataset",
        "random",
        "--random-input-len",
        "16:32",
        "--random-output-len",
        "8:8",
        "--num-prompts",
        "4",
        "--request-rate",
        "inf",
        "--max-concurrency",
        "2",
        "--result-file",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["completed"] == 4 and s["failed"] == 0
    assert s["total_output_tokens"] == 32 and s["output_len_mismatches"] == 0
    assert s["token_count_sources"] == {"usage": 4}
    assert s["ttft"]["median_ms"] > 0 and s["tpot"]["median_ms"] > 0
    assert "TTFT" in done.stdout  # the summary table was printed
