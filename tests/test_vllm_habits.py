"""Issue 14: vLLM's command-line habits, hub ids from the local cache, the port check, and
error messages a user can act on (each asserted exactly)."""

import shutil
import socket
import subprocess
import sys
import time

import pytest

from rawpage import LLM, SamplingParams, cli
from rawpage.engine_args import EngineArgs
from rawpage.errors import InvalidRequestError, ModelLoadError
from rawpage.loader import resolve_model_path
from rawpage.request_checks import check_messages, check_params_type, check_request
from rawpage.server import app as server_app
from rawpage.server.args import ServerConfig
from rawpage.server.protocol import APIError, Body

VLLM_FLAGS = [
    "--tokenizer",
    "org/model",
    "--revision",
    "v1",
    "--trust-remote-code",
    "--max-logprobs",
    "5",
    "--disable-log-requests",
    "--disable-log-stats",
    "--quantization",
    "gguf",
    "--tensor-parallel-size",
    "1",
    "--cpu-threads",
    "1",
    "--shutdown-timeout",
    "3",
]


def test_positional_model_and_every_vllm_flag_parse():
    args = cli.parse_args(["serve", "org/model", *VLLM_FLAGS])
    e, s = EngineArgs.from_cli_args(args), ServerConfig.from_cli_args(args)
    assert (e.model, e.tokenizer, e.revision, e.trust_remote_code, e.max_logprobs) == (
        "org/model",
        "org/model",
        "v1",
        True,
        5,
    )
    assert (e.log_stats_interval, e.quantization, e.tensor_parallel_size, e.cpu_threads) == (0, "gguf", 1, 1)
    assert (s.disable_log_requests, s.shutdown_timeout) == (True, 3.0)


def test_help_lists_every_vllm_flag():
    out = subprocess.run([sys.executable, "-m", "rawpage.cli", "serve", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: rawpage serve [-h] [--model MODEL] [--host HOST]" in out.stdout
    for option in VLLM_FLAGS[::1]:
        if option.startswith("--"):
            assert option in out.stdout, option
    assert "never runs code from a model repository" in " ".join(out.stdout.split())


def serve_must_not_load(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("the model started loading")

    monkeypatch.setattr(server_app, "build_app", refuse)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tensor-parallel-size", "0"],
            "rawpage: error: --tensor-parallel-size 0: must be >= 1 (ranks: processes, one GPU each)",
        ),
        (
            ["--quantization", "bitsandbytes"],
            "rawpage: error: --quantization bitsandbytes: not supported; choose one of auto, fp8, q8_0, none, gguf, "
            "awq, gptq (GGUF tensor types: BF16, F16, F32, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, "
            "Q5_1, Q5_K, Q6_K, Q8_0)",
        ),
        (
            ["--tokenizer", "other/tok"],
            "rawpage: error: --tokenizer other/tok: rawpage reads the tokenizer from "
            "the model itself; a separate tokenizer is not supported, so leave --tokenizer out",
        ),
    ],
)
def test_flags_rawpage_cannot_honour_fail_before_the_model_loads(monkeypatch, capsys, flags, message):
    serve_must_not_load(monkeypatch)
    assert cli.main(["serve", *flags]) == 2
    assert capsys.readouterr().err == message + "\n"


def test_an_unknown_flag_prints_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["serve", "--bogus"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: rawpage serve ")
    assert err.endswith("rawpage serve: error: unrecognized arguments: --bogus\n")


def test_the_model_given_twice_is_an_argument_error(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["serve", "a/b", "--model", "c/d"])
    assert capsys.readouterr().err.endswith("rawpage serve: error: the model is given twice: a/b and --model c/d\n")


def test_a_port_in_use_fails_fast_with_one_line(monkeypatch, capsys):
    serve_must_not_load(monkeypatch)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        start = time.monotonic()
        assert cli.main(["serve", "--port", str(port)]) == 2
    assert time.monotonic() - start < 5
    assert capsys.readouterr().err == (
        f"rawpage: error: cannot listen on 127.0.0.1:{port}: Address already in use; stop whatever holds the port "
        "or pass --port\n"
    )


# --- hub ids ---------------------------------------------------------------------------------
def fake_hub_cache(tmp_path, model_dir, monkeypatch):
    """huggingface_hub's cache layout: refs/main names the snapshot."""
    repo = tmp_path / "hub" / "models--org--tiny"
    shutil.copytree(model_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo / "snapshots" / "abc123"


def test_a_hub_id_resolves_from_the_local_cache(tmp_path, tiny_model_dir, monkeypatch):
    snapshot = fake_hub_cache(tmp_path, tiny_model_dir, monkeypatch)
    assert resolve_model_path("org/tiny") == str(snapshot)
    assert resolve_model_path("org/tiny", revision="abc123") == str(snapshot)  # a commit names the folder
    assert server_app.default_served_name("org/tiny") == "org/tiny"
    out = LLM("org/tiny").generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_a_hub_id_offline_without_the_extra_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path("org/absent")
    assert str(e.value) == (
        f"model 'org/absent' (revision main) is not in the local Hugging Face cache ({tmp_path}); to download it, "
        "install the hub extra (pip install 'rawpage[hub]'), or pass a local folder or .gguf file"
    )


def test_a_hub_id_that_cannot_be_downloaded_says_so(tmp_path, monkeypatch):
    import types

    def offline(*a, **kw):
        raise OSError("no network")

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(snapshot_download=offline))
    with pytest.raises(ModelLoadError) as e:
        resolve_model_path("org/absent", revision="v2")
    assert str(e.value) == (
        f"model 'org/absent' (revision v2) is not in the local Hugging Face cache ({tmp_path}) and could not be "
        "downloaded (OSError: no network); check the id and the network, or pass a local folder or .gguf file"
    )


# --- messages (item 5) ---------------------------------------------------------------------------
def test_a_lower_bound_alone_reads_as_such():
    with pytest.raises(APIError) as e:
        Body({"max_tokens": 0}).int("max_tokens", None, 1)
    assert e.value.message == "'max_tokens' must be ≥ 1, got 0 (greater_than_equal)"  # vLLM's word after ours
    with pytest.raises(APIError) as e:
        Body({"top_p": 3}).float("top_p", None, 0, 1)
    assert e.value.message == "'top_p' must be between 0 and 1, got 3 (less_than_equal)"


def test_one_token_is_singular():
    with pytest.raises(InvalidRequestError) as e:
        check_request([5], SamplingParams(max_tokens=None), 1, 100, EngineArgs())
    assert str(e.value) == "the prompt has 1 token, which leaves no room for output under --max-model-len 1"
    with pytest.raises(InvalidRequestError) as e:
        check_request([5], SamplingParams(max_tokens=4), 4, 100, EngineArgs())
    assert str(e.value) == (
        "the prompt (1 token) plus max_tokens (4) is 5 tokens, more than --max-model-len 4; shorten the prompt or "
        "lower max_tokens"
    )


def test_a_dict_for_sampling_params_and_a_message_without_content_get_one_line():
    with pytest.raises(TypeError) as e:
        check_params_type([{"max_tokens": 3}])
    assert str(e.value) == (
        "sampling_params must be a SamplingParams or a list of them, got dict; write SamplingParams(**your_dict)"
    )
    with pytest.raises(ValueError) as e:
        check_messages([[{"role": "user", "content": "hi"}, {"role": "user"}]])
    assert str(e.value) == "messages[1] (user) has no 'content'; give it a 'content' string"


def test_logprobs_carry_their_text_and_metrics_are_epoch_seconds(tiny_model_dir):
    llm = LLM(tiny_model_dir)
    before = time.time()
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, logprobs=2), use_tqdm=False)[0]
    tok = llm.engine.tokenizer
    for entry in out.outputs[0].logprobs:
        assert all(lp.decoded_token == tok.decode([t], skip_special_tokens=False) for t, lp in entry.items())
    m = out.metrics
    assert before <= m.arrival_time <= m.first_token_time <= m.finished_time <= time.time()
