"""The CPU self-check of issue 11: the eight collectives' baseline against itself at world size 2
(gloo), through the CLI; how many of the speedups' 95% intervals contain 1.0 (target: 7 of 8).
Prints the host's load with it (run once on a quiet box and once beside another job).

    python bench/cpu_selfcheck.py [--repeat 1] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for attempt in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            load_before = os.getloadavg()[0]
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pkb_tui.cli", "--db", f"{tmp}/runs.db", "run", "--task", COLLECTIVES,
                                   "--model", "baseline", "--world-size", str(args.world_size), "--mode", "cpu",
                                   "--size", "small", "--trials", "1", "--no-profile", "--json"],
                                  capture_output=True, text=True, env=env, timeout=1800)
            took = time.monotonic() - started
            try:
                runs = json.loads(proc.stdout)["runs"]
            except (ValueError, KeyError):
                print(proc.stderr[-2000:])
                return 1
        contain = 0
        print(f"--- attempt {attempt + 1}: {took:.0f} s, 1-minute load {load_before:.1f} -> {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores")
        for run in runs:
            low, high, point = run.get("speedup_low"), run.get("speedup_high"), run.get("speedup")
            inside = low is not None and high is not None and low <= 1.0 <= high
            contain += inside
            shown = f"{point:.3f} [{low:.3f}, {high:.3f}]" if None not in (point, low, high) else str(point)
            print(f"  {run['task']:16s} {run['status']:8s} {shown:28s} {'contains 1.0' if inside else 'MISSES 1.0'}")
        print(f"  intervals containing 1.0: {contain}/{len(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
