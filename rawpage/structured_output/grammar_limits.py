"""The gate in front of llguidance: how big a grammar may be before we try to compile it.

llguidance compiles a grammar recursively, one stack frame chain per level of rules, so
a long chain of rules overflows its stack and kills the whole process (SIGSEGV, no log
line; SECURITY.md has the reproduction). A JSON schema's `$defs` chained by `$ref`s, or
a Lark grammar whose rules each call the next, is such a chain however shallow its JSON
is. The gate counts what makes a chain long or a compile slow, on the request itself and
before llguidance sees it:

    bytes     the grammar text llguidance would compile     --max-grammar-bytes
    rules     Lark rule (and terminal) definitions           --max-grammar-rules
    refs      `$ref`s in a JSON schema (a chain is no longer)  --max-grammar-refs
    choices   choice items, and enum / anyOf / oneOf items  --max-grammar-choices

What passes the gate is still validated in a child process (grammar_validator.py), so
that a shape the gate does not count can kill only the child.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rawpage.errors import InvalidRequestError

# A rule or terminal definition starts a line: `name:`, `?name:`, `!name:`, `NAME.2:`.
_LARK_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?[0-9]+)?[ \t]*:", re.MULTILINE)


@dataclass(frozen=True)
class GrammarLimits:
    """The engine's grammar limits (EngineArgs states the defaults and why)."""

    max_bytes: int
    max_rules: int
    max_refs: int
    max_choices: int
    timeout: float  # seconds the child may spend validating one grammar

    @classmethod
    def from_args(cls, args: Any) -> GrammarLimits:
        """From EngineArgs (or anything with its max_grammar_* fields)."""
        return cls(
            args.max_grammar_bytes,
            args.max_grammar_rules,
            args.max_grammar_refs,
            args.max_grammar_choices,
            args.grammar_compile_timeout,
        )

    def describe(self) -> str:
        """The limits with their flags, for an error that cannot say which one was at fault."""
        return (
            f"--max-grammar-bytes {self.max_bytes}, --max-grammar-rules {self.max_rules}, "
            f"--max-grammar-refs {self.max_refs}, --max-grammar-choices {self.max_choices}, "
            f"--grammar-compile-timeout {self.timeout:g}"
        )


def check_grammar_limits(so: Any, schema: Any, grammar: str, limits: GrammarLimits) -> None:
    """Raise InvalidRequestError naming the limit and its flag if the constraint `so`
    (StructuredOutputsParams; `schema` its parsed JSON schema, if any) or its grammar
    text is over one."""
    if so.choice is not None:
        _check("choice items", len(so.choice), limits.max_choices, "--max-grammar-choices")
    _check("bytes", len(grammar.encode()), limits.max_bytes, "--max-grammar-bytes")
    if so.grammar is not None:
        _check("rules", len(_LARK_RULE.findall(so.grammar)), limits.max_rules, "--max-grammar-rules")
        _check("$refs", so.grammar.count('"$ref"'), limits.max_refs, "--max-grammar-refs")  # in %json { ... }
    if schema is not None:
        refs, choices = schema_counts(schema)
        _check("$refs", refs, limits.max_refs, "--max-grammar-refs")
        _check("enum / anyOf / oneOf items", choices, limits.max_choices, "--max-grammar-choices")


def schema_counts(schema: Any) -> tuple[int, int]:
    """($ref count, enum + anyOf + oneOf items) over a whole JSON schema. Walked with a
    list, not recursion: an offline caller's schema has no nesting limit."""
    refs = choices = 0
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            refs += "$ref" in node
            choices += sum(len(node[k]) for k in ("enum", "anyOf", "oneOf") if isinstance(node.get(k), list))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return refs, choices


def _check(what: str, n: int, limit: int, flag: str) -> None:
    if n > limit:
        raise InvalidRequestError(
            f"structured_outputs: the grammar has {n} {what}; the limit is {limit} (set by {flag})",
            "structured_outputs",
        )
