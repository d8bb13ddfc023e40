"""Chat templates: a model's Jinja template turns a list of messages into prompt text.

Templates come from the model files, `--chat-template`, or (only with
`--trust-request-chat-template`) a request, so they are untrusted code. They
render in jinja2's immutable sandbox, with the environment Hugging Face uses
(trim_blocks, lstrip_blocks, `raise_exception`, `tojson`), and within a budget:

- a template is always a string; only the operator's `--chat-template` may name
  a file (`ChatTemplate.from_arg`), so no request can make the server read one;
- rendering stops after `timeout` seconds: a trace function checks the clock on
  every line the compiled template runs, so a loop that prints nothing is caught;
- no single expression can outgrow the budget, since no clock can stop one C call:
  `*`, `**`, `+`, `%`, `~`, the growing str methods (center, ljust, format, replace,
  join...) and filters (center, indent, wordwrap, format, join...) estimate their
  result from their inputs and refuse one over `max_chars` (integers: 4096 bits)
  before they run (rawpage/text/template_budget.py). The output as a whole is bounded by
  `max_chars` too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from typing import Any

from rawpage.text import template_budget as budget

DEFAULT_MAX_CHARS = 4 << 20  # characters of rendered prompt; more cannot fit a context anyway
DEFAULT_TIMEOUT = 2.0  # seconds of rendering; real templates take about a millisecond


class ChatTemplateError(ValueError):
    """The template could not be compiled or rendered for these messages."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    budget.check_json_indent(indent)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=kw.get("sort_keys", False))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _sandbox(max_chars: int):
    """An immutable sandbox in which no single operation can build a value past the budget
    (rawpage/text/template_budget.py): `*`, `**`, `+`, `%`, `~`, the growing str methods and filters."""
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedCodeGenerator(CodeGenerator):
        def visit_Concat(self, node: Any, frame: Any) -> None:
            # `a ~ b` compiles to str_join((a, b)); this checks the size first.
            self.write("environment.concat_bounded((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})
        code_generator_class = BoundedCodeGenerator

        def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
            budget.check_binop(op, left, right, max_chars)
            return super().call_binop(context, op, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            args = budget.check_call(__obj, args, kwargs, max_chars)
            return super().call(__context, __obj, *args, **kwargs)

        def concat_bounded(self, values: tuple[Any, ...]) -> str:
            strings = tuple(map(str, values))
            budget.check_concat(strings, max_chars)
            return "".join(strings)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    env.filters.update(budget.bounded_filters(env, max_chars))
    return env


class ChatTemplate:
    def __init__(self, source: str, max_chars: int = DEFAULT_MAX_CHARS, timeout: float = DEFAULT_TIMEOUT) -> None:
        """`source` is Jinja template text; it is never read as a path (see `from_arg`)."""
        # jinja2 is imported here, not at the top: engines that never render a chat
        # template (benchmarks, the GPU check on a bare image) do not need it installed.
        from jinja2 import TemplateError

        if not isinstance(source, str):
            raise ChatTemplateError("a chat template must be a string")
        self.max_chars, self.timeout = max_chars, timeout
        env = _sandbox(max_chars)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.globals.pop("lipsum", None)  # lipsum(n=10**9) would build a gigabyte
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from None
        self.source = source

    @classmethod
    def from_arg(cls, value: str) -> ChatTemplate:
        """The operator's `--chat-template`: a path to a Jinja file, or the template itself."""
        if "{" not in value and os.path.isfile(value):
            with open(value) as f:
                return cls(f.read())
        if "{" not in value:
            raise ChatTemplateError(f"--chat-template {value!r} is neither a file nor a Jinja template")
        return cls(value)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **ctx: Any) -> str:
        if not messages:
            raise ChatTemplateError("messages must be a non-empty list")
        deadline = time.monotonic() + self.timeout
        pieces, size = [], 0
        try:
            with _Deadline(deadline, self.timeout):
                for piece in self.template.generate(
                    messages=messages, add_generation_prompt=add_generation_prompt, **ctx
                ):
                    size += len(piece)
                    if size > self.max_chars:
                        raise ChatTemplateError(f"the rendered prompt is over {self.max_chars} characters")
                    pieces.append(piece)
        except ChatTemplateError:
            raise
        except budget.TemplateBudgetError as e:
            raise ChatTemplateError(str(e)) from None
        except Exception as e:  # a template bug or a message shape it did not expect
            raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None
        return "".join(pieces)


class _Deadline:
    """Trace the compiled template's own frames (Jinja names them '<template>') and raise
    once the deadline has passed. Other frames are not traced, so the cost is a clock read
    per template line. Works in whichever thread renders; restores the previous tracer."""

    def __init__(self, deadline: float, timeout: float) -> None:
        self.deadline, self.timeout = deadline, timeout

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the chat template took longer than {self.timeout:g} s to render")
        return self._line

    def _call(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            return self._line
        return None

    def __enter__(self) -> None:
        self._previous = sys.gettrace()
        sys.settrace(self._call)

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._previous)
