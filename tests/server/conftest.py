import pytest

from tests.server.harness import ServerProcess


@pytest.fixture(scope="package")
def server():
    """One default-model server shared by the server tests."""
    # tool_choice "auto" is tested too: it needs a tool-call parser
    s = ServerProcess("--max-num-seqs", "64", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="package")
def plain_server():
    """A server with no tool flags (tools work from the template, issue 31 item 10), with
    vLLM's load tracking and /tokenizer_info on."""
    s = ServerProcess("--max-num-seqs", "16", "--enable-server-load-tracking", "--enable-tokenizer-info-endpoint")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="package")
def keyed_server():
    """Two tenants' keys, and a Responses store of two responses per key (evictions are quick to reach)."""
    store = ["--responses-store-max-items", "4", "--responses-store-max-items-per-key", "2"]
    s = ServerProcess("--api-key", "key-a", "--api-key", "key-b", *store, "--max-num-seqs", "4")
    yield s
    assert s.stop() == 0, s.output()
