"""rawpage/bench (`rawpage bench serve`, and tools/bench_serving.py over it): metric arithmetic on
made-up timestamps, the workloads, the HTTP client, and whole runs against a fake
OpenAI-compatible server with known timing (no model needed)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from rawpage.bench import http
from rawpage.bench import serve as bench_serve
from rawpage.bench.client import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, chunk_text, request_body
from rawpage.bench.datasets import (
    CHAT_DATASET,
    WORDS,
    BenchRequest,
    chat_requests,
    load_conversations,
    parse_range,
    random_requests,
    transcript,
)
from rawpage.bench.metrics import (
    RequestRecord,
    RunInfo,
    e2e_latency,
    format_summary,
    inter_token_latencies,
    peaks,
    percentile,
    summarize,
    tpot,
    ttft,
)
from tools import bench_serving

REPO = Path(__file__).resolve().parent.parent

# --- metrics ---------------------------------------------------------------


def record(sent, chunks, finished, out_tokens, target=None, success=True):
    """A request with 10 prompt tokens, counted by the server's usage."""
    return RequestRecord(
        index=0,
        sent=sent,
        chunk_times=list(chunks),
        finished=finished,
        success=success,
        target_output_tokens=target or out_tokens or 0,
        input_tokens=10,
        output_tokens=out_tokens,
        token_count_source="usage",
    )


def test_request_metrics_on_synthetic_timestamps():
    rec = record(10.0, [10.2, 10.25, 10.35, 10.4], 10.45, out_tokens=4)
    assert ttft(rec) == pytest.approx(0.2)
    assert inter_token_latencies(rec) == pytest.approx([0.05, 0.1, 0.05])
    assert e2e_latency(rec) == pytest.approx(0.45)
    # TPOT divides by tokens, not chunks: (0.45 - 0.2) / (4 - 1)
    assert tpot(rec) == pytest.approx(0.25 / 3)
    # A server that packs two tokens per chunk: same TTFT, twice the tokens per gap.
    assert tpot(record(10.0, [10.2, 10.4], 10.4, out_tokens=4)) == pytest.approx(0.2 / 3)


def test_metrics_undefined_without_tokens():
    assert tpot(record(0.0, [0.1], 0.1, out_tokens=1)) is None
    assert tpot(record(0.0, [0.1, 0.2], 0.2, out_tokens=None)) is None
    empty = record(0.0, [], 0.3, out_tokens=0)
    assert ttft(empty) is None and tpot(empty) is None and inter_token_latencies(empty) == []


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy(n):
    xs = [random.Random(n).uniform(0, 10) for _ in range(n)]
    for p in [0, 25, 50, 90, 99, 100]:
        assert percentile(xs, p) == pytest.approx(np.percentile(xs, p))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_counts_only_successes():
    recs = [
        record(0.0, [0.1, 0.2, 0.3], 0.3, out_tokens=3),  # TTFT 100 ms, ITLs 100, 100
        record(0.5, [0.8, 0.9], 1.0, out_tokens=2, target=5),  # stopped early; TTFT 300 ms
        record(1.0, [], 1.5, out_tokens=None, success=False),
    ]
    s = summarize(recs, duration_s=2.0)
    assert (s.completed, s.failed) == (2, 1)
    assert (s.total_input_tokens, s.total_output_tokens) == (20, 5)
    assert s.request_throughput == pytest.approx(1.0)
    assert s.output_throughput == pytest.approx(2.5)
    assert s.total_token_throughput == pytest.approx(12.5)
    assert s.ttft.mean_ms == pytest.approx(200.0)
    assert s.ttft.median_ms == pytest.approx(200.0)
    assert s.ttft.p99_ms == pytest.approx(100.0 + 200.0 * 0.99)
    assert s.itl.mean_ms == pytest.approx(100.0)  # gaps 100, 100, 100 pooled
    assert s.tpot.mean_ms == pytest.approx((100.0 + 200.0) / 2)  # 200/2 and 200/1
    assert s.e2el.median_ms == pytest.approx(400.0)
    assert s.output_len_mismatches == 1
    assert s.token_count_sources == {"usage": 2}


def test_summary_table_of_a_run_with_no_success():
    s = summarize([record(0.0, [], 1.0, None, success=False)], duration_s=1.0)
    assert s.completed == 0 and s.ttft.mean_ms is None
    table = format_summary(s, RunInfo(metrics=("ttft", "tpot", "itl", "e2el")))
    for line in ["Successful requests:", "Mean TTFT (ms):", "P99 ITL (ms):", "Median E2EL (ms):"]:
        assert line in table
    assert "n/a" in table
    json.dumps(s.to_dict())  # the result file can hold it


# --- arrivals and workloads --------------------------------------------------


def test_arrival_delays_are_seeded_poisson():
    assert bench_serving.arrival_delays(5, float("inf"), seed=0) == [0.0] * 5
    a = bench_serving.arrival_delays(20000, 4.0, seed=1)
    assert a == bench_serving.arrival_delays(20000, 4.0, seed=1)
    assert a != bench_serving.arrival_delays(20000, 4.0, seed=2)
    assert sum(a) / len(a) == pytest.approx(0.25, rel=0.05)


def test_parse_range():
    assert parse_range("7") == (7, 7)
    assert parse_range("3:9") == (3, 9)
    for bad in ["0:4", "9:3", "x", "1:y"]:
        with pytest.raises(ValueError):
            parse_range(bad)


def test_random_requests_are_seeded_and_in_range():
    reqs = random_requests(50, (10, 20), (3, 6), seed=5)
    assert reqs == random_requests(50, (10, 20), (3, 6), seed=5)
    assert reqs != random_requests(50, (10, 20), (3, 6), seed=6)
    for r in reqs:
        assert 10 <= len(r.prompt.split()) <= 20 and 3 <= r.output_tokens <= 6
        assert r.messages == [{"role": "user", "content": r.prompt}]


def test_words_are_single_tokens_for_the_default_model(default_checkpoint):
    tok = default_checkpoint.tokenizer
    assert len(WORDS) == len(set(WORDS)) > 300
    assert [w for w in WORDS if len(tok.encode(" " + w, add_special_tokens=False)) != 1] == []


def test_chat_dataset_is_small_and_well_formed():
    assert CHAT_DATASET.stat().st_size < 100_000
    convs = load_conversations()
    assert len(convs) >= 60
    for messages in convs:
        roles = [m["role"] for m in messages if m["role"] != "system"]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles, roles[1:])), roles
        assert all(m["content"].strip() for m in messages)


def test_chat_requests_end_on_a_user_turn():
    turns = sum(m["role"] == "assistant" for c in load_conversations() for m in c)
    reqs = chat_requests(turns + 3, seed=0)  # more than the pool: it cycles
    assert len(reqs) == turns + 3
    assert len({r.prompt for r in reqs}) == turns
    for r in reqs:
        assert r.messages[-1]["role"] == "user" and r.reference and r.output_tokens == 0
        assert r.prompt == transcript(r.messages) and r.prompt.endswith("\n\nAssistant:")
    assert all(4 <= r.output_tokens <= 8 for r in chat_requests(20, seed=0, output_len=(4, 8)))


def test_request_body_and_chunk_text():
    req = BenchRequest([{"role": "user", "content": "hi"}], "hi", 7)
    chat = request_body(req, CHAT_ENDPOINT, "m", 7, True, 0.0, {"top_p": 0.5})
    assert chat["messages"] == req.messages and "prompt" not in chat
    assert chat["stream"] and chat["stream_options"] == {"include_usage": True}
    assert (chat["max_tokens"], chat["ignore_eos"], chat["temperature"], chat["top_p"]) == (
        7,
        True,
        0.0,
        0.5,
    )
    plain = request_body(req, COMPLETIONS_ENDPOINT, "m", 7, False, None)
    assert plain["prompt"] == "hi" and "ignore_eos" not in plain and "temperature" not in plain

    assert chunk_text({"choices": [{"delta": {"role": "assistant"}}]}, CHAT_ENDPOINT) == ""
    assert chunk_text({"choices": [{"delta": {"content": " a"}}]}, CHAT_ENDPOINT) == " a"
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}, CHAT_ENDPOINT) == ""
    assert chunk_text({"choices": [{"text": "b"}]}, COMPLETIONS_ENDPOINT) == "b"


def test_help_documents_every_flag():
    parser = bench_serving.build_parser()
    undocumented = [a.option_strings for a in parser._actions if not a.help]
    assert undocumented == []


# --- whole runs against a fake server -----------------------------------------

FIRST_TOKEN_DELAY = 0.05  # the fake server "prefills" this long
TOKEN_GAP = 0.01  # and then streams one token this often


class FakeServer:
    """An OpenAI-compatible streaming server with known timing, on a thread of its own.

    Each output token is the word " w{i}"; /tokenize (vLLM's shape) counts words.
    It sends the chat role chunk at once, before the first token, as real servers do.
    """

    def __init__(self, usage: bool = True, tokenize: bool = False, fail_every: int = 0) -> None:
        self.usage, self.fail_every = usage, fail_every
        self.requests = self.in_flight = self.max_in_flight = 0
        routes = [
            Route("/v1/models", self.models),
            Route("/v1/chat/completions", self.generate, methods=["POST"]),
            Route("/v1/completions", self.generate, methods=["POST"]),
        ]
        if tokenize:
            routes.append(Route("/tokenize", self.tokenize, methods=["POST"]))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(Starlette(routes=routes), port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "fake server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def tokenize(self, request: Request) -> JSONResponse:
        body = await request.json()
        text = body.get("prompt") or " ".join(m["content"] for m in body["messages"])
        return JSONResponse({"tokens": list(range(len(text.split()))), "count": len(text.split())})

    async def generate(self, request: Request):
        body = await request.json()
        self.requests += 1
        if self.fail_every and self.requests % self.fail_every == 0:
            return JSONResponse({"error": {"message": "injected failure"}}, status_code=500)
        chat = request.url.path == CHAT_ENDPOINT
        prompt = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        # Without ignore_eos the fake model "ends" after 2 tokens.
        n = body["max_tokens"] if body.get("ignore_eos") else min(2, body["max_tokens"])
        return StreamingResponse(self.stream(chat, len(prompt.split()), n, body), media_type="text/event-stream")

    async def stream(self, chat: bool, prompt_tokens: int, n: int, body: dict):
        def event(choice: dict | None, usage: dict | None = None) -> str:
            chunk = {
                "object": "chat.completion.chunk" if chat else "text_completion",
                "choices": [choice] if choice else [],
                "usage": usage,
            }
            return f"data: {json.dumps(chunk)}\n\n"

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if chat:
                yield event({"index": 0, "delta": {"role": "assistant"}})
            await asyncio.sleep(FIRST_TOKEN_DELAY)
            for i in range(n):
                if i:
                    await asyncio.sleep(TOKEN_GAP)
                text = f" w{i}"
                yield event({"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text})
            if self.usage and body.get("stream_options", {}).get("include_usage"):
                yield event(None, {"prompt_tokens": prompt_tokens, "completion_tokens": n})
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1


def test_cli_run_against_fake_server(tmp_path):
    out = tmp_path / "result.json"
    with FakeServer() as server:
        proc = subprocess.run(
            [
                sys.executable,
                "tools/bench_serving.py",
                "--base-url",
                server.url,
                "--num-prompts",
                "8",
                "--max-concurrency",
                "3",
                "--random-input-len",
                "5:9",
                "--random-output-len",
                "4:8",
                "--result-file",
                str(out),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert server.max_in_flight <= 3
        assert server.requests == 8 + 1  # and the initial test request
    assert "Serving Benchmark Result" in proc.stdout and "Mean TTFT (ms):" in proc.stdout

    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"], s["output_len_mismatches"]) == (8, 0, 0)
    assert s["token_count_sources"] == {"usage": 8}
    assert result["config"]["model"] == "fake-model"
    for r in result["requests"]:
        assert r["output_tokens"] == r["target_output_tokens"] == len(r["chunk_times_s"])
        assert 5 <= r["input_tokens"] <= 9
        # The role chunk comes at once; TTFT waits for the first token, so it is never early.
        assert r["ttft_s"] >= FIRST_TOKEN_DELAY
    assert s["tpot"]["mean_ms"] > 0.5 * TOKEN_GAP * 1000
    assert s["ttft"]["mean_ms"] >= FIRST_TOKEN_DELAY * 1000


def test_tokenize_fallback_on_completions_with_poisson_arrivals(tmp_path):
    out = tmp_path / "result.json"
    with FakeServer(usage=False, tokenize=True) as server:
        rc = bench_serving.main(
            [
                "--base-url",
                server.url,
                "--endpoint",
                COMPLETIONS_ENDPOINT,
                "--num-prompts",
                "6",
                "--request-rate",
                "50",
                "--random-input-len",
                "6",
                "--random-output-len",
                "3:5",
                "--skip-initial-test",
                "--result-file",
                str(out),
            ]
        )
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["summary"]["token_count_sources"] == {"server /tokenize": 6}
    for r in result["requests"]:
        assert r["output_tokens"] == r["target_output_tokens"] and r["input_tokens"] == 6


def test_local_tokenizer_fallback_on_the_chat_dataset(tmp_path):
    from tests.tiny_models import train_tokenizer

    tokenizer_json = tmp_path / "tokenizer.json"
    train_tokenizer().save(str(tokenizer_json))
    out = tmp_path / "result.json"
    with FakeServer(usage=False) as server:
        rc = bench_serving.main(
            [
                "--base-url",
                server.url,
                "--dataset",
                "chat",
                "--num-prompts",
                "4",
                "--chat-output-len",
                "3",
                "--tokenizer",
                str(tokenizer_json),
                "--result-file",
                str(out),
            ]
        )
    assert rc == 0
    s = json.loads(out.read_text())["summary"]
    assert s["completed"] == 4 and s["token_count_sources"] == {"tokenizer": 4}
    assert s["total_output_tokens"] > 0 and s["total_input_tokens"] > 0


def test_failures_and_early_stops_are_reported(tmp_path, capsys):
    out = tmp_path / "result.json"
    with FakeServer(fail_every=3) as server:
        rc = bench_serving.main(
            [
                "--base-url",
                server.url,
                "--num-prompts",
                "9",
                "--random-output-len",
                "5",
                "--no-ignore-eos",
                "--skip-initial-test",
                "--result-file",
                str(out),
            ]
        )
    assert rc == 0
    result = json.loads(out.read_text())
    s = result["summary"]
    assert (s["completed"], s["failed"]) == (6, 3)
    assert s["output_len_mismatches"] == 6  # the fake model stops at 2 of 5 tokens
    assert sum("HTTP 500" in r["error"] for r in result["requests"]) == 3
    assert "Failed requests:                         3" in capsys.readouterr().out

    with FakeServer(fail_every=1) as server:
        rc = bench_serving.main(["--base-url", server.url, "--num-prompts", "2", "--skip-initial-test"])
    assert rc == 1


# --- `rawpage bench serve`: vLLM's options, table and result file --------------------------


def test_rawpage_bench_serve_takes_vllms_options_and_names_its_result_as_vllm(tmp_path, capsys):
    from rawpage import cli

    with FakeServer() as server:
        argv = ["bench", "serve", "--host", "127.0.0.1", "--port", str(server.port), "--backend", "openai-chat"]
        argv += ["--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "6", "--ignore-eos"]
        argv += ["--num-prompts", "5", "--max-concurrency", "2", "--request-rate", "100", "--burstiness", "0.5"]
        argv += ["--metric-percentiles", "50,90", "--percentile-metrics", "ttft,e2el", "--disable-tqdm"]
        argv += ["--save-result", "--result-dir", str(tmp_path), "--metadata", "run=a"]
        assert cli.main(argv) == 0
        assert server.requests == 5 + 1 and server.max_in_flight <= 2
    out = capsys.readouterr().out
    table = out[out.index("=" * 12 + " Serving Benchmark Result ") :]
    for line in [
        "Successful requests:                     5",
        "Maximum request concurrency:             2",
        "Request rate configured (RPS):           100.00",
        "Total generated tokens:                  30",
        "Total token throughput (tok/s):",
        "Median TTFT (ms):",
        "P90 TTFT (ms):",
        "P50 E2EL (ms):",
    ]:
        assert line in table, line
    assert "Mean ITL (ms):" not in table and table.rstrip().endswith("=" * 50)
    (path,) = tmp_path.iterdir()
    assert path.name.startswith("openai-chat-100.0qps-concurrency2-fake-model-") and path.suffix == ".json"
    result = json.loads(path.read_text())
    assert (result["completed"], result["total_output_tokens"], result["run"]) == (5, 30, "a")
    assert result["p90_ttft_ms"] >= FIRST_TOKEN_DELAY * 1000 and result["std_ttft_ms"] >= 0
    assert result["model_id"] == "fake-model" and "requests" not in result  # no --save-detailed


def test_rawpage_bench_serve_defaults_are_vllms():
    from rawpage import cli

    args = cli.parse_args(["bench", "serve"])
    bench_serve.check_args(args)
    assert (args.base_url, args.endpoint, args.num_prompts, args.ignore_eos) == (
        "http://127.0.0.1:8000",
        COMPLETIONS_ENDPOINT,
        1000,
        False,
    )
    assert (args.input_range, args.output_range) == ((1024, 1024), (128, 128))
    args = cli.parse_args(["bench", "serve", "--random-input-len", "100", "--random-range-ratio", "0.5"])
    bench_serve.check_args(args)
    assert args.input_range == (50, 150)


def test_an_unreachable_server_is_one_line(capsys):
    from rawpage import cli
    from tests.server.harness import free_port

    assert cli.main(["bench", "serve", "--port", str(free_port()), "--num-prompts", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rawpage: error: cannot benchmark http://127.0.0.1:") and "Traceback" not in err


def test_gamma_arrivals_keep_the_rate():
    a = bench_serve.arrival_delays(20000, 4.0, seed=1, burstiness=0.5)
    assert sum(a) / len(a) == pytest.approx(0.25, rel=0.05)
    assert a != bench_serve.arrival_delays(20000, 4.0, seed=1)


def test_a_shared_prefix_starts_every_prompt():
    reqs = random_requests(4, (3, 3), (1, 1), seed=0, prefix_len=5)
    prefixes = {" ".join(r.prompt.split()[:5]) for r in reqs}
    assert len(prefixes) == 1 and all(len(r.prompt.split()) == 8 for r in reqs)


def test_peaks_count_one_second_windows():
    recs = [record(0.0, [0.1, 0.2, 0.3], 0.4, 3), record(0.2, [1.5], 1.6, 1), record(1.7, [2.1], 2.2, 1)]
    assert peaks(recs) == (3.0, 2)


def test_http_client_reads_content_length_and_close_delimited_bodies():
    async def serve(reader, writer):
        request = await reader.readuntil(b"\r\n\r\n")
        if request.startswith(b"GET /length"):
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"a": [1]}\n')
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\n\r\nline one\nline two")
        await writer.drain()
        writer.close()

    async def main():
        listener = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        async with listener:
            assert await http.get_json(url + "/length") == {"a": [1]}
            async with http.request("GET", url + "/close") as resp:
                assert resp.status == 404 and [line async for line in resp.lines()] == ["line one", "line two"]
            with pytest.raises(http.HTTPError, match="HTTP 404"):
                await http.get_json(url + "/close")

    asyncio.run(main())
