"""The CPU kernels' tests run on every instruction-set path this machine can run."""

from __future__ import annotations

import pytest

from rawpage.native import isa
from rawpage.native.library import NativeLibrary, load_path


@pytest.fixture(params=isa.runnable_paths())
def lib(request: pytest.FixtureRequest) -> NativeLibrary:
    """The native library built for one path (each path once per session, cached)."""
    return load_path(request.param)
