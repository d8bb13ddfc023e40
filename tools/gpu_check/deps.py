"""Make pytest and transformers importable on a GPU image that lacks them, offline.

    python -m tools.gpu_check.deps --wheelhouse .gpu-wheels --target /tmp/rawpage-deps

Unpacks the wheels in the wheelhouse (filled by tools/gpu_wheels.sh) that fit
this interpreter into --target, which the caller then puts first on
PYTHONPATH. A wheel is a zip of what would land in site-packages, so no pip is
needed. First pass: only distributions whose packages this interpreter cannot
import already (the image's own versions win). If `transformers` or `pytest`
still fails to import (say, the image's tokenizers is older than transformers
accepts), second pass: everything but the large packages the image must keep
(numpy, torch, CuPy), shadowing the image's copies. Prints what it did; exits
0 even when something stays missing, because the check's steps report that
themselves.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import subprocess
import sys
import zipfile

KEEP_FROM_IMAGE = {"numpy", "torch", "cupy", "cupy_backends", "cupyx", "nvidia", "triton", "functorch", "torchgen"}
WANTED = ("pytest", "transformers")


def fits_this_python(wheel: str) -> bool:
    """Pure wheels, abi3 wheels, and wheels built for exactly this CPython, on x86_64 Linux."""
    tags = os.path.basename(wheel)[:-4].split("-")[-3:]
    py, abi, plat = tags
    if plat == "any":
        return True
    if "x86_64" not in plat or "linux" not in plat:
        return False
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if abi == "abi3":
        return int(py[2:] or 0) <= int(here[2:]) if py.startswith("cp") else True
    return here in py.split(".")


def top_level(wheel: str) -> set[str]:
    """The importable names a wheel installs (its top-level folders and modules)."""
    with zipfile.ZipFile(wheel) as z:
        names = {n.split("/")[0] for n in z.namelist()}
    return {n[:-3] if n.endswith(".py") else n.split(".")[0] for n in names if not n.endswith((".dist-info", ".data"))}


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def still_missing(target: str) -> list[str]:
    """WANTED modules that fail to import with target first on the path (in a fresh process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([target, os.environ.get("PYTHONPATH", "")]))
    missing = []
    for mod in WANTED:
        code = f"import {mod}" + (" ; from transformers import LlamaForCausalLM" if mod == "transformers" else "")
        if subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode:
            missing.append(mod)
    return missing


def unpack(wheels: list[str], target: str, shadow: bool) -> list[str]:
    done = []
    for w in wheels:
        names = top_level(w)
        if names & KEEP_FROM_IMAGE or (not shadow and any(importable(n) for n in names)):
            continue
        with zipfile.ZipFile(w) as z:
            z.extractall(target)
        done.append(os.path.basename(w).split("-")[0])
    return done


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheelhouse", default=".gpu-wheels")
    ap.add_argument("--target", required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.target, exist_ok=True)
    missing = still_missing(args.target)
    if not missing:
        print("deps: pytest and transformers import already")
        return []
    wheels = sorted(w for w in glob.glob(os.path.join(args.wheelhouse, "*.whl")) if fits_this_python(w))
    if not wheels:
        print(f"deps: {', '.join(missing)} missing and no wheelhouse at {args.wheelhouse} (see tools/gpu_wheels.sh)")
        return missing
    print("deps: unpacked", ", ".join(unpack(wheels, args.target, shadow=False)) or "nothing")
    missing = still_missing(args.target)
    if missing:
        print(f"deps: {', '.join(missing)} still fail to import; unpacking the rest over the image's copies")
        unpack(wheels, args.target, shadow=True)
        missing = still_missing(args.target)
    print("deps: still missing: " + ", ".join(missing) if missing else "deps: pytest and transformers import")
    return missing


if __name__ == "__main__":
    main()
