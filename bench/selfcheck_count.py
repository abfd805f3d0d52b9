"""Count a self-check's figures against issue 11's targets.

    python bench/selfcheck_count.py RUN.json
    python bench/selfcheck_count.py --calibration CALIBRATE.json
    python bench/selfcheck_count.py --rest RUNS.json

RUN.json: `pkb-tui run --task ... --model baseline --json` (the baseline timed against itself), or
`pkb-tui runs --speedup-basis B --json` where that run was cut short or split over calls (B the
self-check's basis: `runs` shows eager unless told) (per task its latest run
with a floor folded in; without any, the latest batch). A run without a speedup counts as a miss
of the basis.
Prints per task the basis's speedup and interval (and interval_floor: the host's floor folded in),
then how many intervals hold 1.0 and how many points are within 3%, for the basis and per method.
CALIBRATE.json: `pkb-tui calibrate --noise-only --json`: per task the self-check's figures (the
rounds' intervals alone) and what each asks of the floor (stats.noise_floor_from_selfchecks), then
the floors stored. --rest RUNS.json (`pkb-tui runs --json`): the tasks a split self-check has
still to time.
"""

from __future__ import annotations

import json
import sys


def calibration(path: str) -> int:
    from pkb_tui.engine.stats import SpeedupEstimate, noise_floor_from_selfchecks

    doc = json.load(open(path))
    for row in doc.get("rows", []):
        if row.get("kind") != "noise_floor":
            continue
        if row.get("skipped"):
            print(f"noise floor skipped: {row['skipped']}")
            continue
        detail = row.get("detail") or {}
        for task, entry in sorted((detail.get("tasks") or {}).items()):
            line = [f"{task:30s}"]
            if "status" in entry:
                line.append(entry["status"])
            for prefix, name in (("", "eager"), ("graph_", "graph")):
                point = entry.get(f"{prefix}speedup")
                if point is None:
                    continue
                low, high = entry[f"{prefix}low"], entry[f"{prefix}high"]
                need = noise_floor_from_selfchecks([SpeedupEstimate(point, low, high, "", 0, 0.95)])
                line.append(f"{name} {point:.3f} [{low:.3f}, {high:.3f}] asks {need:.2%}")
            print("  ".join(line))
        graph = detail.get("graph_noise_floor_fraction")
        print(f"floor: eager +-{row['noise_floor_fraction']:.2%}, graph "
              f"{'-' if graph is None else f'+-{graph:.2%}'} ({len(detail.get('tasks') or {})} tasks; skipped: "
              f"{len(detail.get('skipped') or [])})")
    return 0


def floored(rows: list[dict]) -> list[dict]:
    """The self-check's runs among `pkb-tui runs --json` rows: those that knew the host's floor
    (calibrate's own runs know none), oldest first."""
    return sorted((r for r in rows if r.get("noise_floor_fraction") is not None), key=lambda r: r.get("created_at") or 0)


def rest(path: str) -> int:
    """The tasks still to self-check: every task without a finished run that knew the floor (a run
    interrupted by the end of a call is timed again), comma-separated, or "none"."""
    from tasks.base import all_tasks

    done = {r["task_id"] for r in floored(json.load(open(path))) if r["status"] != "interrupted"}
    print(",".join(t for t in all_tasks() if t not in done) or "none")
    return 0


def main(path: str) -> int:
    doc = json.load(open(path))
    if isinstance(doc, list):  # `pkb-tui runs --json` (a self-check cut short, or split over calls)
        # Per task its latest run that knew the floor, so a self-check split over several batches
        # on one database counts once per task; where no run has a floor, the latest batch.
        if floored(doc):
            rows = list({r["task_id"]: r for r in floored(doc)}.values())
        else:
            latest = max(doc, key=lambda r: r.get("created_at") or 0, default={}).get("batch_id")
            rows = [r for r in doc if r.get("batch_id") == latest]
        doc = {"runs": [{**r, "task": r["task_id"]} for r in sorted(rows, key=lambda r: r["task_id"])]}
    counts = {"basis": [0, 0, 0], "graph": [0, 0, 0], "eager": [0, 0, 0]}  # inside, within 3%, of
    for run in doc.get("runs", []):
        candidate = run.get("candidate") or {}
        line = [f"{run['task']:30s} {run['status']:8s}"]
        for name, prefix in (("basis", "speedup"), ("graph", "speedup_graph"), ("eager", "speedup_eager")):
            point, low, high = run.get(prefix), run.get(f"{prefix}_low"), run.get(f"{prefix}_high")
            if point is None or low is None or high is None:
                line.append(f"{name} -")
                if name == "basis":  # a run without a speedup (timed out, failed) is a miss of the basis
                    counts[name][2] += 1
                continue
            tally = counts[name]
            tally[0] += low <= 1.0 <= high
            tally[1] += abs(point - 1.0) <= 0.03
            tally[2] += 1
            line.append(f"{name} {point:.3f} [{low:.3f}, {high:.3f}]")
        floor = candidate.get("interval_floor", run.get("interval_floor"))
        line.append(f"floor in interval: {floor if floor is not None else '-'}")
        print("  ".join(line))
    bases = {run.get("speedup_basis") for run in doc.get("runs", [])} - {None}
    for name, (inside, close, total) in counts.items():
        label = f"basis ({', '.join(sorted(bases))})" if name == "basis" and bases else name
        print(f"{label}: intervals holding 1.0 {inside} of {total}; points within 3% {close} of {total}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--calibration":
        sys.exit(calibration(sys.argv[2]))
    if len(sys.argv) == 3 and sys.argv[1] == "--rest":
        sys.exit(rest(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
