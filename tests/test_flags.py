"""CLI flags are generated from EngineArgs and ServerConfig fields: defaults stated once."""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rawpage.engine_args import EngineArgs, parse_bytes
from rawpage.flags import add_flags, flag, given_flags
from rawpage.server.args import ServerConfig, add_server_args


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_server_args(p)
    EngineArgs.add_cli_args(p)
    return p


def test_a_flag_not_given_keeps_the_field_default():
    args = serve_parser().parse_args([])
    assert EngineArgs.from_cli_args(args) == EngineArgs()
    cfg = ServerConfig.from_cli_args(args)
    assert (cfg.host, cfg.port, cfg.allowed_methods, cfg.max_unread_tokens) == ("127.0.0.1", 8000, ["*"], 8192)


def test_given_flags_reach_the_dataclasses():
    argv = [
        "--max-num-seqs",
        "7",
        "--no-enable-prefix-caching",
        "--kv-cache-memory",
        "1MiB",
        "--enforce-eager",
        "--port",
        "9001",
        "--allowed-origins",
        "a, b",
        "--request-timeout",
        "2.5",
    ]
    args = serve_parser().parse_args(argv)
    e, s = EngineArgs.from_cli_args(args), ServerConfig.from_cli_args(args)
    assert (e.max_num_seqs, e.enable_prefix_caching, e.kv_cache_memory, e.enforce_eager) == (7, False, 2**20, True)
    assert (s.port, s.allowed_origins, s.request_timeout) == (9001, ["a", "b"], 2.5)


def test_choices_come_from_the_field_and_are_checked_in_python_too():
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["--block-size", "12"])
    with pytest.raises(ValueError, match="block_size must be one of 8, 16, 32, got 12"):
        EngineArgs(block_size=12)


def test_help_states_each_default_once_and_correctly():
    out = subprocess.run([sys.executable, "-m", "rawpage.cli", "serve", "--help"], capture_output=True, text=True)
    text = " ".join(out.stdout.split())  # argparse wraps lines
    text = text[text.index("options:") :]  # past the usage line
    assert out.returncode == 0
    assert text.count("(default:") == len(re.findall(r"\(default: [^)]*\)", text))
    for option, default in [
        ("--max-num-seqs", "256"),
        ("--block-size", "16"),
        ("--port", "8000"),
        ("--enable-prefix-caching", "on"),
        ("--max-unread-tokens", "8192"),
    ]:
        chunk = text[text.index(option) :]
        chunk = chunk[: chunk.index("(default:") + 40]
        assert chunk.count("(default:") == 1 and f"(default: {default})" in chunk, chunk
    assert "(default: None)" not in text and "(default: False)" not in text


def test_a_field_without_flag_metadata_is_not_a_flag():
    import dataclasses

    @dataclasses.dataclass
    class C:
        shown: int = flag(3, "a flag")
        hidden: int = 4

    p = argparse.ArgumentParser()
    add_flags(p.add_argument_group("g"), C)
    assert given_flags(C, p.parse_args(["--shown", "5"])) == {"shown": 5}
    with pytest.raises(SystemExit):
        p.parse_args(["--hidden", "1"])


ROOT = Path(__file__).resolve().parents[1]
TABLE_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOTHING = {"", "off", "none"}  # --help prints no default for False, None and []; a table says off or none


def flag_table_rows(text: str) -> list[tuple[list[str], str]]:
    """(the flags a row names, its default cell) for each row of a `| flag | default | ... |` table."""
    rows, in_table = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells[:2] == ["flag", "default"]:
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and cells[0].startswith("`--"):
            # `--a` / `--no-a` is one flag, spelled both ways
            names = [n for n in re.findall(r"`(--[a-z0-9-]+)`", cells[0]) if not n.startswith("--no-")]
            rows.append((names or re.findall(r"`(--[a-z0-9-]+)`", cells[0]), cells[1]))
    return rows


def help_default(action: argparse.Action) -> str:
    """The default as `--help` prints it: the text of "(default: ...)" in the help, else none."""
    m = re.search(r"\(default: (.*)\)$", action.help or "")
    return m.group(1) if m else ""


def same_default(table: str, shown: str) -> bool:
    """A table's default against --help's: the same words (backticks aside), the same number
    (10 against 10.0, "10 s" against 10) or the same size (4 MiB against 4MiB)."""
    table, shown = table.replace("`", "").strip(), shown.strip()
    if table.lower() in NOTHING and shown.lower() in NOTHING or table == shown:
        return True
    for parse in (lambda t: float(t.removesuffix(" s")), parse_bytes):
        try:
            return parse(table) == parse(shown)
        except (ValueError, argparse.ArgumentTypeError):
            pass
    return False


def wrong_table_defaults(text: str, actions: dict[str, argparse.Action]) -> list[str]:
    """Each flag of a flag table that --help does not know, or whose default differs from
    --help's. A row of several flags gives one default each, comma-separated."""
    wrong = []
    for names, cell in flag_table_rows(text):
        values = cell.split(", ") if len(names) > 1 else [cell]
        if len(values) != len(names):
            wrong.append(f"{names}: {len(names)} flags, {len(values)} defaults ({cell!r})")
            continue
        for name, value in zip(names, values):
            if name not in actions:
                wrong.append(f"{name}: no such flag")
            elif not same_default(value, help_default(actions[name])):
                wrong.append(f"{name}: the table says {value!r}, --help {help_default(actions[name])!r}")
    return wrong


def serve_actions() -> dict[str, argparse.Action]:
    """`rawpage serve`'s flags, from the CLI's own parser."""
    from rawpage.cli import _serve_parser

    serve = _serve_parser(argparse.ArgumentParser().add_subparsers())
    return {o: a for a in serve._actions for o in a.option_strings}


def test_the_flag_tables_state_the_defaults_help_prints():
    """README.md's and docs/*.md's flag tables against `rawpage serve --help`, whose defaults
    come from the EngineArgs / ServerConfig fields: every flag named exists and every
    default shown is the field's."""
    actions = serve_actions()
    wrong = [f"{path.name}: {w}" for path in TABLE_DOCS for w in wrong_table_defaults(path.read_text(), actions)]
    assert sum(len(flag_table_rows(p.read_text())) for p in TABLE_DOCS) > 40  # the tables were found
    assert not wrong, wrong


def test_the_table_check_catches_a_wrong_default():
    actions = serve_actions()
    table = "| flag | default | meaning |\n|---|---|---|\n"
    assert wrong_table_defaults(table + "| `--max-num-seqs` | 256 | x |\n| `--port` | 8000 | x |", actions) == []
    assert wrong_table_defaults(table + "| `--max-num-seqs` | 128 | x |", actions) == [
        "--max-num-seqs: the table says '128', --help '256'"
    ]
    assert wrong_table_defaults(table + "| `--host`, `--port` | 127.0.0.1 | x |", actions)  # one default for two
    assert wrong_table_defaults(table + "| `--max-request-bytes` | 8 MiB | x |", actions)
    assert wrong_table_defaults(table + "| `--metrics-public` | on | x |", actions)
    assert wrong_table_defaults(table + "| `--no-such-flag` | 1 | x |", actions) == ["--no-such-flag: no such flag"]


def test_the_readme_names_every_flag_of_serve():
    """Every `rawpage serve` flag is in the README, in a table or in the text beside them; but
    vLLM's flags with no effect here, which `rawpage serve --help` lists with their reasons
    (rawpage/server/vllm_flags.py), and to which the README points."""
    from rawpage.server.vllm_flags import NO_EFFECT

    readme = (ROOT / "README.md").read_text()
    assert "`rawpage serve --help` lists them, with the reasons" in " ".join(readme.split())
    inert = {f"--{p}{name}" for name in NO_EFFECT for p in ("", "no-")}
    names = {o for o in serve_actions() if o.startswith("--") and o != "--help"} - inert
    missing = sorted(n for n in names if not re.search(re.escape(n) + r"(?![a-z0-9-])", readme))
    assert not missing, f"README.md does not name {missing}"


def test_the_per_device_defaults_are_stated_once():
    from rawpage.engine_args import DEFAULT_MAX_NUM_BATCHED_TOKENS

    shown = help_default(serve_actions()["--max-num-batched-tokens"])
    assert all(str(n) in shown for n in DEFAULT_MAX_NUM_BATCHED_TOKENS.values()), shown
    assert EngineArgs().batched_tokens("cuda") == DEFAULT_MAX_NUM_BATCHED_TOKENS["cuda"]
    assert EngineArgs(max_num_batched_tokens=100).batched_tokens("cpu") == 100
