"""Print one table from `pkb-tui run --json` documents: python bench/summarize_runs.py A.json [B.json ...]"""

from __future__ import annotations

import json
import sys


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def main(paths: list[str]) -> None:
    header = ("task", "model", "mode", "ranks", "size", "status", "correct", "baseline µs", "candidate µs", "speedup", "roofline", "bound", "MPS")
    rows = []
    for path in paths:
        try:
            doc = json.load(open(path))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"{path}: no JSON ({exc})")
            continue
        for run in doc.get("runs", []):
            b, c = run.get("baseline") or {}, run.get("candidate") or {}
            rows.append((
                run["task"], run["model"], run["mode"], str(run["world_size"]), run["size"], run["status"],
                "yes" if run["correct"] else "NO", _us(b.get("median_us")), _us(c.get("median_us")),
                f"{run['speedup']:.2f}x" if run.get("speedup") else "-",
                f"{c['roofline_fraction'] * 100:.1f}%" if c.get("roofline_fraction") is not None else "-",
                c.get("roofline_bound") or "-",
                {True: "on", False: "off", None: "-"}[run.get("mps_enabled")],
            ))
            if run["status"] != "passed" and run.get("status_detail"):
                print(f"  {run['task']}/{run['model']} {run['mode']} x{run['world_size']}: {run['status_detail'][:300]}")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main(sys.argv[1:])
