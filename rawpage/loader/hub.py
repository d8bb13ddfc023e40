"""Hugging Face hub ids (`org/name`): found in the local Hugging Face cache, or downloaded
with `huggingface_hub` (the optional extra `rawpage[hub]`) when the machine is online.

The cache layout is huggingface_hub's: <cache>/models--org--name/refs/<revision> holds a
commit hash, and <cache>/models--org--name/snapshots/<hash>/ the files. Nothing from the
repository is ever executed, whatever --trust-remote-code says.
"""

from __future__ import annotations

import os
import re

from rawpage.errors import ModelLoadError

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What a model folder needs; anything else in the repository is not downloaded.
_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja"]


def looks_like_hub_id(model: str) -> bool:
    return bool(_HUB_ID.fullmatch(model)) and not os.path.exists(os.path.expanduser(model))


def hub_cache_dir(download_dir: str | None = None) -> str:
    """Where huggingface_hub keeps models: --download-dir, else $HF_HUB_CACHE, else $HF_HOME/hub,
    else ~/.cache/huggingface/hub."""
    if download_dir:
        return os.path.expanduser(download_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def cached_snapshot(model: str, revision: str | None = None, download_dir: str | None = None) -> str | None:
    """The cached snapshot folder of `model` at `revision` (a branch, tag or commit), if any."""
    repo = os.path.join(hub_cache_dir(download_dir), "models--" + model.replace("/", "--"))
    rev = revision or "main"
    ref = os.path.join(repo, "refs", rev)
    if os.path.isfile(ref):
        with open(ref) as f:
            rev = f.read().strip()
    folder = os.path.join(repo, "snapshots", rev)
    return folder if os.path.isdir(folder) else None


def resolve_hub_id(model: str, revision: str | None = None, download_dir: str | None = None) -> str:
    """A local folder for the hub id: from the cache, else downloaded; else a clear error."""
    folder = cached_snapshot(model, revision, download_dir)
    if folder is not None:
        return folder
    where = f"{model!r} (revision {revision or 'main'})"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelLoadError(
            f"model {where} is not in the local Hugging Face cache ({hub_cache_dir(download_dir)}); to download it, "
            "install the hub extra (pip install 'rawpage[hub]'), or pass a local folder or .gguf file"
        ) from None
    try:
        return snapshot_download(model, revision=revision, cache_dir=download_dir, allow_patterns=_PATTERNS)
    except Exception as e:  # noqa: BLE001 - offline, unknown repository, gated model...
        raise ModelLoadError(
            f"model {where} is not in the local Hugging Face cache ({hub_cache_dir(download_dir)}) and could not be "
            f"downloaded ({_cause(e)}); check the id and the network, or pass a local folder or .gguf file"
        ) from None


def _cause(e: Exception) -> str:
    """The hub's reason in one line: its first line names it (offline, 401 gated, 404 no such repository)."""
    lines = str(e).strip().splitlines()
    first = lines[0].strip() if lines else ""
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__
