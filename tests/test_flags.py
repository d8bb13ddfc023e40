"""CLI flags are generated from EngineArgs and ServerConfig fields: defaults stated once."""

import argparse
import re
import subprocess
import sys

import pytest

from rawpage.engine_args import EngineArgs
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


def test_the_flag_tables_in_the_docs_name_real_flags_with_their_defaults():
    """README.md's and docs/*.md's flag tables against the parser: every flag named in a
    table's first column exists, and a bare-number default is the field's default."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    parser = serve_parser()
    actions = {o: a for a in parser._actions for o in a.option_strings}
    config = ServerConfig()
    unknown, wrong = [], []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for row in path.read_text().splitlines():
            if not row.startswith("| `--"):
                continue
            cells = [c.strip() for c in row.split("|")[1:-1]]
            names = re.findall(r"`(--[a-z0-9-]+)`", cells[0])
            unknown += [f"{path.name}: {n}" for n in names if n not in actions]
            if len(names) == 1 and names[0] in actions and re.fullmatch(r"[0-9.]+", cells[1]):
                dest = actions[names[0]].dest
                default = getattr(EngineArgs(), dest, None) if hasattr(EngineArgs(), dest) else getattr(config, dest)
                if float(cells[1]) != float(default):
                    wrong.append(f"{path.name}: {names[0]} says {cells[1]}, the field {default}")
    assert not unknown and not wrong, unknown + wrong
