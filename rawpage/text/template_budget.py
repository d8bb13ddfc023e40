"""The size budget of one chat-template expression.

A template's render is stopped by a clock between its lines (chat_template.py), but a
single expression runs as one C call that no clock can interrupt: `(10**64)**64` is a
number of 10^7 digits that takes seconds to compute, holding the GIL and so every other
thread of the server; `'%0400000000d' % 1` or `'x'|center(400000000)` allocate
gigabytes before the output's own size is checked. So every operation that can make a
value much larger than its inputs is checked here *before* it runs, from its inputs
alone: the result's estimated size must fit the render's character budget (numbers:
MAX_INT_BITS). The estimates are upper bounds, so a refused operation would really
have been too big (or close to it); templates that build prompts never come near.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from typing import Any

MAX_INT_BITS = 4096  # the largest integer a template may compute; prompts need none this big
MAX_JSON_INDENT = 64  # tojson(indent=...): each level of nesting repeats it

# printf-style conversion: %[(name)][flags][width][.precision][length]type
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]?")


class TemplateBudgetError(ValueError):
    """An expression whose result would exceed the template's budget."""


def _refuse(what: str, limit: int) -> None:
    raise TemplateBudgetError(f"the template {what} (the limit is {limit})")


def check_width(width: Any, max_chars: int, what: str = "pads to a width", unit: str = "characters") -> None:
    if isinstance(width, int) and width > max_chars:
        _refuse(f"{what} of {width} {unit}", max_chars)


def check_printf(fmt: Any, max_chars: int) -> None:
    """`fmt % args`: no width or precision over the budget, and none taken from the args (`%*d`)."""
    if not isinstance(fmt, str):
        return
    for m in _PRINTF.finditer(fmt):
        for number in m.groups():
            if number == "*":
                _refuse("takes a %-format width from its arguments ('*')", max_chars)
            check_width(int(number) if number else 0, max_chars, "formats to a width")


def check_str_format(fmt: Any, max_chars: int) -> None:
    """`fmt.format(...)`: no width or precision over the budget, and no nested `{}` in a spec."""
    if not isinstance(fmt, str):
        return
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            _refuse("takes a format spec from its arguments ('{:{}}')", max_chars)
        for number in re.findall(r"\d+", spec):
            check_width(int(number), max_chars, "formats to a width")


def check_binop(op: str, left: Any, right: Any, max_chars: int) -> None:
    """`left op right` for the intercepted operators *, **, + and %."""
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right * math.log2(abs(left)) > MAX_INT_BITS:
            _refuse(f"raises a {left.bit_length()}-bit number to the power {right}", MAX_INT_BITS)
    elif op == "*" and isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            _refuse("multiplies numbers into one of over 4096 bits", MAX_INT_BITS)
    elif op == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int) and len(seq) * times > max_chars:
                _refuse(f"builds a value over {max_chars} long", max_chars)
    elif op == "+" and isinstance(left, (str, bytes, list, tuple)) and isinstance(right, (str, bytes, list, tuple)):
        if len(left) + len(right) > max_chars:
            _refuse(f"builds a value over {max_chars} long", max_chars)
    elif op == "%":
        check_printf(left, max_chars)


def check_concat(values: tuple[str, ...], max_chars: int) -> None:
    """`a ~ b ~ c`: doubled in a loop it would grow without bound."""
    if sum(len(v) for v in values) > max_chars:
        _refuse(f"joins a string over {max_chars} characters", max_chars)


def _grown(s: Any, extra: int, max_chars: int) -> None:
    if len(s) + extra > max_chars:
        _refuse(f"builds a string over {max_chars} characters", max_chars)


def _check_join(sep: Any, items: list[Any], max_chars: int) -> None:
    total = len(sep) * max(len(items) - 1, 0)  # the separators first: the product is what explodes
    for x in items:
        if total > max_chars:
            break
        total += len(x) if isinstance(x, (str, bytes)) else 0
    _grown("", total, max_chars)


def _check_replace(s: Any, old: Any, new: Any, max_chars: int) -> None:
    if isinstance(old, type(s)) and isinstance(new, type(s)):
        count = s.count(old) if old else len(s) + 1
        _grown(s, count * len(new), max_chars)


def _check_translate(s: Any, table: Any, max_chars: int) -> None:
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, dict) else 1
    _grown(s, len(s) * longest, max_chars)


# str (and bytes) methods that can return much more than they are given:
# name -> check(self, args, kwargs, max_chars)
_METHOD_CHECKS: dict[str, Callable[[Any, tuple, dict, int], None]] = {
    "center": lambda s, a, kw, m: check_width(a[0] if a else kw.get("width"), m),
    "ljust": lambda s, a, kw, m: check_width(a[0] if a else kw.get("width"), m),
    "rjust": lambda s, a, kw, m: check_width(a[0] if a else kw.get("width"), m),
    "zfill": lambda s, a, kw, m: check_width(a[0] if a else kw.get("width"), m),
    "expandtabs": lambda s, a, kw, m: _grown(s, s.count("\t" if isinstance(s, str) else b"\t") * _tabsize(a, kw), m),
    "replace": lambda s, a, kw, m: _check_replace(s, *(list(a) + [kw.get("old"), kw.get("new")])[:2], m),
    "translate": lambda s, a, kw, m: _check_translate(s, a[0] if a else None, m),
    "format": lambda s, a, kw, m: check_str_format(s, m),
    "format_map": lambda s, a, kw, m: check_str_format(s, m),
}


def _tabsize(args: tuple, kwargs: dict) -> int:
    size = args[0] if args else kwargs.get("tabsize", 8)
    return size if isinstance(size, int) else 8


def check_call(obj: Any, args: tuple, kwargs: dict, max_chars: int) -> tuple:
    """Before a template calls `obj(*args, **kwargs)`: the string methods above. Returns
    the args to call with (join's iterable, materialized so that it is measured once)."""
    method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(owner, (str, bytes)):
        return args
    if name == "join" and len(args) == 1:
        items = list(args[0])
        _check_join(owner, items, max_chars)
        return (items,)
    check = _METHOD_CHECKS.get(name)
    if check is not None:
        check(owner, args, kwargs, max_chars)
    return args


def _arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _check_indent(s: Any, width: Any, max_chars: int) -> None:
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    _grown(str(s), (str(s).count("\n") + 2) * pad, max_chars)


def _check_wordwrap(s: Any, width: Any, wrapstring: Any, max_chars: int) -> None:
    check_width(width, max_chars)
    _grown(str(s), (len(str(s)) + 1) * len(wrapstring or "\n"), max_chars)  # at most a line per character


# Jinja filters that can return much more than they are given: name -> check(value, args, kwargs, max_chars),
# args and kwargs as the template passed them after the value.
_FILTER_CHECKS: dict[str, Callable[[Any, tuple, dict, int], None]] = {
    "center": lambda v, a, kw, m: check_width(_arg(a, kw, 0, "width", 80), m),
    "indent": lambda v, a, kw, m: _check_indent(v, _arg(a, kw, 0, "width", 4), m),
    "wordwrap": lambda v, a, kw, m: _check_wordwrap(v, _arg(a, kw, 0, "width", 79), _arg(a, kw, 2, "wrapstring"), m),
    "format": lambda v, a, kw, m: check_printf(str(v), m),
    "replace": lambda v, a, kw, m: _check_replace(str(v), str(_arg(a, kw, 0, "old")), str(_arg(a, kw, 1, "new")), m),
    "batch": lambda v, a, kw, m: check_width(_arg(a, kw, 0, "linecount"), m, "makes batches", "items"),
    "slice": lambda v, a, kw, m: check_width(_arg(a, kw, 0, "slices"), m, "makes", "slices"),
}


def _join_items(env: Any, value: Any, rest: tuple, kwargs: dict, max_chars: int) -> tuple[list, str]:
    """`value|join(d, attribute)`: the items to join (attributes taken), checked, and the separator."""
    from jinja2.filters import make_attrgetter

    d, attribute = _arg(rest, kwargs, 0, "d", ""), _arg(rest, kwargs, 1, "attribute")
    items = list(value)
    if attribute is not None:
        getter = make_attrgetter(env, attribute)
        items = [getter(x) for x in items]
    _check_join(str(d), [str(x) for x in items], max_chars)
    return items, d


def bounded_filters(env: Any, max_chars: int) -> dict[str, Callable]:
    """Jinja's filters that can grow a value, each checked before it runs."""
    from jinja2.utils import _PassArg

    def bounded(name: str) -> Callable:
        original = env.filters[name]
        skip = 1 if _PassArg.from_obj(original) else 0  # the context or environment jinja passes first

        def run(*args: Any, **kwargs: Any) -> Any:
            value, rest = args[skip], args[skip + 1 :]
            if name == "join":  # measured once, then joined
                items, d = _join_items(env, value, rest, kwargs, max_chars)
                return original(*args[:skip], items, d)
            _FILTER_CHECKS[name](value, rest, kwargs, max_chars)
            return original(*args, **kwargs)

        if skip:
            run.jinja_pass_arg = original.jinja_pass_arg  # type: ignore[attr-defined]
        return run

    return {name: bounded(name) for name in (*_FILTER_CHECKS, "join")}


def check_json_indent(indent: Any) -> None:
    size = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if size > MAX_JSON_INDENT:
        _refuse(f"indents JSON by {size}", MAX_JSON_INDENT)
