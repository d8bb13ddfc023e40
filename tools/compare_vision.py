"""`make compare`'s vision mode: images in, text out, rawpage against llama-server (issue 45).

    make compare MODEL=../models-shaped/gemma-3-4b-Q4_K_M.gguf MMPROJ=../models-shaped/mmproj-gemma-3-4b-F16.gguf
    (tools/compare.py --model M --mmproj P [--llama-server-vnni BIN] [--vision-sizes 448,896] ...)

The same text GGUF and mmproj (tools/make_shaped_gguf.py --shape gemma-3-4b writes both,
random weights at Gemma 3 4B's shapes) served by `rawpage serve --mmproj` and by
llama-server --mmproj, one engine at a time, each with --threads threads. Each request is
an OpenAI chat request with one image as a data URL (a JPEG of seeded noise; every request
its own image, so that neither engine's caches answer it) and a line of text:

1. TTFT at c=1: for each image size, --vision-repeats requests with max_tokens 1, one at
   a time; the time to the whole one-token reply is the time to the first token (no
   streaming, so the same for both engines). The engine's own encode time of each image
   comes from its log: rawpage's "image encoded in N ms"; llama-server's (at -lv 4) time
   from "encoding mtmd batch" to "decoding image batch", its vision tower and projector.
2. Throughput at c=4: --vision-c4-requests requests, each with its own image, --vision-output
   tokens each (ignore_eos), at most 4 at once; output tok/s = completion tokens / wall time.

A warm-up request (a small image) runs first on each engine. The summary goes to
docs/bench/compare-vision-{model}.json and the tables into docs/benchmarks.md between
<!-- compare:vision-{model}:start --> and <!-- compare:vision-{model}:end -->.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RAWPAGE_ENCODE = re.compile(r"image encoded in (\d+) ms")
# llama-server at -lv 4 logs when it starts a slot's image batch and when it decodes its
# embeddings, each line stamped minutes.seconds.ms.us from its start
LLAMA_LINE = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*?(encoding mtmd batch|decoding image batch 1/)", re.M)
PROMPT = "Describe this image in detail."


def image_jpeg(seed: int, size: int) -> bytes:
    """A seeded size x size RGB JPEG: smooth colour fields plus noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    base = np.stack([np.sin(6 * xx + c) * np.cos(4 * yy - c) for c in rng.uniform(0, 3, 3)], axis=-1)
    pixels = np.clip(127.5 * (1 + 0.8 * base) + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def chat_body(model: str, jpeg: bytes, max_tokens: int) -> dict:
    url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": PROMPT}]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,  # both engines take it: fixed-length replies from random weights
    }


async def timed_request(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    t0 = time.perf_counter()
    r = await client.post(url + "/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
    usage = r.json().get("usage") or {}
    return {"s": seconds, "completion_tokens": usage.get("completion_tokens", 0)}


def encode_times(log: Path, engine: str, start: int) -> list[float]:
    """ms of each image encode logged past byte `start` of the server's log (one request at a time)."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    if engine == "rawpage":
        return [float(m) for m in RAWPAGE_ENCODE.findall(text)]
    out, began = [], None
    for m in LLAMA_LINE.finditer(text):
        minutes, sec, ms, us, what = m.groups()
        t = (int(minutes) * 60 + int(sec)) * 1e3 + int(ms) + int(us) / 1e3
        if what.startswith("encoding"):
            began = t
        elif began is not None:
            out.append(round(t - began, 1))
            began = None
    return out


async def measure(args, engine: str, log: Path) -> dict:
    url, name = f"http://127.0.0.1:{args.port}", args.served_name
    seed = iter(range(1_000_000))  # every request its own image
    out: dict = {"c1": {}}
    async with httpx.AsyncClient(timeout=3600) as client:
        await timed_request(client, url, chat_body(name, image_jpeg(next(seed), 64), 1))  # warm-up
        for size in args.vision_sizes:
            start = log.stat().st_size
            ttft = [
                (await timed_request(client, url, chat_body(name, image_jpeg(next(seed), size), 1)))["s"] * 1e3
                for _ in range(args.vision_repeats)
            ]
            m = out["c1"][str(size)] = {"ttft_ms": ttft, "encode_ms": encode_times(log, engine, start)}
            print(f"{engine} {size}x{size}: TTFT ms {ttft}, encode ms {m['encode_ms']}", file=sys.stderr)
        size = args.vision_sizes[-1]
        bodies = [chat_body(name, image_jpeg(next(seed), size), args.vision_output) for _ in range(args.c4_requests)]
        gate = asyncio.Semaphore(4)

        async def one(body: dict) -> dict:
            async with gate:
                return await timed_request(client, url, body)

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    tokens = sum(d["completion_tokens"] for d in done)
    out["c4"] = {
        "size": size,
        "requests": len(done),
        "output_tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall,
    }
    print(f"{engine} c=4: {tokens} tokens in {wall:.1f} s = {tokens / wall:.2f} tok/s", file=sys.stderr)
    return out


def vision_servers(args, commands: dict[str, list[str]]) -> dict[str, list[str]]:
    """rawpage and llama-server (the VNNI build where both are given) of compare.servers, each
    given the mmproj; rawpage at the peers' thread count (its default follows the idle cores)."""
    out = {}
    for engine, cmd in commands.items():
        if engine == "llama-server" and "llama-server-vnni" in commands:
            continue
        if args.vision_engines and engine not in args.vision_engines.split(","):
            continue
        if engine == "rawpage":
            out[engine] = [*cmd, "--mmproj", args.mmproj, "--cpu-threads", str(args.threads)]
        elif engine.startswith("llama-server"):
            out[engine] = [*cmd, "--mmproj", args.mmproj, "-lv", "4"]  # -lv 4: the lines encode_times reads
    return out


def run(args, commands: dict[str, list[str]], wait_ready, write_section) -> None:
    """Each engine in turn: start it, measure, stop it; then the JSON summary and the doc's section."""
    key = f"vision-{args.key}"
    raw = Path(args.raw_dir) / key
    raw.mkdir(parents=True, exist_ok=True)
    summary = args.docs_dir / "bench" / f"compare-{key}.json"
    prev = json.loads(summary.read_text()) if summary.exists() else {}
    results = prev.get("engines", {})
    for engine, cmd in vision_servers(args, commands).items():
        log_path = raw / f"server-{engine}.log"
        with open(log_path, "w") as log:
            print("+ " + " ".join(cmd), file=sys.stderr)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            try:
                wait_ready(f"http://127.0.0.1:{args.port}", proc)
                results[engine] = asyncio.run(measure(args, engine, log_path))
                results[engine]["measured"] = {"date": str(date.today()), "commit": _commit()}
            finally:
                proc.terminate()
                proc.wait(60)
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps({"engines": results}, indent=1) + "\n")
    write_section(args.docs_dir / "benchmarks.md", markdown(results, args, key), key)


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def markdown(results: dict, args, key: str) -> str:
    when = "; ".join(f"{e}: {r['measured']['date']}, commit `{r['measured']['commit']}`" for e, r in results.items())
    lines = [
        f"<!-- compare:{key}:start -->",
        f"Measured with `make compare MODEL=.../{Path(args.model).name} MMPROJ=.../{Path(args.mmproj).name}` "
        "(tools/compare_vision.py; random weights at Gemma 3 4B's shapes from tools/make_shaped_gguf.py),",
        f"{platform.machine()} with {os.cpu_count()} cores, {args.threads} threads per engine, one engine at a time.",
        f"Measured: {when}.",
        "",
        "### One image, c=1: encode and TTFT (ms, best / median of the repeats)",
        "",
        "| engine | image | encode | TTFT |",
        "|---|---|---|---|",
    ]
    for engine, r in results.items():
        for size, m in r["c1"].items():
            lines.append(
                f"| {engine} | {size}x{size} | {_best_median(m['encode_ms'])} | {_best_median(m['ttft_ms'])} |"
            )
    lines += [
        "",
        f"### Image + text at c=4: output tok/s ({args.vision_output} tokens a reply, one image each)",
        "",
        "| engine | requests | image | output tokens | wall s | output tok/s |",
        "|---|---|---|---|---|---|",
    ]
    for engine, r in results.items():
        c4 = r["c4"]
        lines.append(
            f"| {engine} | {c4['requests']} | {c4['size']}x{c4['size']} | {c4['output_tokens']} | "
            f"{c4['wall_s']:.1f} | {c4['tok_per_s']:.2f} |"
        )
    peers = [e for e in results if e != "rawpage"]
    if "rawpage" in results:
        ours = results["rawpage"]
        for peer in peers:
            sizes = [s for s in ours["c1"] if s in results[peer]["c1"]]
            ttft = ", ".join(
                f"{s}: {min(ours['c1'][s]['ttft_ms']) / min(results[peer]['c1'][s]['ttft_ms']):.2f}x" for s in sizes
            )
            tput = ours["c4"]["tok_per_s"] / results[peer]["c4"]["tok_per_s"]
            lines += ["", f"rawpage / {peer}: best TTFT {ttft} (lower is better); c=4 output tok/s {tput:.2f}x."]
    return "\n".join([*lines, f"<!-- compare:{key}:end -->"])


def _best_median(values: list[float]) -> str:
    return f"{min(values):.0f} / {statistics.median(values):.0f}" if values else "-"
