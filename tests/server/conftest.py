import pytest

from tests.server.harness import ServerProcess


@pytest.fixture(scope="package")
def server():
    """One default-model server shared by the server tests."""
    s = ServerProcess("--max-num-seqs", "64")
    yield s
    assert s.stop() == 0, s.output()
