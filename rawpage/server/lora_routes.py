"""LoRA adapters at run time, as vLLM serves them (behind the API key, and only with
--allow-runtime-lora-updating or vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING):

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "sql", "load_inplace": false}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

A loaded adapter is a model name: requests with `"model": "sql"` run with it, and
GET /v1/models lists it with the base model as its parent (never its path).

Where a load may read (SECURITY.md "Runtime LoRA adapters"):
  - with --lora-dir, a lora_path must lie inside it (a relative one is taken from there);
  - with vLLM's $VLLM_ALLOW_RUNTIME_LORA_UPDATING and no --lora-dir, any folder the server
    can read, as in vLLM (a relative one from the working directory); the startup log says so.
Nothing there, not a folder, no adapter in it, or a link leading out of --lora-dir: one
and the same 404, so that no client can map the disk by the answers. An adapter that is
there but cannot be served (a malformed config, a rank above --max-lora-rank, the wrong
shapes) is a 500 with the reason, as vLLM answers.

Who may do what (SECURITY.md "Tenants"): an adapter that a key loads is that key's; only it
and the admin key see it (in /v1/models too), use it, unload or replace it; to every other
key it does not exist. --lora-modules adapters, and those the admin key loads (or anyone on
a server without keys), are shared: every key uses them, only the admin key changes them.
With --admin-only-lora-updating only the admin key loads and unloads (app.py's route table).

The folder is read and checked in a worker thread; the engine thread only takes in the
finished arrays, between two steps. Unloading forgets the name at once, while requests
already running with the adapter finish with it.
"""

from __future__ import annotations

import os
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rawpage.lora import LoRAAdapter, LoRAError, LoRANotFoundError, LoRARequest
from rawpage.server.args import ServerConfig
from rawpage.server.protocol import APIError
from rawpage.server.request import parse_lora_adapter, visible_adapters
from rawpage.server.state import Caller, ServerState


def _check_runtime_updating(state: ServerState) -> None:
    if not state.config.allow_runtime_lora_updating:
        raise APIError(
            "loading and unloading LoRA adapters at run time is off; the operator can allow it with "
            "--allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=1) and --lora-dir",
            403,
            type="permission_error",
        )


def describe_load_policy(config: ServerConfig) -> str | None:
    """The startup log's line on where runtime loads may read (None: they are off)."""
    if not config.allow_runtime_lora_updating:
        return None
    who = "the --admin-api-key only" if config.admin_only_lora_updating else "any API key"
    if config.lora_dir:
        return f"runtime LoRA loads ({who}) read only inside --lora-dir {os.path.realpath(config.lora_dir)}"
    return (
        f"runtime LoRA loads ({who}) may read any folder this server can read, as vLLM's do "
        f"($VLLM_ALLOW_RUNTIME_LORA_UPDATING; relative paths from {os.getcwd()}); confine them with --lora-dir"
    )


def lora_folder(path: str, config: ServerConfig) -> str:
    """The real path of a load's `lora_path` (relative ones from --lora-dir, or without one
    from the working directory). Outside --lora-dir on its face: a 400; a link that leads
    out of it: the 404 of nothing there (_not_found), so that links cannot be told apart."""
    if "\x00" in path:
        raise APIError("'lora_path' must not contain a NUL character", param="lora_path")
    if not config.lora_dir:  # vLLM's way (runtime_lora_anywhere): any folder
        return os.path.realpath(path)
    root = os.path.realpath(config.lora_dir)
    given = os.path.normpath(os.path.join(root, path))
    if os.path.commonpath([root, given]) != root:
        raise APIError("'lora_path' must name a folder inside the server's --lora-dir", param="lora_path")
    real = os.path.realpath(given)
    if os.path.commonpath([root, real]) != root:
        raise LoRANotFoundError(path)
    return real


def _not_found(given: str, config: ServerConfig) -> APIError:
    where = " inside the server's --lora-dir" if config.lora_dir else ""
    return APIError(
        f"No adapter found at lora_path '{given[:256]}': it must name a folder{where} holding a PEFT adapter "
        "(adapter_config.json and adapter_model.safetensors)",
        404,
        param="lora_path",
        type="not_found_error",
        code="lora_adapter_not_found",
    )


def _check_may_change(adapter: LoRAAdapter, caller: Caller) -> None:
    """Only its owner, or the admin key, unloads or replaces an adapter; a shared one, only the admin key."""
    if caller.admin or (adapter.owner is not None and adapter.owner == caller.key_id):
        return
    raise APIError(
        f"the LoRA adapter '{adapter.name}' is shared by every key (--lora-modules, or loaded by the admin key); "
        "only the --admin-api-key may unload or replace it",
        403,
        param="lora_name",
        type="permission_error",
        code="admin_key_required",
    )


async def load_lora_adapter(request: Request, state: ServerState) -> Response:
    _check_runtime_updating(state)
    caller, config = state.caller(request), state.config
    req = await state.parse(request, parse_lora_adapter, True)  # load
    lora = state.info.lora
    known = lora.adapters.get(req.name)
    if known is not None:
        if req.name not in visible_adapters(state, caller):
            raise APIError(
                f"the name '{req.name}' is taken by another API key's LoRA adapter; choose another name",
                param="lora_name",
                code="lora_name_taken",
            )
        if not req.load_inplace:
            raise APIError(
                f"The lora adapter '{req.name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
                param="lora_name",
            )
        _check_may_change(known, caller)
    try:
        path = lora_folder(req.path, config)
        # the files in a worker thread; the engine thread only takes in the result
        adapter = await state.off_loop(lora.read, LoRARequest(req.name, lora.next_id(), path))
    except LoRANotFoundError:
        raise _not_found(req.path, config) from None
    except LoRAError as e:  # there, but not servable: said with the client's own path, not --lora-dir's
        raise APIError(str(e).replace(path, req.path), 500, param="lora_path", type="internal_server_error") from None
    # A replacement keeps its owner; a new one is its loader's, or shared if the admin loads it.
    adapter.owner = known.owner if known is not None else (None if caller.admin else caller.key_id)
    try:
        await state.engine.add_lora(adapter, known)
    except LoRAError as e:
        raise APIError(str(e), param="lora_name") from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.name}' added successfully.")


async def unload_lora_adapter(request: Request, state: ServerState) -> Response:
    _check_runtime_updating(state)
    caller = state.caller(request)
    req = await state.parse(request, parse_lora_adapter, False)  # unload
    visible = visible_adapters(state, caller)
    known = visible.get(req.name)
    try:
        if known is None:
            raise KeyError(req.name)
        _check_may_change(known, caller)
        await state.engine.remove_lora(req.name, known)
    except KeyError:  # another key's adapter is not there for this one either
        raise APIError(
            f"The lora adapter '{req.name}' cannot be found; loaded: {sorted(visible)}",
            404,
            param="lora_name",
            type="not_found_error",
            code="model_not_found",
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{req.name}' removed successfully.")


def adapter_models(state: ServerState, caller: Caller, created: int, max_model_len: int) -> list[dict[str, Any]]:
    """/v1/models entries of the adapters the caller may use: parent = the base model; no
    paths (root is the name)."""
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
        for a in visible_adapters(state, caller).values()
    ]
