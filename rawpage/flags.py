"""Command-line flags generated from dataclass fields, so that a setting's default,
choices and help are stated once: on the field (EngineArgs, ServerConfig).

    max_num_seqs: int = flag(256, "most sequences in one batch")

becomes `--max-num-seqs N` with `(default: 256)` in --help, and the dataclass keeps
the default for `LLM(...)` keywords. A field without `flag(...)` is not a flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("rawpage")


def flag(
    default: Any = None,
    help: str = "",
    *,
    choices: list[Any] | None = None,
    type: Callable | None = None,
    default_text: str | None = None,
    factory: Callable[[], Any] | None = None,
    nargs: str | None = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A dataclass field that is also a CLI flag. default_text replaces the default in --help
    where the value alone would mislead (None meaning "the model's", per-device defaults);
    aliases are vLLM's short spellings (-tp)."""
    meta = {
        "help": help,
        "choices": choices,
        "type": type,
        "default_text": default_text,
        "nargs": nargs,
        "aliases": aliases,
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def add_flags(group: argparse._ArgumentGroup, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One flag per `flag(...)` field of the dataclass `cls`, in field order."""
    for f in dataclasses.fields(cls):
        if "help" in f.metadata and f.name not in skip:
            add_flag(group, cls, f.name)


def add_flag(group: argparse._ArgumentGroup, cls: type, name: str) -> None:
    """The flag of one `flag(...)` field (for help groups that put a few flags first)."""
    (f,) = [f for f in dataclasses.fields(cls) if f.name == name]
    group.add_argument("--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ()), **_argparse_kwargs(f))


def given_flags(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The flags given on the command line that name fields of `cls`. A flag not given parses
    as None, so that the field keeps its default and a caller can tell what the user set."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def log_inert_flags(given: set[str] | frozenset[str], rules: dict[str, str | bool]) -> None:
    """rules: a field -> why its flag has no effect here (falsy: it has one). One line for
    each such flag the user gave, so that a pasted command line does not mislead silently."""
    for name, why in rules.items():
        if why and name in given:
            logger.warning("--%s has no effect: %s", name.replace("_", "-"), why)


def dashed(argv: list[str]) -> list[str]:
    """vLLM's parser reads --max_model_len as --max-model-len: the same here (names only, not values)."""
    out = []
    for arg in argv:
        if arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


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
    kwargs: dict[str, Any] = {"default": None, "help": help_text, "type": meta["type"] or kind}
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
