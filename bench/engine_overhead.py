"""Wall time of one launch for a whole batch vs one torchrun launch per trial and variant.

The anchor benchmark starts a fresh process group for every trial and every variant; pkb-tui
keeps the ranks up for the whole batch. Same work either way: the eight collectives, 5 trials,
timing on (baseline and candidate), torch-p2p as the candidate.

    python bench/engine_overhead.py [--world-size 2] [--mode cpu] [--trials 5] [--tasks a,b]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pkb_tui.engine.launcher import Launcher
from pkb_tui.engine.request import RunRequest

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--mode", default=None)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(COLLECTIVES))
    parser.add_argument("--model", default="torch-p2p")
    parser.add_argument("--size", default="small")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    common = dict(models=[args.model], world_size=args.world_size, mode=args.mode, size=args.size,
                  iterations=20, warmup=3, profile=False, telemetry=False)

    with tempfile.TemporaryDirectory() as tmp:
        launcher = Launcher(Path(tmp) / "batch.db")
        t0 = time.perf_counter()
        outcome = launcher.run(RunRequest(tasks=tasks, trials=args.trials, **common))
        batch_s = time.perf_counter() - t0
        assert outcome.all_passed, outcome.statuses

        launcher = Launcher(Path(tmp) / "per_trial.db")
        launches = 0
        t0 = time.perf_counter()
        for task in tasks:
            for trial in range(args.trials):
                for variant in ("baseline", "candidate"):
                    out = launcher.run(RunRequest(tasks=[task], trials=1, seed=trial, extra={"variants": [variant]}, **common))
                    assert out.all_passed, out.statuses
                    launches += 1
        per_trial_s = time.perf_counter() - t0

    print(f"batch: {len(tasks)} tasks x {args.trials} trials x 2 variants, world size {args.world_size}, mode {args.mode or 'auto'}")
    print(f"  one launch for the batch     : {batch_s:8.1f} s")
    print(f"  one launch per trial/variant : {per_trial_s:8.1f} s  ({launches} launches)")
    print(f"  ratio (per-trial / batch)    : {per_trial_s / batch_s:8.1f} x   (target >= 5x)")


if __name__ == "__main__":
    main()
