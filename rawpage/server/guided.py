"""Request fields that constrain the output to a grammar, in OpenAI's and vLLM's shapes.

    response_format      {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
    guided_json, guided_regex, guided_choice, guided_grammar      vLLM's older names
    structured_outputs   {"json" | "regex" | "choice" | "grammar" | "json_object": ...}   vLLM's current name

At most one of them may be given; each becomes a StructuredOutputsParams.
"""

from __future__ import annotations

import json
from typing import Any

from rawpage.errors import InvalidRequestError
from rawpage.server.json_schema import close_objects
from rawpage.server.protocol import APIError, Body, loads_field
from rawpage.structured_output import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_outputs_from(body: Body) -> StructuredOutputsParams | None:
    found: list[tuple[str, dict[str, Any]]] = []
    body.mark_read("response_format", "structured_outputs", *_GUIDED)
    rf = _response_format(body)
    if rf is not None:
        found.append(("response_format", rf))
    for name, key in _GUIDED.items():
        if body.data.get(name) is not None:
            found.append((name, {key: body.data[name]}))
    if body.data.get("structured_outputs") is not None:
        so = body.obj("structured_outputs")
        fields = {k: so.value(k) for k in ("json", "regex", "choice", "grammar")}
        fields = {k: v for k, v in fields.items() if v is not None}
        if so.bool("json_object", False):
            fields["json_object"] = True
        so.reject_unread()
        found.append(("structured_outputs", fields))
    if len(found) > 1:
        raise APIError(f"give one output constraint, not {' and '.join(n for n, _ in found)}", param=found[1][0])
    if not found:
        return None
    name, fields = found[0]
    for key, kind in (("json", (dict, str)), ("regex", str), ("choice", list), ("grammar", str)):
        if key in fields and not isinstance(fields[key], kind):
            raise APIError(f"'{name}' {key}: wrong type {type(fields[key]).__name__}", param=name)
    if isinstance(fields.get("json"), str):  # a schema as JSON text: parsed here, within the body's depth
        fields["json"] = _schema_text(fields["json"], name if name != "structured_outputs" else f"{name}.json")
    try:
        return StructuredOutputsParams(**fields)
    except InvalidRequestError as e:
        raise APIError(str(e), param=name) from None


def _schema_text(text: str, param: str) -> dict[str, Any]:
    try:
        schema = loads_field(text, param)
    except json.JSONDecodeError as e:
        raise APIError(f"'{param}' is not valid JSON: {e}", param=param) from None
    if not isinstance(schema, dict):
        raise APIError(f"'{param}' must be a JSON schema object", param=param)
    return schema


def _response_format(body: Body) -> dict[str, Any] | None:
    if body.data.get("response_format") is None:
        return None
    rf = body.obj("response_format")
    kind = rf.str("type")
    if kind == "text":
        out = None
    elif kind == "json_object":
        out = {"json_object": True}
    elif kind == "json_schema":
        js = rf.obj("json_schema")
        js.str("name")
        js.str("description")
        strict = js.bool("strict", None)  # the schema is enforced either way; strict also closes its objects
        schema = js.dict("schema")
        if not schema:
            raise APIError(
                "'response_format.json_schema.schema' must be a non-empty JSON schema",
                param="response_format.json_schema.schema",
            )
        js.reject_unread()
        out = {"json": close_objects(schema) if strict else schema}
    else:
        raise APIError(
            f"'response_format.type' must be text, json_object or json_schema, got {kind!r}"[:200],
            param="response_format.type",
        )
    rf.reject_unread()
    return out
