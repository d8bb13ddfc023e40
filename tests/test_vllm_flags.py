"""Issue 31, items 3-5: the vLLM flags people paste work (or are explicit no-ops that say so),
flags that cannot apply log one line each, and the command line's polish."""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import httpx
import pytest

from rawpage import cli
from rawpage.engine_args import EngineArgs
from rawpage.server import app as server_app
from rawpage.server.args import ServerConfig
from tests.server.harness import free_port

CPU = SimpleNamespace(name="cpu", memory=None, supports_graphs=False)  # the NumPy path


def parsed(*argv: str) -> tuple[EngineArgs, ServerConfig]:
    args = cli.parse_args(["serve", *argv])
    return EngineArgs.from_cli_args(args), ServerConfig.from_cli_args(args)


def test_the_vllm_flags_people_paste_parse():
    e, s = parsed(
        *["-tp", "1", "--pipeline-parallel-size", "1", "--enable-chunked-prefill", "--download-dir", "/d"],
        *["--generation-config", "vllm", "--uvicorn-log-level", "debug", "--root-path", "/llm"],
        *["--served-model-name", "a", "b", "--allowed-origins", '["http://app.example"]', "--max_model_len", "64"],
        *["--uds", "/tmp/x.sock", "--enable-force-include-usage", "--max-num-seqs=3"],
    )
    assert (e.tensor_parallel_size, e.pipeline_parallel_size, e.enable_chunked_prefill) == (1, 1, True)
    assert (e.download_dir, e.served_model_name, e.max_model_len, e.max_num_seqs) == ("/d", ["a", "b"], 64, 3)
    assert (s.uvicorn_log_level, s.root_path, s.uds, s.enable_force_include_usage) == (
        "debug",
        "/llm",
        "/tmp/x.sock",
        True,
    )
    assert s.allowed_origins == ["http://app.example"]
    assert parsed("--allowed-origins", "a, b")[1].allowed_origins == ["a", "b"]


def test_pipeline_parallelism_is_refused_with_what_to_do(monkeypatch, capsys):
    monkeypatch.setattr(server_app, "build_app", lambda *a, **kw: pytest.fail("the model started loading"))
    assert cli.main(["serve", "-pp", "2"]) == 2
    assert capsys.readouterr().err == (
        "rawpage: error: --pipeline-parallel-size 2: rawpage has no pipeline parallelism; "
        "leave it at 1 and split the model with --tensor-parallel-size\n"
    )


def test_several_served_names_first_is_reported_all_are_accepted():
    app = server_app.build_app(EngineArgs(served_model_name=["a", "b"]), ServerConfig())
    state = app.state.rawpage
    assert (state.model_name, state.config.model_aliases) == ("a", ["b"])


INERT = {
    "--gpu-memory-utilization 0.5": "--gpu-memory-utilization has no effect: on cpu the KV cache pool is "
    "--kv-cache-memory",
    "--enforce-eager": "--enforce-eager has no effect: the cpu backend captures no graphs",
    "--swap-space 8": "--swap-space has no effect: preempted sequences are recomputed, not swapped",
    "--max-loras 2": "--max-loras has no effect: LoRA is off (--enable-lora)",
    "--max-lora-rank 8": "--max-lora-rank has no effect: LoRA is off (--enable-lora)",
    "--kv-cache-scales 1.0": "--kv-cache-scales has no effect: the KV cache is not fp8 (--kv-cache-dtype fp8)",
    "--revision v2": "--revision has no effect: the model is local, not a hub id",
    "--enable-chunked-prefill": "--enable-chunked-prefill has no effect: chunked prefill is always on",
}


@pytest.mark.parametrize("flags", list(INERT))
def test_a_flag_that_cannot_apply_logs_one_line(caplog, flags):
    e, _ = parsed(*flags.split())
    with caplog.at_level(logging.WARNING, "rawpage"):
        e.log_inert_flags(CPU)
    assert [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()] == [
        caplog.records[0].getMessage()
    ]
    assert caplog.records[0].getMessage().startswith(INERT[flags])


def test_flags_not_given_log_nothing(caplog):
    e, _ = parsed()
    with caplog.at_level(logging.WARNING, "rawpage"):
        e.log_inert_flags(CPU)
        cli._log_inert_ray_flags(cli.parse_args(["serve"]))
    assert not caplog.records


def test_num_replicas_without_ray_logs_one_line(caplog):
    with caplog.at_level(logging.WARNING, "rawpage"):
        cli._log_inert_ray_flags(cli.parse_args(["serve", "--num-replicas", "2"]))
    assert [r.getMessage() for r in caplog.records] == [
        "--num-replicas has no effect: without --ray, one server runs in this process"
    ]


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rawpage.cli", *argv], capture_output=True, text=True, timeout=60)


def test_version():
    from rawpage import __version__

    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout == f"rawpage {__version__}\n"


def test_help_puts_model_host_port_and_api_key_first():
    text = run_cli("serve", "--help").stdout
    options = text[text.index("model and address:") :]
    firsts = [options.index(f) for f in ("--model MODEL", "--host HOST", "--port PORT", "--api-key API_KEY")]
    assert firsts == sorted(firsts) and firsts[-1] < options.index("--allowed-origins")
    assert firsts[-1] < options.index("--max-stop-strings")


def test_generate_and_chat_do_not_list_serve_only_flags():
    for command in ("generate", "chat"):
        text = run_cli(command, "--help").stdout
        assert "--max-model-len" in text
        for flag in ("--served-model-name", "--enable-lora", "--lora-modules", "--host", "--api-key"):
            assert flag not in text, (command, flag)


def test_max_request_bytes_takes_units():
    assert parsed("--max-request-bytes", "8MiB")[1].max_request_bytes == 8 << 20
    assert parsed("--max-request-bytes", "1000")[1].max_request_bytes == 1000


def test_uds_root_path_aliases_and_forced_usage_live(tmp_path):
    sock = str(tmp_path / "rawpage.sock")
    cmd = [sys.executable, "-m", "rawpage.cli", "serve", "--uds", sock, "--root-path", "/llm"]
    cmd += ["--served-model-name", "first", "second", "--enable-force-include-usage", "--max-model-len", "256"]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://rawpage", timeout=60)
    try:
        deadline = time.monotonic() + 180
        while not (os.path.exists(sock) and _healthy(client)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        models = client.get("/v1/models").json()["data"]
        assert models[0]["id"] == "first"
        assert client.get("/llm/v1/models").json()["data"][0]["id"] == "first"  # the prefix is optional
        body = {"model": "second", "prompt": "Hi", "max_tokens": 2, "stream": True}
        lines = [x for x in client.post("/v1/completions", json=body).text.splitlines() if x.startswith("data: {")]
        assert json.loads(lines[-1][6:])["usage"]["completion_tokens"] == 2
        # --enable-force-include-usage: usage on every chunk, as vLLM (the role chunk counts no tokens yet)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "min_tokens": 3, "stream": True}
        text = client.post("/llm/v1/chat/completions", json=chat).text
        chunks = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        assert counts[0] == 0 and counts[-2:] == [3, 3] and not chunks[-1]["choices"]
        assert all(b > a for a, b in zip(counts[:-2], counts[1:-1])), counts  # each chunk brings tokens
        assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + n for c, n in zip(chunks, counts))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        log.close()
    assert "at unix:" in (tmp_path / "serve.log").read_text()


def _healthy(client: httpx.Client) -> bool:
    try:
        return client.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


# --- issue 42: a typical vLLM command line runs; flags with no effect say why, once ----------
TYPICAL = (
    "--tensor-parallel-size 1 --gpu-memory-utilization 0.90 --max-model-len 256 --max-num-seqs 8 --dtype auto "
    "--trust-remote-code --disable-log-requests --disable-frontend-multiprocessing --api-server-count 1 "
    "--enable-prefix-caching --swap-space 4 --block-size 16 --seed 0 --uvicorn-log-level info --max-log-len 100 "
    "--disable-fastapi-docs --distributed-executor-backend mp --tokenizer-mode auto --load-format auto "
    "--enable-chunked-prefill --max-num-batched-tokens 256 --kv-cache-dtype auto --kv-cache-memory-bytes 64000000 "
    "--disable-uvicorn-access-log --enable-log-requests -O3"
).split()
IGNORED = [  # in NO_EFFECT's order
    "--disable-frontend-multiprocessing",
    "--api-server-count",
    "--enable-log-requests",
    "--max-log-len",
    "--disable-fastapi-docs",
    "--distributed-executor-backend",
    "--compilation-config",
    "--tokenizer-mode auto",
]


def test_a_typical_vllm_command_line_parses_and_names_each_ignored_flag(caplog):
    from rawpage.server.vllm_flags import check_vllm_flags

    args = cli.parse_args(["serve", "org/model", *TYPICAL])
    e, s = EngineArgs.from_cli_args(args), ServerConfig.from_cli_args(args)
    assert (e.max_model_len, e.max_num_seqs, e.kv_cache_memory, s.disable_uvicorn_access_log) == (
        256,
        8,
        64000000,
        True,
    )
    with caplog.at_level(logging.WARNING, "rawpage"):
        check_vllm_flags(args)
    warned = [r.getMessage() for r in caplog.records]
    assert [m.split(" has no effect: ")[0] for m in warned] == IGNORED
    assert warned[1] == (
        "--api-server-count has no effect: one process serves: the event loop hands requests to the engine's "
        "thread (rawpage/server/async_engine.py)"
    )


def test_every_no_effect_flag_parses_and_says_why(caplog):
    from rawpage.server.vllm_flags import NO_EFFECT, check_vllm_flags

    argv = []
    accepted = {name: f for name, f in NO_EFFECT.items() if f.same or not f.refused}
    for name, f in accepted.items():
        argv += [f"--{name}"] if f.switch else [f"--{name}", f.same[0] if f.same else "x"]
    with caplog.at_level(logging.WARNING, "rawpage"):
        check_vllm_flags(cli.parse_args(["serve", *argv]))
    assert len(caplog.records) == len(accepted) > 40
    assert all(f.why for f in NO_EFFECT.values())
    caplog.clear()
    check_vllm_flags(cli.parse_args(["serve", "--no-enable-sleep-mode", "--no-disable-frontend-multiprocessing"]))
    assert not caplog.records  # a switch turned off asks for nothing


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tokenizer-mode", "mistral"],
            "--tokenizer-mode mistral: not supported: rawpage tokenizes with the model's tokenizer.json (Hugging "
            "Face's fast tokenizer), the 'auto' and 'hf' modes; another tokenizer could split text differently; "
            "leave --tokenizer-mode out",
        ),
        (
            ["--logits-processors", "my.Processor"],
            "--logits-processors my.Processor: not supported: rawpage loads no logits processors into the server; "
            "leave --logits-processors out",
        ),
        (
            ["--response-role", "bot"],
            "--response-role bot: not supported: replies always have the role 'assistant'; leave --response-role out",
        ),
    ],
)
def test_a_flag_that_would_change_results_is_refused_before_loading(monkeypatch, capsys, flags, message):
    monkeypatch.setattr(server_app, "build_app", lambda *a, **kw: pytest.fail("the model started loading"))
    assert cli.main(["serve", *flags]) == 2
    assert capsys.readouterr().err == f"rawpage: error: {message}\n"


def _self_signed(tmp_path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = str(tmp_path / "key.pem"), str(tmp_path / "cert.pem")
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert]
    subprocess.run([*cmd, "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    return key, cert


def test_vllms_long_entry_point_serves_https_with_a_typical_command_line(tmp_path, tiny_model_dir, capsys):
    """`python -m rawpage.entrypoints.openai.api_server` with vLLM's flags and TLS; `rawpage bench
    serve --insecure` runs against it; each ignored flag was named once; no access log lines;
    'Application startup complete.' once the model has loaded, after the engine's own lines."""
    key, cert = _self_signed(tmp_path)
    port = free_port()
    cmd = [sys.executable, "-m", "rawpage.entrypoints.openai.api_server", "--model", tiny_model_dir]
    cmd += ["--port", str(port), "--ssl-keyfile", key, "--ssl-certfile", cert, *TYPICAL]
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "startup complete" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert httpx.get(f"https://127.0.0.1:{port}/health", verify=False).status_code == 200
        argv = ["bench", "serve", "--base-url", f"https://127.0.0.1:{port}", "--insecure", "--num-prompts", "2"]
        assert cli.main([*argv, "--random-input-len", "4", "--random-output-len", "3", "--disable-tqdm"]) == 0
        assert "Successful requests:                     2" in capsys.readouterr().out
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    text = log_path.read_text()
    for flag in IGNORED:
        assert text.count(f"{flag} has no effect") == 1, (flag, text)
    assert "at https://127.0.0.1:" in text and '"POST /v1/completions HTTP/1.1" 200' not in text
    lines = text.splitlines()
    (ready,) = [i for i, line in enumerate(lines) if "startup complete" in line]
    assert lines[ready].endswith("INFO rawpage.server: Application startup complete.")
    assert any("KV cache" in line or "blocks" in line for line in lines[:ready]), text


# --- issue 42: every flag of `vllm serve --help` is known: it works, warns why not, or is refused ---
def _vllm_serve_flags() -> list[str]:
    path = os.path.join(os.path.dirname(__file__), "data", "vllm_serve_flags.txt")
    return [x.strip() for x in open(path) if x.startswith("--")]


def test_every_vllm_serve_flag_is_known():
    import argparse

    parser = argparse.ArgumentParser()
    serve = cli._serve_parser(parser.add_subparsers())
    known = {o for a in serve._actions for o in a.option_strings}
    assert [f for f in _vllm_serve_flags() if f not in known] == []


def test_list_flags_take_several_values_and_refusals_say_why(caplog):
    from rawpage.server.vllm_flags import check_vllm_flags

    args = cli.parse_args(["serve", "--device-ids", "0", "1", "--numa-bind", "--spec-tokens", "3"])
    with caplog.at_level(logging.WARNING, "rawpage"):
        check_vllm_flags(args)
    assert [m.split(" has no effect")[0] for m in caplog.messages] == ["--numa-bind", "--device-ids", "--spec-tokens"]
    for argv, why in (
        (["--skip-tokenizer-init"], "a feature rawpage does not have"),
        (["--task", "embed"], "--runner"),
        (["--disable-sliding-window"], "--max-model-len at or below the window"),
        (["--tokenizer-revision", "v2"], "at --revision"),
        (["--tokenizer-revision", "v2", "--revision", "v1"], "at --revision"),
        (["--scheduler-cls", "my.Scheduler"], "no code"),
        (["--chat-template-content-format", "openai"], "renders"),
    ):
        with pytest.raises(ValueError, match=why):
            check_vllm_flags(cli.parse_args(["serve", *argv]))
    for argv in (
        ["--task", "generate"],
        ["--tokenizer-revision", "main"],
        ["--tokenizer-revision", "v1", "--revision", "v1"],
    ):
        check_vllm_flags(cli.parse_args(["serve", *argv]))  # what rawpage does anyway: a warning at most


def test_load_format_safetensors_and_gguf_check_what_is_loaded(tiny_model_dir):
    from rawpage.errors import ModelLoadError
    from rawpage.loader import load_checkpoint
    from rawpage.loader.default_model import default_model_path

    assert load_checkpoint(tiny_model_dir, "safetensors").config is not None
    assert load_checkpoint(default_model_path(), "gguf").config is not None
    with pytest.raises(ModelLoadError, match="holds safetensors weights; pass --load-format auto"):
        load_checkpoint(tiny_model_dir, "gguf")
    with pytest.raises(ModelLoadError, match="holds gguf weights"):
        load_checkpoint(default_model_path(), "safetensors")
    with pytest.raises(SystemExit):  # vLLM's pt, npcache, ...: formats rawpage does not read
        cli.parse_args(["serve", "--load-format", "pt"])
