"""The one script that checks the GPU path on whatever box it lands on (1 GPU or 8).

    python bench/gpu_check.py [--db PATH] [--trials 3] [--quick] [--out DIR]

1. Calibrates this host (pkb-tui calibrate: device copy, peer links, NCCL all-reduce sweep).
2. Runs, through the CLI (`python -m pkb_tui.cli run ... --json`, one launch per mode and world
   size), the collectives' baselines and the handwritten-cuda set in every mode the box allows:
   nccl at world size = GPU count when there are several GPUs, shared-gpu at 2 and 4 (several ranks
   on GPU 0 under a private MPS daemon), nccl at 1.
3. Prints one table: task, model, mode, world size, correct, baseline median, candidate median,
   speedup, roofline fraction. Exit 0 when every handwritten-cuda run was correct.

Builds nothing by hand: the kernels compile with NVRTC inside the ranks on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter"]
HANDWRITTEN = "handwritten-cuda"
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def handwritten_tasks() -> list[str]:
    folder = ROOT / "solutions" / HANDWRITTEN
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def configs(gpus: int) -> list[dict]:
    """(mode, world size, size) for this box; nccl at full width first, it is the real thing."""
    out = []
    if gpus > 1:
        out.append({"mode": "nccl", "world_size": gpus, "size": "default"})
    out.append({"mode": "shared-gpu", "world_size": 2, "size": "small"})
    out.append({"mode": "shared-gpu", "world_size": 4, "size": "small"})
    out.append({"mode": "nccl", "world_size": 1, "size": "default"})
    return out


def env() -> dict[str, str]:
    return {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PYTHONUNBUFFERED": "1"}


def run_cli(args: list[str], log: Path, timeout_s: float) -> tuple[int, dict | None, float]:
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pkb_tui.cli", *args]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"$ {' '.join(cmd)}\ntimed out after {timeout_s} s\n{exc.stdout or ''}\n{exc.stderr or ''}")
        return 124, None, time.monotonic() - started
    log.write_text(f"$ {' '.join(cmd)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    try:
        document = json.loads(proc.stdout)
    except json.JSONDecodeError:
        document = None
    return proc.returncode, document, time.monotonic() - started


def calibrate(db: str, quick: bool, out_dir: Path) -> dict | None:
    code, document, seconds = run_cli(["--db", db, "calibrate", "--json", *(["--quick"] if quick else [])],
                                      out_dir / "calibrate.log", timeout_s=420)  # the noise floor runs 8 tasks
    print(f"calibration: exit {code} in {seconds:.0f} s")
    if not document or "rows" not in document:
        print(f"  no calibration figures: {(document or {}).get('error') or 'see ' + str(out_dir / 'calibrate.log')}")
        return document
    sheet = document.get("datasheet", {})
    for row in document["rows"]:
        pair = f" {row['gpu_a']}->{row['gpu_b']}" if row.get("gpu_a") is not None else ""
        if row.get("skipped"):
            print(f"  {row['kind']:<17}{pair:<7} skipped: {row.get('skipped')}")
            continue
        if row.get("latency_us") is not None:  # alpha: the sweep's smallest all-reduce over 2(n-1) steps
            detail = row.get("detail") or {}
            print(f"  {row['kind']:<17}{pair:<7} {row['latency_us']:9.2f} us per message "
                  f"({detail.get('allreduce_time_us', 0):.1f} us all-reduce of {detail.get('size_bytes')} B / {detail.get('steps')})")
            continue
        if row.get("noise_floor_fraction") is not None:  # baseline vs itself through the launcher
            tasks = (row.get("detail") or {}).get("tasks") or {}
            points = " ".join(f"{t}:{v['speedup']:.3f}" for t, v in tasks.items() if v.get("speedup"))
            print(f"  {row['kind']:<17}{pair:<7} +-{row['noise_floor_fraction']:.1%} ({row.get('mode')}) {points}")
            continue
        ref = (sheet.get(row["kind"]) or {}).get("gbps")
        ratio = f" ({row['bandwidth_gbps'] / ref:.0%} of datasheet {ref:.0f})" if ref else ""
        print(f"  {row['kind']:<17}{pair:<7} {row['bandwidth_gbps']:9.1f} GB/s{ratio}")
    return document


def fmt_us(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) else "-"


def table(rows: list[dict]) -> str:
    header = (f"{'task':<16} {'model':<17} {'mode':<10} {'ws':>2} {'mps':>3} {'correct':<8} "
              f"{'baseline_us':>12} {'candidate_us':>13} {'speedup':>8} {'roofline':>9}")
    lines = [header, "-" * len(header)]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else "-"
        fraction = r.get("roofline_fraction")
        if isinstance(fraction, (int, float)):  # tiny sizes sit far below 1%: keep two digits
            roof = f"{fraction:.1%}" if fraction >= 0.01 else f"{100 * fraction:.2g}%"
        else:
            roof = "-"
        correct = {True: "yes", False: "NO"}.get(r.get("correct"), r.get("status") or "-")
        mps = {True: "on", False: "off"}.get(r.get("mps_enabled"), "-")
        lines.append(f"{r['task']:<16} {r['model']:<17} {r['mode']:<10} {r['world_size']:>2} {mps:>3} {correct:<8} "
                     f"{fmt_us(r.get('baseline_us')):>12} {fmt_us(r.get('candidate_us')):>13} {speedup:>8} {roof:>9}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default=None, help="database (default: a fresh one under --out)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "/tmp/pkb-gpu-check", help="folder for logs and JSON")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="quick calibration")
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per CLI launch")
    args = parser.parse_args(argv)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    db = args.db or str(out_dir / "gpu_check.db")
    gpus = gpu_count()
    if gpus == 0:
        print("gpu_check needs a GPU and torch sees none here; nothing to check (cpu mode is covered by the tests).")
        return 2
    print(f"{gpus} GPU(s) visible; database {db}")
    if not args.no_calibrate:
        calibrate(db, args.quick, out_dir)

    hw_tasks = handwritten_tasks()
    tasks = COLLECTIVES + [t for t in hw_tasks if t not in COLLECTIVES]
    rows: list[dict] = []
    failures: list[str] = []
    for config in configs(gpus):
        name = f"{config['mode']}_ws{config['world_size']}"
        cli_args = [
            "--db", db, "run", "--task", ",".join(tasks), "--model", f"{HANDWRITTEN},baseline",
            "--world-size", str(config["world_size"]), "--mode", config["mode"], "--size", config["size"],
            "--trials", str(args.trials), "--iterations", str(args.iterations), "--timeout", "120",
            "--no-profile", "--json",
        ]
        code, document, seconds = run_cli(cli_args, out_dir / f"{name}.log", args.timeout)
        (out_dir / f"{name}.json").write_text(json.dumps(document, indent=1) if document else "null")
        runs = (document or {}).get("runs", [])
        print(f"{name} (size {config['size']}): exit {code}, {len(runs)} runs in {seconds:.0f} s")
        if not runs:
            failures.append(f"{name}: no runs came back (exit {code}; see {out_dir / (name + '.log')})")
        for run in runs:
            baseline, candidate = run.get("baseline") or {}, run.get("candidate") or {}
            rows.append({
                "task": run["task"], "model": run["model"], "mode": run.get("mode", config["mode"]),
                "world_size": run.get("world_size", config["world_size"]), "mps_enabled": run.get("mps_enabled"),
                "correct": run.get("correct"), "status": run.get("status"),
                "baseline_us": baseline.get("median_us"), "candidate_us": candidate.get("median_us"),
                "speedup": run.get("speedup"), "roofline_fraction": candidate.get("roofline_fraction"),
                "bus_bandwidth_gbps": candidate.get("bus_bandwidth_gbps"), "detail": run.get("status_detail"),
            })
            if run["model"] == HANDWRITTEN and run.get("correct") is not True:
                failures.append(f"{name} {run['task']}: {run.get('status')} {run.get('status_detail') or ''}".strip())

    rows.sort(key=lambda r: (r["model"] != HANDWRITTEN, r["task"], r["mode"], r["world_size"]))
    print()
    print(table(rows))
    (out_dir / "gpu_check_table.json").write_text(json.dumps(rows, indent=1))
    if failures:
        print("\nNot correct or not run:")
        for line in failures:
            print(f"  {line}")
        return 1
    print(f"\nEvery handwritten-cuda run was correct ({sum(r['model'] == HANDWRITTEN for r in rows)} runs).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
