"""Run a command beside processes that keep CPU cores busy, as another job on the machine would.

    python tools/cpu_burner.py --cores 2 -- python -m pytest -q      # make test-under-load
    python tools/cpu_burner.py --cores 1 -- python tools/bench_cpu_threads.py

Exits with the command's status; the burners stop when it ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys


def spin() -> None:
    while True:
        pass


def run_beside_burners(command: list[str], cores: int) -> int:
    burners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cores)]
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
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to run after --")
    return run_beside_burners(command, args.cores)


if __name__ == "__main__":
    sys.exit(main())
