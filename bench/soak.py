"""Soak: many consecutive runs mixing correct, wrong, raising, crashing, hanging, flooding and
forking candidates, alternately through the CLI (a subprocess per batch) and through the engine
call the dashboard makes (Launcher.run in this process), on one database. Before and after:
processes, threads, this process's open files, listening TCP ports, entries in the temp folder
and /dev/shm, the database's size. Target: nothing grows but the database.

    python bench/soak.py --runs 1000 [--workdir DIR]   (CPU, two ranks; ~5-10 s a run here)

Prints a line per batch and a before/after table; exit 1 if anything but the database grew, or a
run's verdict was not the one its candidate deserves.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = ROOT / "tests" / "fixtures"
# model folder -> the verdicts it may get
CANDIDATES = {
    ROOT / "solutions" / "torch-p2p": {"passed"},
    FIXTURES / "solutions" / "wrong": {"failed"},
    FIXTURES / "solutions" / "crash-with-message": {"error"},
    FIXTURES / "solutions" / "crash": {"error"},
    FIXTURES / "solutions" / "hang": {"timeout"},
    FIXTURES / "containment" / "flood": {"passed"},
    FIXTURES / "containment" / "escaped-hog": {"error"},  # past the 1 GiB limit, with a daemon
}


def census(db: Path) -> dict[str, int]:
    """What the machine holds that a leak would grow."""
    processes = threads = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
                if entry == "2" or fields[1] == "2":
                    continue  # kernel threads (kworkers come and go by themselves)
                threads += int(fields[17])
                processes += 1
            except (OSError, IndexError, ValueError):
                continue
    listening = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                listening += sum(1 for line in list(f)[1:] if line.split()[3] == "0A")
        except OSError:
            pass
    temp = Path(tempfile.gettempdir())
    return {
        "processes": processes, "threads": threads, "open files (this process)": len(os.listdir("/proc/self/fd")),
        "listening tcp ports": listening, f"entries in {temp}": len(list(temp.iterdir())),
        "entries in /dev/shm": len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0,
        "database bytes": db.stat().st_size if db.exists() else 0,
    }


def run_batch(index: int, db: Path, runs_dir: Path, models: list[Path], timeout_s: float) -> dict[str, str]:
    """One batch; odd batches through the CLI, even ones through Launcher.run (the dashboard's call).
    Returns model name -> status."""
    common = dict(tasks=["all_reduce"], world_size=2, trials=1, timeout_s=timeout_s, timing=False,
                  profile=False, max_host_memory_gib=1.0)
    if index % 2:
        cmd = [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "run", "--task", "all_reduce",
               "--model", ",".join(str(m) for m in models), "--world-size", "2", "--trials", "1", "--no-timing",
               "--no-profile", "--timeout", str(timeout_s), "--max-host-memory-gib", "1", "--runs-dir",
               str(runs_dir), "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=3600)
        import json

        return {r["model"]: r["status"] for r in json.loads(done.stdout)["runs"]}
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.request import RunRequest
    from pkb_tui.store import Store

    outcome = Launcher(db, runs_dir=runs_dir).run(RunRequest(models=[str(m) for m in models], **common))
    with Store(db) as store:
        return {store.run(run_id)["model"]: outcome.statuses[run_id] for run_id in outcome.run_ids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=30.0, help="each run's timeout (the hanging one uses it all)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pkb-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)  # before the census: the database's own folder is not growth
    db, runs_dir = workdir / "runs.db", workdir / "runs"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    before = census(db)
    models = list(CANDIDATES)
    wrong_verdicts: list[str] = []
    done = batch = 0
    started = time.monotonic()
    while done < args.runs:
        chosen = models[: min(len(models), args.runs - done)]
        statuses = run_batch(batch, db, runs_dir, chosen, args.timeout)
        for model, status in statuses.items():
            expected = next(v for m, v in CANDIDATES.items() if m.name == model)
            if status not in expected:
                wrong_verdicts.append(f"batch {batch} {model}: {status} (expected {'/'.join(sorted(expected))})")
        done += len(statuses)
        print(f"batch {batch:4d} via {'cli' if batch % 2 else 'engine'}: {len(statuses)} runs "
              f"({done}/{args.runs}, {time.monotonic() - started:.0f} s) {sorted(statuses.values())}", flush=True)
        batch += 1
    time.sleep(5)  # the last batch's processes end (judges notice, runners die with them)
    after = census(db)
    grew = [k for k in before if k != "database bytes" and after[k] > before[k]]
    print(f"\n{'':28s} {'before':>12s} {'after':>12s}")
    for key in before:
        print(f"{key:28s} {before[key]:12,d} {after[key]:12,d}{'  GREW' if key in grew else ''}")
    print(f"{done} runs in {batch} batches, {time.monotonic() - started:.0f} s; wrong verdicts: {len(wrong_verdicts)}")
    for line in wrong_verdicts[:20]:
        print("  " + line)
    return 1 if grew or wrong_verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
