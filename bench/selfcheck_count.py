"""Count a self-check's figures against issue 11's targets: python bench/selfcheck_count.py RUN.json

RUN.json: `pkb-tui run --task ... --model baseline --json` (the baseline timed against itself).
Prints per task the basis's speedup and interval (and interval_floor: the host's floor folded in),
then how many intervals hold 1.0 and how many points are within 3%, for the basis and per method.
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    doc = json.load(open(path))
    counts = {"basis": [0, 0, 0], "graph": [0, 0, 0], "eager": [0, 0, 0]}  # inside, within 3%, of
    for run in doc.get("runs", []):
        candidate = run.get("candidate") or {}
        line = [f"{run['task']:30s} {run['status']:8s}"]
        for name, prefix in (("basis", "speedup"), ("graph", "speedup_graph"), ("eager", "speedup_eager")):
            point, low, high = run.get(prefix), run.get(f"{prefix}_low"), run.get(f"{prefix}_high")
            if point is None or low is None or high is None:
                line.append(f"{name} -")
                continue
            tally = counts[name]
            tally[0] += low <= 1.0 <= high
            tally[1] += abs(point - 1.0) <= 0.03
            tally[2] += 1
            line.append(f"{name} {point:.3f} [{low:.3f}, {high:.3f}]")
        floor = candidate.get("interval_floor", run.get("interval_floor"))
        line.append(f"floor in interval: {floor if floor is not None else '-'}")
        print("  ".join(line))
    for name, (inside, close, total) in counts.items():
        print(f"{name}: intervals holding 1.0 {inside} of {total}; points within 3% {close} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
