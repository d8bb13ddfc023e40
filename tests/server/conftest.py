import pytest

from tests.server.harness import ServerProcess


@pytest.fixture(scope="package")
def server():
    """One default-model server shared by the server tests."""
    # tool_choice "auto" is tested too: it needs a tool-call parser
    s = ServerProcess("--max-num-seqs", "64", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield s
    assert s.stop() == 0, s.output()
