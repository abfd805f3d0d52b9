"""The self-check counters of the GPU check (bench/selfcheck_count.py, bench/selfcheck_holdout.py):
known rows of `pkb-tui runs --json` in, known counts out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _row(batch: str, created: float, task: str, *, graph=None, eager=None, status: str = "passed",
         floor: float | None = None) -> dict:
    row = {"batch_id": batch, "created_at": created, "task_id": task, "status": status, "rounds": 6,
           "noise_floor_fraction": floor, "interval_floor": floor or None}
    for method, figure in (("graph", graph), ("eager", eager)):
        point, low, high = figure or (None, None, None)
        row.update({f"speedup_{method}": point, f"speedup_{method}_low": low, f"speedup_{method}_high": high})
    basis = graph or eager or (None, None, None)
    row.update({"speedup": basis[0], "speedup_low": basis[1], "speedup_high": basis[2]})
    return row


def _script(name: str, rows: list[dict], tmp_path: Path, *flags: str) -> str:
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(rows))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / name), *flags, str(path)], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_holdout_applies_each_batchs_floor_to_the_other(tmp_path: Path) -> None:
    rows = [
        # batch A: t1's graph point 3.5% off with no width (asks a 3.5% graph floor); t2 holds 1.0 (asks nothing)
        _row("A", 1.0, "t1", graph=(1.035, 1.035, 1.035), eager=(1.0, 0.9, 1.1)),
        _row("A", 1.1, "t2", eager=(1.0, 0.9, 1.1)),
        # batch B: t1 at 0.975 (asks 2.56%), t2's eager 0.96 with no width (asks 4.17%), t3 timed out
        _row("B", 2.0, "t1", graph=(0.975, 0.975, 0.975), eager=(1.0, 0.9, 1.1)),
        _row("B", 2.1, "t2", eager=(0.96, 0.96, 0.96)),
        {**_row("B", 2.2, "t3", status="timeout"), "status_detail": "the baseline did not answer (time spent: ...)"},
    ]
    out = _script("selfcheck_holdout.py", rows, tmp_path).splitlines()
    assert "batch 2 t3: timeout: the baseline did not answer (time spent: ...)" in out  # why it has no figure
    forward = next(line for line in out if line.startswith("floor from batch 1"))
    backward = next(line for line in out if line.startswith("floor from batch 2"))
    # A's floors (graph 3.5%, eager 0) on B: t1 widened to [0.942, 1.009] holds 1.0 and is within
    # 3%; t2 (eager, no floor) neither; t3 has no speedup: a miss of both.
    assert "(graph 3.50%, eager 0.00%)" in forward and forward.endswith(
        "intervals holding 1.0 1 of 3; points within 3% 1 of 3"), forward
    # B's floors (graph 2.56%, eager 4.17%) on A: t1 at 1.035 widened by 2.56% starts at 1.009
    # (a miss); t2 holds.
    assert "(graph 2.56%, eager 4.17%)" in backward and backward.endswith(
        "intervals holding 1.0 1 of 2; points within 3% 1 of 2"), backward
    assert "  t3 (timeout)" in out


def test_count_takes_each_tasks_latest_run_that_knew_the_floor(tmp_path: Path) -> None:
    rows = [
        # calibrate's own runs: no floor known; t1 read far off there, which must not count
        _row("cal", 1.0, "t1", graph=(1.2, 1.19, 1.21)),
        _row("cal", 1.1, "t2", graph=(1.0, 0.99, 1.01)),
        # the self-check, split over two batches: t1 and t2 in the first, then t1 again and t3
        _row("s1", 2.0, "t1", graph=(0.9, 0.89, 0.91), floor=0.02),
        _row("s1", 2.1, "t2", graph=(1.0, 0.99, 1.01), floor=0.02),
        _row("s2", 3.0, "t1", graph=(1.01, 0.99, 1.03), floor=0.02),
        _row("s2", 3.1, "t3", status="timeout", floor=0.02),
    ]
    out = _script("selfcheck_count.py", rows, tmp_path)
    # t1 from s2, t2 from s1, t3 timed out (a miss); the latest batch alone would count 1 of 2
    assert "basis: intervals holding 1.0 2 of 3; points within 3% 2 of 3" in out, out
    assert "1.200" not in out and "0.900" not in out


def test_the_rest_of_a_split_self_check_is_every_task_without_a_finished_run_that_knew_the_floor(tmp_path: Path) -> None:
    from tasks.base import all_tasks

    rows = [
        _row("cal", 1.0, "broadcast", graph=(1.0, 0.99, 1.01)),  # calibrate's: knew no floor
        _row("s1", 2.0, "all_reduce", graph=(1.0, 0.99, 1.01), floor=0.02),  # done
        _row("s1", 2.1, "gather", status="interrupted", floor=0.02),  # cut by the call's end: again
        _row("s1", 2.2, "scatter", status="timeout", floor=0.02),  # finished (a miss): not again
    ]
    left = _script("selfcheck_count.py", rows, tmp_path, "--rest").strip().split(",")
    assert left == [t for t in all_tasks() if t not in ("all_reduce", "scatter")]
    assert "gather" in left and "broadcast" in left
