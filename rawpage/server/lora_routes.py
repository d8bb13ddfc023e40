"""LoRA adapters at run time, as vLLM serves them (behind the API key, and only with
--allow-runtime-lora-updating or vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING):

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "sql"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

A loaded adapter is a model name: requests with `"model": "sql"` run with it, and
GET /v1/models lists it with the base model as its parent (never its path). A
lora_path must resolve, links followed, inside --lora-dir; a relative one is taken
from there. The folder is read and checked in a worker thread; the engine thread
only takes in the finished arrays, between two steps. Unloading forgets the name at
once, while requests already running with the adapter finish with it.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rawpage.lora import LoRAError, LoRARequest
from rawpage.server.protocol import APIError
from rawpage.server.request import parse_lora_adapter
from rawpage.server.state import ServerState


def _check_runtime_updating(state: ServerState) -> None:
    if not state.config.allow_runtime_lora_updating:
        raise APIError(
            "loading and unloading LoRA adapters at run time is off; the operator can allow it with "
            "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=1) and --lora-dir",
            403,
            type="permission_error",
        )


def inside_lora_dir(path: str, lora_dir: str) -> str:
    """The real path of `path` (relative ones from --lora-dir), refused unless it lies inside --lora-dir."""
    try:
        root = os.path.realpath(lora_dir)
        real = os.path.realpath(os.path.join(root, path))
        inside = os.path.commonpath([root, real]) == root
    except ValueError:  # a NUL byte, or paths on different drives
        inside = False
    if not inside:
        raise APIError("'lora_path' must name a folder inside the server's --lora-dir", param="lora_path")
    return real


async def load_lora_adapter(request: Request, state: ServerState) -> Response:
    _check_runtime_updating(state)
    req = parse_lora_adapter(await state.read_body(request), state, load=True)
    lora = state.info.lora
    if req.name in lora.adapters:
        raise APIError(f"the LoRA adapter '{req.name}' is already loaded", param="lora_name")
    path = inside_lora_dir(req.path, state.config.lora_dir or "")
    try:  # the files in a worker thread; the engine thread only takes in the result
        adapter = await state.off_loop(lora.read, LoRARequest(req.name, lora.next_id(), path))
        await state.engine.add_lora(adapter)
    except LoRAError as e:  # said with the client's own path, not where --lora-dir lies
        raise APIError(str(e).replace(path, req.path), param="lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.name}' added successfully.")


async def unload_lora_adapter(request: Request, state: ServerState) -> Response:
    _check_runtime_updating(state)
    req = parse_lora_adapter(await state.read_body(request), state, load=False)
    try:
        await state.engine.remove_lora(req.name)
    except KeyError:
        raise APIError(
            f"the LoRA adapter '{req.name}' is not loaded; loaded: {sorted(state.info.lora.adapters)}",
            404,
            param="lora_name",
            type="not_found_error",
            code="model_not_found",
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.name}' removed successfully.")


def adapter_models(state: ServerState, created: int, max_model_len: int) -> list[dict[str, Any]]:
    """/v1/models entries of the loaded adapters: parent = the base model; no paths (root is the name)."""
    lora = state.info.lora
    if lora is None:
        return []
    return [
        {
            "id": a.name,
            "object": "model",
            "created": created,
            "owned_by": "rawpage",
            "root": a.name,
            "parent": state.model_name,
            "max_model_len": max_model_len,
        }
        for a in list(lora.adapters.values())
    ]
