"""The CPU kernels' tests run on every instruction-set path this machine can run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rawpage.backends import get_backend
from rawpage.models.registry import build_model
from rawpage.native import isa, library
from rawpage.native.library import NativeLibrary, load_path


@pytest.fixture(params=isa.runnable_paths())
def lib(request: pytest.FixtureRequest) -> NativeLibrary:
    """The native library built for one path (each path once per session, cached)."""
    return load_path(request.param)


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """A machine where the CPU kernels cannot build: no compiler, an empty cache, and the
    loaded libraries forgotten (and forgotten again after, for the tests that follow)."""
    monkeypatch.setenv("RAWPAGE_CPU_CACHE", str(tmp_path))
    monkeypatch.setenv("RAWPAGE_CPU_CC", "/nonexistent/cc")
    library.native_kernels.cache_clear()
    library.load_path.cache_clear()
    yield
    library.native_kernels.cache_clear()
    library.load_path.cache_clear()


@pytest.fixture(scope="session")
def native_default_model(default_checkpoint):
    """The default model (SmolLM2 Q4_1) on the native kernels, its blocks as stored."""
    c = default_checkpoint
    return build_model(c.config, get_backend("cpu", cpu_kernels="native"), c.tensors)
