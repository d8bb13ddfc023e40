"""Command-line flags generated from dataclass fields, so that a setting's default,
choices and help are stated once: on the field (EngineArgs, ServerConfig).

    max_num_seqs: int = flag(256, "most sequences in one batch")

becomes `--max-num-seqs N` with `(default: 256)` in --help, and the dataclass keeps
the default for `LLM(...)` keywords. A field without `flag(...)` is not a flag.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any


def flag(
    default: Any = None,
    help: str = "",
    *,
    choices: list[Any] | None = None,
    type: Callable | None = None,
    default_text: str | None = None,
    factory: Callable[[], Any] | None = None,
    nargs: str | None = None,
) -> Any:
    """A dataclass field that is also a CLI flag. default_text replaces the default in --help
    where the value alone would mislead (None meaning "the model's", per-device defaults)."""
    meta = {"help": help, "choices": choices, "type": type, "default_text": default_text, "nargs": nargs}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def add_flags(group: argparse._ArgumentGroup, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per `flag(...)` field of the dataclass `cls`, in field order."""
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata or f.name in skip:
            continue
        group.add_argument("--" + f.name.replace("_", "-"), **_argparse_kwargs(f))


def given_flags(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The parsed flags that name fields of `cls`; a flag not given (None) keeps the field's default."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def _argparse_kwargs(f: dataclasses.Field) -> dict[str, Any]:
    meta, kind = f.metadata, _kind(f)
    default = None if f.default is dataclasses.MISSING else f.default
    shown = meta["default_text"] or _show(default)
    help_text = meta["help"] + (f" (default: {shown})" if shown else "")
    if kind is bool:
        # Left at None, so that a flag not given keeps the field's default (argparse 3.11
        # would also print a default of its own for BooleanOptionalAction).
        action = argparse.BooleanOptionalAction if default else "store_true"
        return {"action": action, "default": None, "help": help_text}
    kwargs: dict[str, Any] = {"default": default, "help": help_text, "type": meta["type"] or kind}
    if meta["choices"]:
        kwargs["choices"] = meta["choices"]
    if meta.get("nargs"):  # a list given as several words: --lora-modules a=/x b=/y
        kwargs["nargs"] = meta["nargs"]
    return kwargs


def _kind(f: dataclasses.Field) -> type:
    """bool, int, float or str, from the field's annotation (a string under `from __future__ import annotations`)."""
    ann = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for name, kind in (("bool", bool), ("float", float), ("int", int)):
        if name in ann.replace("|", " ").split():
            return kind
    return str


def _show(default: Any) -> str:
    if default is None or default is False or default == []:
        return ""
    if default is True:
        return "on"
    return str(default)
