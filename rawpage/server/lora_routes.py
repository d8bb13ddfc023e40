"""LoRA adapters at run time, as vLLM serves them (behind the API key):

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

A loaded adapter is a model name: requests with `"model": "sql"` run with it, and
GET /v1/models lists it with the base model as its parent. Loading reads the PEFT
folder in the engine thread between two steps; unloading forgets the name at once,
while requests already running with the adapter finish with it.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rawpage.engine import LLMEngine
from rawpage.lora import LoRAError, LoRARequest
from rawpage.lora.manager import LoRAManager
from rawpage.server.protocol import APIError
from rawpage.server.state import ServerState


def _manager(state: ServerState) -> LoRAManager:
    lora = state.llm.lora
    if lora is None:
        raise APIError("LoRA adapters are off; start the server with --enable-lora", 400)
    return lora


def _name(body: Any, state: ServerState) -> str:
    name = body.str("lora_name")
    if not name:
        raise APIError("'lora_name' is required", param="lora_name")
    if name == state.model_name:
        raise APIError(f"'{name}' is the base model's name", param="lora_name")
    return name


async def load_lora_adapter(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    lora = _manager(state)
    name, path = _name(body, state), body.str("lora_path")
    if not path:
        raise APIError("'lora_path' is required", param="lora_path")
    body.reject_unread()
    if name in lora.adapters:
        raise APIError(f"the LoRA adapter '{name}' is already loaded", param="lora_name")

    def add(engine: LLMEngine) -> None:
        engine.lora.add(LoRARequest(name, engine.lora.next_id(), path))

    try:
        await state.engine.run_in_engine_thread(add)
    except LoRAError as e:
        raise APIError(str(e), param="lora_path") from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: Request, state: ServerState) -> Response:
    body = await state.read_body(request)
    lora = _manager(state)
    name = _name(body, state)
    body.reject_unread(frozenset({"lora_int_id"}))  # vLLM's clients may send it; the name decides

    def remove(engine: LLMEngine) -> None:
        engine.lora.remove(name)

    try:
        await state.engine.run_in_engine_thread(remove)
    except KeyError:
        raise APIError(
            f"the LoRA adapter '{name}' is not loaded; loaded: {sorted(lora.adapters)}",
            404,
            param="lora_name",
            type="not_found_error",
            code="model_not_found",
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def adapter_models(state: ServerState, created: int, max_model_len: int) -> list[dict[str, Any]]:
    """/v1/models entries of the loaded adapters: root = their folder, parent = the base model."""
    lora = state.llm.lora
    if lora is None:
        return []
    return [
        {
            "id": a.name,
            "object": "model",
            "created": created,
            "owned_by": "rawpage",
            "root": a.path,
            "parent": state.model_name,
            "max_model_len": max_model_len,
        }
        for a in list(lora.adapters.values())
    ]
