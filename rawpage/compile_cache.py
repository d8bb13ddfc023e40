"""Compile C/C++ sources at first use and cache the shared library, for the two
places that build native code on the user's machine: the simulator (rawpage/sim,
CUDA sources compiled for the CPU) and the CPU kernels (rawpage/native).

A build is named by a digest of everything that decides its machine code: the
sources and headers, the flags, the compiler's version line and, for code built
with -march=native, the CPU's instruction-set flags. So a cache in a home
directory shared across machines never hands an AVX-512 build to a CPU without
AVX-512. Builds are published with an atomic rename: concurrent builders (two
test workers, two servers) never load a half-written file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path


class CompileError(RuntimeError):
    """The compiler rejected a source, or did not run; the message is the compiler's."""


def cache_dir(kind: str, env_var: str) -> Path:
    """$<env_var>, else $XDG_CACHE_HOME/rawpage/<kind>, else ~/.cache/rawpage/<kind>."""
    if os.environ.get(env_var):
        root = Path(os.environ[env_var])
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(xdg) / "rawpage" / kind
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.cache
def compiler_version(cc: str) -> str:
    """The compiler's first --version line (part of every build's digest)."""
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise CompileError(f"the compiler {cc!r} did not run ({e})") from e
    return out.stdout.splitlines()[0] if out.stdout else cc


def digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()[:20]


def files_digest(files: list[Path]) -> list[bytes]:
    return [f.name.encode() + b"\0" + f.read_bytes() for f in sorted(files)]


def run_compiler(cmd: list[str], what: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise CompileError(f"{what} failed: {cmd[0]!r} did not run ({e})") from e
    if proc.returncode != 0:
        raise CompileError(f"{what} failed:\n{proc.stderr.strip()}\n(command: {' '.join(cmd)})")
    return proc.stdout


def publish(tmp: Path, final: Path) -> None:
    """Atomic rename, so that concurrent builders never load a half-written file."""
    os.replace(tmp, final)
