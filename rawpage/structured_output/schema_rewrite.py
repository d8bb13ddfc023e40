"""Number caps: each JSON schema's integers and numbers without bounds get a finite length,
as llama.cpp's converter gives them (else a model can write digits until max_tokens).
llguidance has no digit option, so we add the keywords it turns into finite numbers:
an integer's missing minimum / maximum becomes -(10**16 - 1) / 10**16 - 1; a number's
becomes exclusiveMinimum -10**16 / exclusiveMaximum 10**16, and a missing multipleOf
1e-10 (the smallest llguidance takes): 16 digits before the point, 10 after, no exponent.
A bound the schema gives is kept; a missing side is added only where the schema stays
satisfiable, and `enum` / `const` are left as they are. map_subschemas is shared with
rawpage/server/json_schema.py."""

from __future__ import annotations

from typing import Any

CAP = 10**16  # integers and integer parts stay below it: 16 digits
FRACTION = 1e-10  # multipleOf of an uncapped number: 10 digits after the point

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def map_subschemas(schema: dict[str, Any], fn) -> dict[str, Any]:
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


def cap_numbers(schema: Any) -> Any:
    """A copy of `schema` (any depth, $defs included) with the caps above."""
    if not isinstance(schema, dict):
        return schema
    out = map_subschemas(schema, cap_numbers)
    if "enum" in out or "const" in out:
        return out  # finite already, and a bound could exclude a listed value
    kind = out.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    low, high = _bound(out, "minimum", "exclusiveMinimum"), _bound(out, "maximum", "exclusiveMaximum")
    if "number" in kinds:
        if low is None and (high is None or high > -CAP):
            out["exclusiveMinimum"] = -CAP
        if high is None and (low is None or low < CAP):
            out["exclusiveMaximum"] = CAP
        out.setdefault("multipleOf", FRACTION)
    elif "integer" in kinds:
        if low is None and (high is None or high >= 1 - CAP):
            out["minimum"] = 1 - CAP
        if high is None and (low is None or low <= CAP - 1):
            out["maximum"] = CAP - 1
    return out


def _bound(schema: dict[str, Any], *keys: str) -> float | None:
    """The first of `keys` set to a number (draft 4's boolean exclusive* are flags)."""
    for key in keys:
        value = schema.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None
