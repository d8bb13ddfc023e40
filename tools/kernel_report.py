"""Compile every kernel source in cuda/ with nvcc and print, per kernel and GPU
architecture, what ptxas reports: registers, static shared memory, stack frame
and local-memory spills.

    python tools/kernel_report.py                      # all of cuda/, sm_80 and sm_90
    python tools/kernel_report.py --arch sm_90 cuda/paged_attention_decode.cu
    python tools/kernel_report.py --traffic            # bytes moved / minimum, under sim

One nvcc run per file and architecture, with the options the cuda backend
gives NVRTC (-std=c++17, -I cuda/), all in parallel, largest file first: decode
attention alone (every head size and group, instantiated) is ~150 s of nvcc for
both architectures on our 2-core machine, half of that for one, so one run per
architecture lets the two halves and the other files share the cores. Reports
are cached under the simulator's cache directory, keyed by the sources, nvcc's
version and the flags, so repeated runs (and the tests in
tests/kernels/test_compile.py) only recompile what changed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ARCHS = ("sm_80", "sm_90")
NVCC_FLAGS = ("-std=c++17", "-O3", "-Xptxas", "-v")

ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'")
PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


@dataclass
class KernelStats:
    file: str
    kernel: str
    arch: str
    registers: int = 0
    smem: int = 0  # static shared memory, bytes (dynamic comes at launch)
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def cuda_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "cuda"


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def parse_ptxas(file: str, text: str) -> list[KernelStats]:
    stats: list[KernelStats] = []
    for line in text.splitlines():
        if m := ENTRY.search(line):
            stats.append(KernelStats(file, m.group(1), m.group(2)))
        elif stats and (m := PROPS.search(line)):
            stats[-1].stack, stats[-1].spill_stores, stats[-1].spill_loads = map(int, m.groups())
        elif stats and (m := USED.search(line)):
            stats[-1].registers = int(m.group(1))
            if s := SMEM.search(line):
                stats[-1].smem = int(s.group(1))
    return stats


def _cache_file(source: Path, archs: tuple[str, ...], nvcc: str) -> Path:
    from rawpage.sim.build import cache_dir

    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    h = hashlib.sha256()
    for p in [source, *sorted(source.parent.glob("*.cuh"))]:
        h.update(p.name.encode() + p.read_bytes())
    h.update(" ".join((*archs, *NVCC_FLAGS, version)).encode())
    return cache_dir() / "nvcc" / f"{source.stem}-{h.hexdigest()[:20]}.json"


def compile_file(source: Path, archs: tuple[str, ...] = ARCHS) -> list[KernelStats]:
    """ptxas statistics of every kernel in one .cu file; raises RuntimeError on a compile error."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc is not on PATH")
    cached = _cache_file(source, archs, nvcc)
    if cached.exists():
        return [KernelStats(**d) for d in json.loads(cached.read_text())]
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "--fatbin", *gencode, *NVCC_FLAGS, f"-I{source.parent}", str(source)]
        proc = subprocess.run(cmd + ["-o", os.path.join(tmp, "out.fatbin")], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name}:\n{proc.stderr}")
    stats = parse_ptxas(source.name, proc.stdout + proc.stderr)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = cached.with_suffix(f".tmp{os.getpid()}")
    tmp_file.write_text(json.dumps([asdict(s) for s in stats]))
    os.replace(tmp_file, cached)
    return stats


def report(files: list[Path], archs: tuple[str, ...] = ARCHS, jobs: int | None = None) -> list[KernelStats]:
    jobs = jobs or max(1, len(os.sched_getaffinity(0)))
    runs = [(f, (a,)) for f in sorted(files, key=lambda f: -Path(f).stat().st_size) for a in archs]
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        results = pool.map(lambda run: compile_file(*run), runs)
        return [s for stats in results for s in stats]


def format_table(stats: list[KernelStats]) -> str:
    rows = [("file", "kernel", "arch", "regs", "smem", "stack", "spill st", "spill ld")]
    for s in sorted(stats, key=lambda s: (s.file, s.kernel, s.arch)):
        rows.append((s.file, s.kernel, s.arch, s.registers, s.smem, s.stack, s.spill_stores, s.spill_loads))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r, widths)) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="kernel sources (default: cuda/*.cu)")
    parser.add_argument("--arch", action="append", help="sm_80, sm_90, ... (repeatable)")
    parser.add_argument(
        "--traffic",
        action="store_true",
        help="instead: run each kernel under the simulator and print its global-memory "
        "traffic against the minimum the math needs (tools/kernel_traffic.py)",
    )
    args = parser.parse_args()
    if args.traffic:
        from tools import kernel_traffic

        print(kernel_traffic.format_results(kernel_traffic.report()))
        return 0
    if nvcc_path() is None:
        print("nvcc not found on PATH", file=sys.stderr)
        return 2
    files = args.files or sorted(cuda_dir().glob("*.cu"))
    stats = report([f.resolve() for f in files], tuple(args.arch or ARCHS))
    print(format_table(stats))
    spilling = [s for s in stats if s.spills]
    print(f"\n{len(stats)} kernel builds, {len(spilling)} with local-memory spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
