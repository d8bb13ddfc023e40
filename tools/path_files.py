"""How many files a reader opens: the import graph of rawpage, and two measures on it (issue 32).

    python tools/path_files.py           # the files from `rawpage serve` to the kernel, per path (PATHS)
    python tools/path_files.py --static  # its first half only (no model runs)
    python tools/path_files.py --core    # the engine core's import closure, file by file

The graph: a module imports every rawpage module named in one of its import statements,
at the top, inside a function (lazy) or under TYPE_CHECKING, since a reader follows each.
`from rawpage.x import y` names rawpage.x.y when y is a module, and rawpage.x itself
(its __init__.py) only when some imported name is not a module. The package __init__
that Python runs before any submodule is not an edge: nobody reads rawpage/__init__.py
to follow `from rawpage.sampler import Sampler`.

The path from `rawpage serve` to a kernel (path_files) has two halves:
  - serve to step(): the modules on a shortest import chain from rawpage/cli.py (where
    `rawpage serve` starts) to rawpage/server/async_engine.py, whose engine thread calls
    LLMEngine.step() (every shortest chain counts, not one picked among equals);
  - step() to the kernel (step_to_kernel): the rawpage files (rawpage/, models/) any of whose
    functions run in one step from the start of LLMEngine.step() until the attention
    kernel is launched, measured with a profile hook. Three paths (PATHS), each where users are:
      cpu decode   the default model (SmolLM2-135M, Q4_1 GGUF) on the native kernels, a
                   decode step replayed from its recording: the kernels run from one C
                   call, so the path ends at that call (native/library.py Recording.replay);
      cpu prefill  the same model's first step, a prompt run eagerly, up to the launch of
                   the attention kernel by native/attention.py's paged_attention;
      sim decode   the tiny Llama (tests/tiny_models.py) under the simulator, which launches
                   the same CUDA source as cuda (ops/paged_attention.py launch_paged_attention).
    Files that run after the launch in the same step (sampling, output) are not on a path.
A request takes one device's path (the device is the server's, fixed at startup), so the
measure is each path's length (paths); the union (path_files) is what a reader of every
path opens, and is reported beside it.
The functions that run are what a reader follows from step() to the kernel; the import
chain is the way `serve` reaches the loop that calls step() (from another thread).

The core (core_closure): every module reachable from rawpage/engine.py and
rawpage/scheduler.py, except the layers below the backend contract, which a reader of a
step treats as "an op runs": kernels and their wrappers (rawpage/ops, native, sim, the
backends but their contract backends/base.py), weight formats (rawpage/quantization) and
checkpoint files (rawpage/loader). Those are not descended into. Moving code out of
engine.py into a module it imports does not shrink the core; only removing an import does.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
from collections import deque
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
CLI = "rawpage.cli"
STEP_CALLER = "rawpage.server.async_engine"  # its engine thread calls LLMEngine.step()
# name -> (model: "default" or "tiny", device, cpu_kernels, which step (0: the prompt's,
# 2: a decode past the first's one-time setup), and the (file, function) whose call ends it)
PATHS = {
    "cpu decode": ("default", "cpu", "native", 2, "rawpage/native/library.py", "replay"),
    "cpu prefill": ("default", "cpu", "native", 0, "rawpage/native/attention.py", "paged_attention"),
    "sim decode": ("tiny", "sim", "auto", 2, "rawpage/ops/paged_attention.py", "launch_paged_attention"),
}
CORE_ROOTS = ["rawpage.engine", "rawpage.scheduler"]
# Not descended into by the core: kernels, their wrappers, weight formats and checkpoint files.
BELOW_THE_CORE = ["rawpage.ops", "rawpage.native", "rawpage.sim", "rawpage.backends", "rawpage.quantization"]
BELOW_THE_CORE += ["rawpage.loader"]
CORE_CONTRACT = ["rawpage.backends.base"]  # the backend interface the model and runner call: read, so counted


def module_path(module: str) -> Path | None:
    """rawpage.x.y -> rawpage/x/y.py or rawpage/x/y/__init__.py; rawpage.models.* lives in models/."""
    parts = module.split(".")
    if parts[0] != "rawpage":
        return None
    base = ROOT.joinpath("models", *parts[2:]) if parts[1:2] == ["models"] else ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def imports_of(module: str) -> set[str]:
    """The rawpage modules that `module`'s import statements name (see the module docstring)."""
    found = set()
    for node in ast.walk(ast.parse(module_path(module).read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("rawpage"):
            subs = {f"{node.module}.{a.name}" for a in node.names if module_path(f"{node.module}.{a.name}")}
            found |= subs | ({node.module} if len(subs) < len(node.names) else set())
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("rawpage")}
    return {m for m in found if module_path(m)}


def import_graph() -> dict[str, set[str]]:
    """Every rawpage module (and rawpage.models) -> the modules it imports."""
    files = [*(ROOT / "rawpage").rglob("*.py"), *(ROOT / "models").rglob("*.py")]
    names = set()
    for path in files:
        rel = path.relative_to(ROOT).with_suffix("").parts
        parts = ["rawpage", *rel] if rel[0] == "models" else list(rel)
        names.add(".".join(p for p in parts if p != "__init__"))
    return {m: imports_of(m) for m in sorted(names)}


def within(module: str, prefixes: list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def core_closure(graph: dict[str, set[str]] | None = None) -> dict[str, int]:
    """The engine core (see the module docstring): module -> its lines."""
    graph = graph or import_graph()
    seen, todo = set(), list(CORE_ROOTS)
    while todo:
        m = todo.pop()
        if m in seen or (within(m, BELOW_THE_CORE) and m not in CORE_CONTRACT):
            continue
        seen.add(m)
        todo += graph[m]
    return {m: len(module_path(m).read_text().splitlines()) for m in sorted(seen)}


def distances(graph: dict[str, set[str]], start: str) -> dict[str, int]:
    """Import steps from `start` to each module it reaches (breadth first)."""
    dist, queue = {start: 0}, deque([start])
    while queue:
        m = queue.popleft()
        for n in sorted(graph[m]):
            if n not in dist:
                dist[n] = dist[m] + 1
                queue.append(n)
    return dist


def on_shortest_chains(graph: dict[str, set[str]], start: str, target: str) -> set[str]:
    """The modules on some shortest import chain from start to target, both included."""
    reverse: dict[str, set[str]] = {m: set() for m in graph}
    for m, deps in graph.items():
        for d in deps:
            reverse[d].add(m)
    ahead, behind = distances(graph, start), distances(reverse, target)
    if target not in ahead:
        raise ValueError(f"{start} does not reach {target} through imports")
    return {m for m in ahead if m in behind and ahead[m] + behind[m] == ahead[target]}


def serve_to_step(graph: dict[str, set[str]] | None = None) -> set[str]:
    """The files on the shortest import chains from rawpage/cli.py to the loop that calls step()."""
    chains = on_shortest_chains(graph or import_graph(), CLI, STEP_CALLER)
    return {str(module_path(m).relative_to(ROOT)) for m in chains}


def step_to_kernel(path: str) -> set[str]:
    """The files whose functions run from the start of PATHS[path]'s step (LLMEngine.step())
    to the call that launches its attention kernel."""
    sys.path.insert(0, str(ROOT))
    from rawpage import LLM, SamplingParams

    model, device, cpu_kernels, which, launcher, function = PATHS[path]
    steps: list[set[str]] = []  # the files each step ran before its kernel launch
    engine_py, recording = str(ROOT / "rawpage" / "engine.py"), False

    def on_call(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal recording
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith((str(ROOT / "rawpage"), str(ROOT / "models"))):
            return
        if code.co_name == "step" and code.co_filename == engine_py:
            steps.append(set())
            recording = True
        if recording:
            steps[-1].add(str(Path(code.co_filename).relative_to(ROOT)))
            recording = not (code.co_name == function and code.co_filename.endswith(launcher))

    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_llama(tmp) if model == "tiny" else None
        llm = LLM(folder, device=device, cpu_kernels=cpu_kernels, max_model_len=256, kv_cache_memory="16MiB")
        sys.setprofile(on_call)
        try:
            llm.generate(["hello world", "one two"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        finally:
            sys.setprofile(None)
    assert len(steps) > which and launcher in steps[which], f"{launcher}:{function} was not called in {path}"
    return steps[which]


def tiny_llama(folder: str) -> str:
    from tests.tiny_models import random_tensors, tiny_config, train_tokenizer, write_hf_folder

    cfg = tiny_config()
    return write_hf_folder(folder, cfg, random_tensors(cfg), train_tokenizer())


def paths() -> dict[str, list[str]]:
    """Each path's name (PATHS) -> its files from `rawpage serve` to its kernel (see the module docstring)."""
    serve = serve_to_step()
    return {name: sorted(serve | step_to_kernel(name)) for name in PATHS}


def path_files(found: dict[str, list[str]] | None = None) -> list[str]:
    """The union of every device's path (`found`: paths(), measured when not given)."""
    return sorted(set().union(*(found or paths()).values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", action="store_true", help="list the engine core's import closure instead")
    parser.add_argument("--static", action="store_true", help="only the import chains from serve to step()")
    args = parser.parse_args()
    graph = import_graph()
    if args.core:
        lines = core_closure(graph)
        for m, n in sorted(lines.items(), key=lambda kv: -kv[1]):
            print(f"{n:6d}  {module_path(m).relative_to(ROOT)}")
        print(f"the engine core: {len(lines)} files, {sum(lines.values())} lines")
        return
    halves = {"serve to step()": serve_to_step(graph)}
    if not args.static:
        halves |= {f"step() to the kernel, {name}": step_to_kernel(name) for name in PATHS}
    for name, files in halves.items():
        print(f"{name}: {len(files)} files\n" + "".join(f"  {f}\n" for f in sorted(files)))
    if not args.static:
        serve = halves["serve to step()"]
        for name, half in zip(PATHS, list(halves)[1:]):
            print(f"rawpage serve to the kernel, {name}: {len(serve | halves[half])} files")
        print(f"every path together: {len(set().union(*halves.values()))} files")


if __name__ == "__main__":
    main()
