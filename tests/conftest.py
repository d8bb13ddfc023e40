import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """`live` tests need torch + transformers; skip them cleanly where those are absent."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        skip = pytest.mark.skip(
            reason="needs torch and transformers (pip install torch==2.13.0 transformers accelerate)"
        )
        for item in items:
            if "live" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def default_checkpoint():
    from rawpage.loader import load_checkpoint

    return load_checkpoint()


@pytest.fixture(scope="session")
def default_model(default_checkpoint):
    from rawpage.models.llama import LlamaModel

    from rawpage.backends import get_backend

    return LlamaModel(default_checkpoint.config, get_backend("cpu"), default_checkpoint.tensors)
