"""How `compute.cpu` shares a busy host between two APIs (`make bench`).

Two CPU groups made as a replica's or a worker node's are (`foundation/cpu_limits.py`), one for an
API of `cpu: 1` and one of `cpu: 3`, each running as many busy processes as the host has cores, so
that together they ask for twice the host. After `--seconds` (5), the CPU time each group's
processes got is read, and printed with the ratio of the two (what was asked: 3.0). Then the same
with `SLUICE_CPU_LIMITS=quota` semantics, where each group is also capped at what it asked.
It only prints: no threshold. Where no cpu controller can be written, it says so and ends.
Run: `python bench/cpu_shares.py [--seconds S]`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from foundation.cpu_limits import CpuLimits  # noqa: E402

BUSY = "while True: pass"


def run(limits: CpuLimits, seconds: float, label: str) -> None:
    cores = os.cpu_count() or 1
    groups = {"cpu: 1": (limits.group(f"bench-one-{os.getpid()}", 1000), []),
              "cpu: 3": (limits.group(f"bench-three-{os.getpid()}", 3000), [])}
    try:
        for group, processes in groups.values():
            assert group is not None
            for _ in range(cores):
                process = subprocess.Popen([sys.executable, "-c", BUSY])
                group.join(process.pid)
                processes.append(process)
        time.sleep(seconds)
        got = {}
        for name, (_, processes) in groups.items():
            got[name] = sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in processes)
        total = sum(got.values())
        print(f"{label}: {cores} cores, {seconds:g} s, both groups busy on every core")
        for name, cpu_s in got.items():
            print(f"  {name}: {cpu_s:6.2f} cpu-s ({100 * cpu_s / total:4.1f}% of what both got)")
        print(f"  ratio cpu: 3 / cpu: 1 = {got['cpu: 3'] / got['cpu: 1']:.2f} (asked: 3.00)")
    finally:
        for group, processes in groups.values():
            for process in processes:
                process.kill()
                process.wait()
            if group is not None:
                group.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    shares = CpuLimits.from_env({"SLUICE_CPU_LIMITS": "share"})
    if shares.version == 0:
        print(f"cpu shares cannot be measured here: {shares.reason}")
        return
    try:
        run(shares, args.seconds, f"weights ({shares.reason})")
        quota = CpuLimits.from_env({"SLUICE_CPU_LIMITS": "quota"})
        try:
            run(quota, args.seconds, "weights and quotas")
        finally:
            quota.close()
    finally:
        shares.close()


if __name__ == "__main__":
    main()
