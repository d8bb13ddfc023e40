"""Chat templates: a model's Jinja template turns a list of messages into prompt text.

Templates come from the model files (or `--chat-template`) and are untrusted,
so they render in jinja2's immutable sandbox, with the same environment
Hugging Face uses (trim_blocks, lstrip_blocks, `raise_exception`, `tojson`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any


class ChatTemplateError(ValueError):
    """The template could not be compiled or rendered for these messages."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=kw.get("sort_keys", False))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str) -> None:
        """`source` is a Jinja template string, or a path to a file holding one."""
        # jinja2 is imported here, not at the top: engines that never render a chat
        # template (benchmarks, the GPU check on a bare image) do not need it installed.
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if "{" not in source and os.path.isfile(source):
            with open(source) as f:
                source = f.read()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template does not compile: {e}") from None
        self.source = source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **ctx: Any) -> str:
        if not messages:
            raise ChatTemplateError("messages must be a non-empty list")
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt, **ctx)
        except ChatTemplateError:
            raise
        except Exception as e:  # a template bug or a message shape it did not expect
            raise ChatTemplateError(f"chat template failed to render: {type(e).__name__}: {e}") from None
