"""JSON-schema rewrites a request's schema needs before it becomes a grammar.

    close_objects   strict mode: every object schema that does not say otherwise gets
                    "additionalProperties": false, as OpenAI's strict mode requires and
                    vLLM enforces (a schema that omits it would let the model invent keys)
    rebase_refs     a tool's parameters nested inside the tool-call grammar: its local
                    "#/..." pointers ($defs, definitions, "#" itself) get the path of
                    the place it now sits at, so they still resolve

Both return new schemas; the request's own objects are left as they were.
"""

from __future__ import annotations

from typing import Any

from rawpage.structured_output.schema_rewrite import map_subschemas


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """Every object schema, at any depth ($defs included), without additionalProperties
    gets additionalProperties: false; one that sets it (true or a schema) keeps its choice."""
    out = map_subschemas(schema, close_objects)
    if _is_object(out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema


def rebase_refs(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """Local refs ("#", "#/$defs/X") of a schema that now sits at JSON pointer `base`
    (e.g. "/items/anyOf/0/properties/arguments") rewritten to "#" + base + the rest."""
    out = map_subschemas(schema, lambda s: rebase_refs(s, base))
    ref = out.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = "#" + base + ref[1:]
    return out
