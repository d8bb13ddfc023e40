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

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _map_subschemas(schema: dict[str, Any], fn) -> dict[str, Any]:
    """A copy of `schema` with fn applied to each direct subschema."""
    out = dict(schema)
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = fn(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [fn(s) if isinstance(s, dict) else s for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: fn(s) if isinstance(s, dict) else s for k, s in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = fn(out["additionalProperties"])
    return out


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """Every object schema, at any depth ($defs included), without additionalProperties
    gets additionalProperties: false; one that sets it (true or a schema) keeps its choice."""
    out = _map_subschemas(schema, close_objects)
    if _is_object(out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _is_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema


def rebase_refs(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """Local refs ("#", "#/$defs/X") of a schema that now sits at JSON pointer `base`
    (e.g. "/items/anyOf/0/properties/arguments") rewritten to "#" + base + the rest."""
    out = _map_subschemas(schema, lambda s: rebase_refs(s, base))
    ref = out.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = "#" + base + ref[1:]
    return out
