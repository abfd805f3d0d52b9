"""Standalone check of the symmetric heap and every handwritten-cuda kernel, without the launcher.

    python solutions/handwritten-cuda/_selfcheck.py [--world-sizes 1,2,4] [--mps off,on] [--out DIR]

Starts world-size processes on GPU 0 (torch.multiprocessing + gloo, as shared-gpu mode does), with
and without a private MPS daemon, and in each: every solution against its task's reference maths
over fresh random trials (two sizes per task: the task's small one and a medium one that takes the
other code paths, e.g. two-shot all-reduce and unaligned ZeRO shards), the output of the last timed
call checked too, candidate and gloo-baseline medians by CUDA events, and the cost of one
cross-rank device barrier. Prints a table; writes selfcheck.json under --out.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(HERE)]

CASES = [  # (task, label, params override)
    ("all_reduce", "small", {}),
    ("all_reduce", "3M two-shot", {"numel": 3_000_017}),
    ("all_gather", "small", {}),
    ("all_gather", "1031x1029", {"rows_per_rank": 1031, "cols": 1029}),
    ("reduce_scatter", "small", {}),
    ("reduce_scatter", "1031x1029", {"rows_per_rank": 1031, "cols": 1029}),
    ("all_to_all", "small", {}),
    ("all_to_all", "1031x1029", {"rows_per_rank": 1031, "cols": 1029}),
    ("broadcast", "small", {}),
    ("broadcast", "3M", {"numel": 3_000_017}),
    ("zero1_adam_step", "small", {}),
    ("zero1_adam_step", "3M", {"numel": 3_000_017}),
]
DTYPES = ("float32", "bfloat16", "float16")


def _load_solution(task_id: str):
    path = HERE / f"{task_id}.py"
    spec = importlib.util.spec_from_file_location(f"selfcheck_{task_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.solution


def _events_median_us(fn, iters: int, warmup: int) -> tuple[float, object]:
    import torch

    out = None
    for _ in range(warmup):
        out = fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        torch.cuda.synchronize()  # the whole device: work on other streams counts
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times), out


def _rank_main(rank: int, world: int, init_file: str, trials: int, iters: int, only: list[str] | None, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    from pkb_tui import symheap
    from pkb_tui.engine.compare import compare_outputs
    from tasks.base import load_task

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = []
    try:
        device = torch.device("cuda", 0)
        for task_id, label, override in CASES:
            if only and task_id not in only:
                continue
            task = load_task(task_id)
            solution = _load_solution(task_id)
            for dtype in DTYPES:
                if dtype not in task.spec.dtypes or (dtype == "float16" and label != "small"):
                    continue
                row = {"task": task_id, "case": label, "dtype": dtype, "world_size": world}
                try:
                    tol = task.spec.tolerance(dtype)
                    worst = 0.0
                    ok = True
                    message = None
                    for trial in range(trials):
                        ctx = task.context(rank=rank, world_size=world, dtype=dtype, size="small",
                                           seed=1000 + trial, device=device, mode="shared-gpu")
                        ctx.params.update(override)
                        inputs = task.make_inputs(ctx)
                        # references are plain maths on CPU tensors (as the tests run them)
                        everyone = [tuple(t.cpu() for t in task.make_inputs(ctx.for_rank(r))) for r in range(world)]
                        expected = task.reference(everyone, ctx)[rank]
                        got = solution(*[t.clone() for t in inputs])
                        torch.cuda.synchronize()
                        result = compare_outputs(got, expected, tol)
                        ok = ok and result.correct
                        worst = max(worst, result.max_abs_error or 0.0)
                        message = message or result.message
                    cand_us, last = _events_median_us(lambda: solution(*inputs), iters, warmup=3)
                    timed = compare_outputs(last, expected, tol)
                    base_us, _ = _events_median_us(lambda: task.baseline(*[t.clone() for t in inputs]), max(3, iters // 4), warmup=1)
                    row.update(correct=ok and timed.correct, max_abs_error=worst, message=message or timed.message,
                               candidate_us=cand_us, baseline_us=base_us)
                except Exception as exc:  # record it; a dead CUDA context fails the rest loudly
                    row.update(correct=False, message=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
                rows.append(row)
        heap = symheap.get_heap()
        barrier_us, _ = _events_median_us(heap.barrier, 200, warmup=10)
        rows.append({"task": "device_barrier", "case": "heap.barrier()", "dtype": "-", "world_size": world,
                     "correct": True, "candidate_us": barrier_us, "ranks_on_device": heap.ranks_on_device,
                     "sm_count": heap.backend.sm_count()})
        queue.put((rank, "ok", rows))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        try:
            symheap.get_heap().close()
        except Exception:
            pass
        dist.destroy_process_group()


def run_world(world: int, trials: int, iters: int, timeout_s: float, tasks: list[str] | None = None) -> tuple[list[dict], list[str]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, world, init_file, trials, iters, tasks, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results, errors = {}, []
        deadline = time.monotonic() + timeout_s
        while len(results) + len(errors) < world and time.monotonic() < deadline:
            if queue.empty():
                if all(not p.is_alive() for p in procs):
                    break
                time.sleep(0.1)
                continue
            rank, status, value = queue.get()
            (results.__setitem__(rank, value) if status == "ok" else errors.append(f"rank {rank}: {value}"))
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                errors.append(f"rank {procs.index(p)} killed after the time limit")
    if len(results) < world and not errors:
        errors.append(f"only {len(results)} of {world} ranks reported")
    merged = []
    if results:
        for index, row in enumerate(results[min(results)]):
            others = [results[r][index] for r in results]
            row = dict(row)
            row["correct"] = all(o.get("correct") for o in others)
            for key in ("candidate_us", "baseline_us", "max_abs_error"):
                values = [o.get(key) for o in others if o.get(key) is not None]
                row[key] = max(values) if values else None
            row["message"] = next((o.get("message") for o in others if o.get("message")), None)
            merged.append(row)
    return merged, errors


def main() -> int:
    parser = argparse.ArgumentParser(description="handwritten-cuda self-check on one GPU")
    parser.add_argument("--world-sizes", default="1,2,4")
    parser.add_argument("--mps", default="off,on", help="off, on or off,on")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out", default=os.environ.get("OUT") or "/tmp")
    parser.add_argument("--tasks", default="", help="only these task ids (comma separated)")
    args = parser.parse_args()
    from pkb_tui.engine.mps import MpsDaemon

    all_rows, all_errors = [], []
    for mps_setting in args.mps.split(","):
        for world in [int(w) for w in args.world_sizes.split(",")]:
            if mps_setting == "on" and world == 1:
                continue
            daemon = MpsDaemon() if mps_setting == "on" else None
            saved = dict(os.environ)
            try:
                if daemon is not None:
                    if not daemon.start():
                        all_errors.append(f"MPS could not start: {daemon.reason}")
                        continue
                    os.environ.update(daemon.env)  # the spawned ranks become its clients
                started = time.monotonic()
                rows, errors = run_world(world, args.trials, args.iters, args.timeout, [t for t in args.tasks.split(",") if t])
                print(f"world {world} mps {mps_setting}: {len(rows)} rows, {len(errors)} errors in {time.monotonic() - started:.0f} s",
                      flush=True)
            finally:
                os.environ.clear()
                os.environ.update(saved)
                if daemon is not None:
                    daemon.stop()
            for row in rows:
                row["mps"] = mps_setting
            all_rows += rows
            all_errors += [f"world {world} mps {mps_setting}: {e}" for e in errors]

    header = f"{'task':<16} {'case':<16} {'dtype':<9} {'ws':>2} {'mps':>3} {'ok':<3} {'max_abs_err':>11} {'cand_us':>10} {'gloo_base_us':>12}"
    print(header)
    print("-" * len(header))
    for r in all_rows:
        err = f"{r['max_abs_error']:.2g}" if r.get("max_abs_error") is not None else "-"
        cand = f"{r['candidate_us']:.1f}" if r.get("candidate_us") is not None else "-"
        base = f"{r['baseline_us']:.1f}" if r.get("baseline_us") is not None else "-"
        print(f"{r['task']:<16} {r['case']:<16} {r['dtype']:<9} {r['world_size']:>2} {r['mps']:>3} "
              f"{'yes' if r['correct'] else 'NO':<3} {err:>11} {cand:>10} {base:>12}")
        if not r["correct"] and r.get("message"):
            print(f"    {r['message'][:300]}")
    for e in all_errors:
        print("ERROR", e[-3000:])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "selfcheck.json").write_text(json.dumps({"rows": all_rows, "errors": all_errors}, indent=1, default=str))
    bad = [r for r in all_rows if not r["correct"]]
    print(f"\n{len(all_rows) - len(bad)} of {len(all_rows)} correct, {len(all_errors)} errors")
    return 0 if not bad and not all_errors else 1


if __name__ == "__main__":
    sys.exit(main())
