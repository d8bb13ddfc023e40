import functools
import os

import httpx
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


# httpx's default is 5 s per read. A reply from the server under test can take
# longer when both cores are busy (`make test-under-load`), and a timeout there says
# nothing about the server: calls that name no timeout get two minutes instead.
PATIENT_TIMEOUT_S = 120.0


@pytest.fixture(autouse=True, scope="session")
def patient_httpx():
    with pytest.MonkeyPatch.context() as mp:
        for name in ("request", "get", "post", "put", "delete", "stream"):
            mp.setattr(httpx, name, functools.partial(getattr(httpx, name), timeout=PATIENT_TIMEOUT_S))
        yield


@pytest.fixture(scope="session")
def default_checkpoint():
    from rawpage.loader import load_checkpoint

    return load_checkpoint()


@pytest.fixture(scope="session")
def default_model(default_checkpoint):
    from rawpage.backends import get_backend
    from rawpage.models.llama import LlamaModel

    # The float32 NumPy path: the parity tests against transformers' float32 hold it to 1e-3
    # (the native kernels' int8 activations are held against it in tests/native).
    return LlamaModel(default_checkpoint.config, get_backend("cpu", cpu_kernels="numpy"), default_checkpoint.tensors)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small random Llama (4 layers, dim 128, vocab 400) as a Hugging Face folder."""
    from tests.tiny_models import TINY_LLAMA, random_tensors, tiny_config, train_tokenizer, write_hf_folder

    cfg = tiny_config(**TINY_LLAMA)
    return write_hf_folder(
        str(tmp_path_factory.mktemp("tiny") / "hf"),
        cfg,
        random_tensors(cfg, seed=1),
        train_tokenizer(),
    )
