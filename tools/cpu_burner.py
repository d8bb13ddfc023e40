"""Run a command beside processes that keep CPU cores busy, as another job on the machine would.

    python tools/cpu_burner.py --cores 2 -- python -m pytest -q      # make test-under-load
    python tools/cpu_burner.py --cores 1 -- python tools/bench_cpu_threads.py
    python tools/cpu_burner.py --busy-ms 2 --idle-ms 8 -- python tools/bench_cpu_kernels.py --against OLD.so

--busy-ms/--idle-ms make each burner take bursts (2 ms busy, 8 idle: a fifth of a core
in bursts, as a light neighbour or a noisy VM does) instead of the whole core.

Exits with the command's status; the burners stop when it ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def spin(busy_s: float = 0.0, idle_s: float = 0.0) -> None:
    """Keep a core busy: always, or busy_s seconds of every busy_s + idle_s."""
    while True:
        if idle_s <= 0:
            continue
        start = time.perf_counter()
        while time.perf_counter() - start < busy_s:
            pass
        time.sleep(idle_s)


def run_beside_burners(command: list[str], cores: int, busy_ms: float = 0.0, idle_ms: float = 0.0) -> int:
    burners = [
        multiprocessing.Process(target=spin, args=(busy_ms / 1e3, idle_ms / 1e3), daemon=True) for _ in range(cores)
    ]
    for b in burners:
        b.start()
    try:
        return subprocess.call(command)
    finally:
        for b in burners:
            b.terminate()
            b.join()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, default=1, help="spinning processes to run beside the command (default: 1)")
    p.add_argument("--busy-ms", type=float, default=0.0, help="with --idle-ms: each burst's busy milliseconds")
    p.add_argument(
        "--idle-ms", type=float, default=0.0, help="milliseconds idle between bursts (default 0: always busy)"
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    if args.idle_ms > 0 and args.busy_ms <= 0:
        p.error("--idle-ms needs --busy-ms")
    return run_beside_burners(command, args.cores, args.busy_ms, args.idle_ms)


if __name__ == "__main__":
    sys.exit(main())
