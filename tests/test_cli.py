"""The `rawpage` command: generate and chat on the default model, and clear errors."""

import subprocess
import sys

CLI = [sys.executable, "-m", "rawpage.cli"]


def run(*args, stdin=None):
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True, timeout=300)


def test_generate_prints_the_continuation():
    out = run("generate", "--chat", "What is the capital of Japan?", "--max-tokens", "16")
    assert out.returncode == 0, out.stderr
    assert "Tokyo" in out.stdout


def test_generate_raw_prompt_with_sampling():
    out = run("generate", "Once upon a time", "--max-tokens", "8", "--temperature", "0.8", "--sampling-seed", "1")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 0


def test_chat_keeps_history_until_eof():
    out = run("chat", "--max-tokens", "24", stdin="What is the capital of Japan?\nAnd of Italy?\n")
    assert out.returncode == 0, out.stderr
    assert "Tokyo" in out.stdout and "Rome" in out.stdout


def test_errors_are_one_clear_line():
    out = run("generate", "hi", "--model", "/nonexistent.gguf")
    assert out.returncode == 2 and "rawpage: error: model '/nonexistent.gguf' not found" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("generate", "")
    assert out.returncode == 2 and "empty" in out.stderr
    out = run("generate", "hi", "--max-model-len", "999999")
    assert out.returncode == 2 and "exceeds the model's context length 8192" in out.stderr


def test_ctrl_c_stops_a_reply_but_not_the_chat():
    import signal
    import threading
    import time

    proc = subprocess.Popen(
        [*CLI, "chat", "--max-tokens", "2000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    chars: list[str] = []
    reader = threading.Thread(target=lambda: chars.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    proc.stdin.write("Write a very long essay about the history of Europe.\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while len(chars) < 40 and time.monotonic() < deadline:  # the reply is streaming
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.stdin.write("What is the capital of Japan?\n")  # not communicate(): the reader thread owns stdout
    proc.stdin.close()
    proc.wait(300)
    reader.join(10)
    out = "".join(chars)
    err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert "[stopped]" in out and "Tokyo" in out.split("[stopped]", 1)[1], (out, err)


def test_python_m_rawpage_and_vllms_long_entry_point():
    """Issue 42: `python -m rawpage` is the `rawpage` command; vLLM's long form is `rawpage serve`."""
    out = subprocess.run([sys.executable, "-m", "rawpage", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "{serve,generate,chat,bench}" in out.stdout
    module = "rawpage.entrypoints.openai.api_server"
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: rawpage serve ")
    assert "--disable-frontend-multiprocessing" in out.stdout and "--api-server-count" in out.stdout


def test_bench_throughput_prints_vllms_lines(tiny_model_dir, tmp_path, capsys):
    import json

    from rawpage import cli

    result = tmp_path / "r.json"
    argv = ["bench", "throughput", "--model", tiny_model_dir, "--num-prompts", "4", "--input-len", "8"]
    argv += ["--output-len", "5", "--max-num-seqs", "2", "--output-json", str(result), "--disable-tqdm"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Throughput: ") and lines[0].endswith(" output tokens/s")
    assert lines[1:] == ["Total num prompt tokens:  32", "Total num output tokens:  20"]
    r = json.loads(result.read_text())
    assert (r["num_requests"], r["total_num_tokens"], r["output_tokens"]) == (4, 52, 20)
    assert r["requests_per_second"] > 0 and r["elapsed_time"] > 0 and r["mode"] == "continuous"
