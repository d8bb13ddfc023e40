"""Keep the line numbers of docs/reading-guide.md true.

The guide names each hop of a request as `path:line Qualified.name`, e.g.
`rawpage/engine.py:192 LLMEngine.step`. This tool finds every such reference, looks the
name up in that file (Python with ast: a function, a method as Class.method, a class; C and
CUDA: a top-level function definition), and rewrites the line to the one the definition
starts on (its `def`, not its decorators), so that one command fixes the guide after any
code change:

    python tools/reading_guide.py           # rewrite the line numbers in place
    python tools/reading_guide.py --check   # exit 1, listing every stale or missing name

A name the file does not define cannot be fixed by a number: both modes list it and exit 1.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "reading-guide.md"

# `path:line Name.name` inside backticks; the path is relative to the repository root.
REFERENCE = re.compile(r"`(?P<path>[\w./-]+\.(?:py|c|h|cu|cuh)):(?P<line>\d+) (?P<name>[A-Za-z_][\w.]*)`")


def python_definitions(source: str) -> dict[str, int]:
    """Qualified name (Class.method, function, Class) -> the line of its first definition."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                found.setdefault(name, child.lineno)
                visit(child, name + ".")

    visit(ast.parse(source), "")
    return found


def c_definition(source: str, name: str) -> int | None:
    """The line of a C/CUDA function's definition: an unindented line naming it before a
    `(` whose declaration reaches a `{` before any `;` (so a prototype does not count)."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line[:1].isspace() or not re.search(rf"\b{re.escape(name)}\s*\(", line):
            continue
        rest = "\n".join(lines[i:])
        brace, semicolon = rest.find("{"), rest.find(";")
        if brace != -1 and (semicolon == -1 or brace < semicolon):
            return i + 1
    return None


def definition_line(path: Path, name: str) -> int | None:
    """Where `name` is defined in `path`, or None if it is not (or the file is missing)."""
    if not path.is_file():
        return None
    source = path.read_text()
    if path.suffix == ".py":
        return python_definitions(source).get(name)
    return c_definition(source, name)


def fix(text: str, root: Path = ROOT) -> tuple[str, list[str], list[str]]:
    """The guide with every reference's line set to its definition's, the references
    that were stale ("path:old name -> new"), and those whose name was not found."""
    stale: list[str] = []
    missing: list[str] = []

    def replace(m: re.Match) -> str:
        path, line, name = m["path"], int(m["line"]), m["name"]
        actual = definition_line(root / path, name)
        if actual is None:
            missing.append(f"{path}:{line} {name}: no such {'file' if not (root / path).is_file() else 'definition'}")
            return m[0]
        if actual != line:
            stale.append(f"{path}:{line} {name} -> {actual}")
        return f"`{path}:{actual} {name}`"

    return REFERENCE.sub(replace, text), stale, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a line is stale or a name missing")
    p.add_argument("guide", nargs="?", type=Path, default=GUIDE)
    args = p.parse_args(argv)
    text = args.guide.read_text()
    fixed, stale, missing = fix(text)
    for problem in missing:
        print(f"missing: {problem}")
    for change in stale:
        print(f"{'stale' if args.check else 'fixed'}: {change}")
    if not args.check and fixed != text:
        args.guide.write_text(fixed)
    n = len(REFERENCE.findall(text))
    print(f"{args.guide.name}: {n} references, {len(stale)} stale, {len(missing)} missing")
    return 1 if missing or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
