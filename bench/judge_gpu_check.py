"""The judge and its timing on a GPU box: what issues 10 and 11 must show there.

    python bench/judge_gpu_check.py --out DIR [--parts smoke,adversarial,spin,selfcheck] [--mode nccl]

Parts (each one or two CLI launches; the figures come from the batches' own event files):
  smoke        all_reduce, baseline and torch-p2p, nccl x1 default: the runner path works at all.
  adversarial  the attack fixtures (tests/fixtures/adversarial) + an honest model, nccl x1 and
               shared-gpu x2; then the honest model alone: the baseline's median with and without
               the attackers earlier in the batch.
  spin         candidates = the all_reduce baseline + a spin kernel (torch.cuda._sleep) of 5, 50, 500
               and 5,000 us, calibrated here with 200 back-to-back spins; each must move the graph
               median by its length within max(1 us, 3%). A clone-only candidate and the small
               all_reduce baseline against their profiled kernel time (within 2 us).
  selfcheck    every task's baseline against itself, nccl x1 default: how many medians within 3%.
  gate         the GPU gate (engine.gate, switched on for this part): runners that signal the end of a graph block before its
               work, start it before the judge's go, or never signal its end (all must fail), and an
               honest model (must pass), all_reduce small, nccl x1, the graph figure as the basis.
  batching     honest models (torch-p2p, handwritten-cuda) and adversarial/batch-calls, the eight
               collectives, nccl x1 small and default: speedup in blocks against one call at a time.
  faults       GPU faults in candidates (tests/fixtures/gpu-faults) and an honest model after them;
               the GPU's memory and compute processes before and after; whether NVML attributes
               per-process GPU memory here (the GPU-memory limit depends on it; on a VM it may not),
               and gpu-hog's verdict: "exceeded its GPU-memory limit", or a note saying why not.
Prints tables; writes DIR/judge_check.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pkb_tui's own helpers (timing, limits, stats) in this process
    sys.path.insert(0, str(ROOT))
ATTACKS = ["patch-judge", "gc-scavenge", "seed-rebuild", "memo-address", "count-calls", "thread-after-window",
           "lying-subclass", "forge-events", "slow-baseline", "patch-clock", "cpu-burner", "forge-reply", "kill-judge",
           "gpu-linger", "gpu-linger-long", "renice-baseline", "head-start", "batch-calls"]
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def cli(out: Path, name: str, args: list[str], timeout_s: float = 400, env_extra: dict[str, str] | None = None
        ) -> tuple[dict | None, dict[int, dict]]:
    """One `pkb-tui run --json`; returns its JSON and, per item, the events of its batch."""
    db = out / f"{name}.db"
    runs_dir = out / "pkb-runs" / name  # its own: events are read from here, no other call's
    env = {**os.environ, **SAFE_ENV, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           **(env_extra or {})}
    started = time.monotonic()
    with open(out / f"{name}.err", "w") as err:
        try:
            proc = subprocess.run([sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "--runs-dir", str(runs_dir), "run",
                                   *args, "--json"],
                                  stdout=subprocess.PIPE, stderr=err, env=env, timeout=timeout_s, text=True)
            returncode, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired:  # the items it finished are in its event files: read them anyway
            returncode, stdout = f"none: cut off at {timeout_s:.0f} s", ""
    print(f"--- {name}: exit {returncode} in {time.monotonic() - started:.0f} s", flush=True)
    try:
        doc = json.loads(stdout)
    except ValueError:
        doc = None
        print((out / f"{name}.err").read_text()[-1500:])
    events: dict[int, dict] = {}
    for path in sorted(glob.glob(str(runs_dir / "*" / "events.*.jsonl"))):
        for line in open(path):
            body = line.partition(" ")[2]
            try:
                event = json.loads(body)
            except ValueError:
                continue
            item = event.get("item")
            if item is None:
                continue
            slot = events.setdefault(item, {"timing": {}, "kernels": {}})
            if event["event"] == "timing":
                slot["timing"][event["variant"]] = event
            elif event["event"] == "kernels" and event.get("rank") == 0:
                slot["kernels"][event["variant"]] = event["kernels"]
            elif event["event"] == "run_started":
                slot["model"] = event["model"]
                slot["task"] = event["task"]
    return doc, events


def figure(events: dict, item: int, variant: str, method: str) -> float | None:
    timing = events.get(item, {}).get("timing", {}).get(variant) or {}
    block = timing.get(method) or {}
    return block.get("median_us")


def runs_by_model(doc: dict | None) -> dict[str, dict]:
    return {r["model"]: r for r in (doc or {}).get("runs", [])}


def part_smoke(out: Path, report: dict) -> None:
    doc, events = cli(out, "smoke", ["--task", "all_reduce", "--model", "baseline,torch-p2p", "--world-size", "1",
                                     "--mode", "nccl", "--size", "default", "--trials", "3"])
    rows = []
    for item, slot in sorted(events.items()):
        rows.append({"model": slot.get("model"), **{f"{v}_{m}_us": figure(events, item, v, m)
                                                  for v in ("baseline", "candidate") for m in ("eager", "graph")},
                     "graph_note": (slot["timing"].get("candidate") or {}).get("graph_note"),
                     "overhead_us": (slot["timing"].get("baseline") or {}).get("overhead_us")})
    for model, run in runs_by_model(doc).items():
        print(f"  {model:12s} {run['status']:8s} speedup {run.get('speedup')}")
    for row in rows:
        print("  ", json.dumps(row))
    report["smoke"] = {"runs": {m: r["status"] for m, r in runs_by_model(doc).items()}, "figures": rows}


def part_adversarial(out: Path, report: dict, configs: list[tuple[str, int]]) -> None:
    table = []
    for mode, world in configs:
        # ADV_ATTACKS: a subset (names under tests/fixtures/adversarial, or paths) when time is short
        attacks = [a for a in os.environ.get("ADV_ATTACKS", ",".join(ATTACKS)).split(",") if a]
        models = ",".join([*(a if "/" in a else str(ROOT / "tests" / "fixtures" / "adversarial" / a) for a in attacks),
                           "torch-p2p"])
        common = ["--task", "all_reduce", "--world-size", str(world), "--mode", mode, "--size", "small",
                  "--trials", "2", "--timeout", os.environ.get("ADV_TIMEOUT", "90"), "--no-profile"]
        doc, events = cli(out, f"adv_{mode}_{world}", [*common, "--model", models], timeout_s=560)
        alone, alone_events = cli(out, f"adv_alone_{mode}_{world}", [*common, "--model", "torch-p2p"])
        alone_base = figure(alone_events, 0, "baseline", "eager")
        runs = runs_by_model(doc)
        for item, slot in sorted(events.items()):
            model = Path(slot.get("model", "?")).name
            run = runs.get(slot.get("model")) or runs.get(model) or {}
            table.append({"mode": mode, "world": world, "case": model, "verdict": run.get("status"),
                          "detail": (run.get("status_detail") or "")[:70],
                          "speedup": run.get("speedup"), "baseline_eager_us": figure(events, item, "baseline", "eager"),
                          "baseline_alone_us": alone_base})
    print(f"  {'mode':10s} {'ws':>2s} {'case':20s} {'verdict':8s} {'speedup':>8s} {'base us':>9s} {'alone us':>9s}")
    for row in table:
        sp = f"{row['speedup']:.2f}" if row["speedup"] else "-"
        b = f"{row['baseline_eager_us']:.1f}" if row["baseline_eager_us"] else "-"
        a = f"{row['baseline_alone_us']:.1f}" if row["baseline_alone_us"] else "-"
        print(f"  {row['mode']:10s} {row['world']:>2d} {row['case']:20s} {str(row['verdict']):8s} {sp:>8s} {b:>9s} {a:>9s}"
              f"  {row['detail']}")
    report["adversarial"] = table


def part_batching(out: Path, report: dict) -> None:
    """The batching check (timing.batched) on the GPU: honest models' speedup in blocks against one
    call at a time, for the spread an honest code shows (the limit must sit above it), and
    adversarial/batch-calls (one all_reduce for a block), which must fail."""
    models = ",".join(["torch-p2p", "handwritten-cuda", str(ROOT / "tests" / "fixtures" / "adversarial" / "batch-calls")])
    rows = []
    tasks = os.environ.get("BATCHING_TASKS", "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter")
    for size in os.environ.get("BATCHING_SIZES", "small,default").split(","):
        doc, events = cli(out, f"batching_{size}", ["--task", tasks, "--model", models, "--world-size", "1",
                                                    "--mode", "nccl", "--size", size, "--trials", "1", "--no-profile",
                                                    "--timeout", "40"], timeout_s=560)
        runs = {r["id"]: r for r in (doc or {}).get("runs", [])}
        by_key = {(r["task"], Path(r["model"]).name): r for r in runs.values()}
        for _, slot in sorted(events.items()):
            b, c = (slot["timing"].get(v, {}).get("eager") or {} for v in ("baseline", "candidate"))
            run = by_key.get((slot.get("task"), Path(slot.get("model", "?")).name)) or {}
            row = {"size": size, "task": slot.get("task"), "model": Path(slot.get("model", "?")).name,
                   "status": run.get("status"), "speedup": run.get("speedup"),
                   "blocks": round(b["median_us"] / c["median_us"], 3) if b.get("median_us") and c.get("median_us") else None,
                   "alone": round(b["single_us"] / c["single_us"], 3) if b.get("single_us") and c.get("single_us") else None,
                   "base_single_us": b.get("single_us"), "cand_single_us": c.get("single_us"),
                   # the intervals timing.batched compares (None where it cannot say)
                   "blocks_ci": _interval(b.get("rounds_us"), c.get("rounds_us")),
                   "alone_ci": _interval(b.get("single_rounds_us"), c.get("single_rounds_us")),
                   "detail": (run.get("status_detail") or "")[:90]}
            rows.append(row)
            print("  ", json.dumps(row))
    honest = [r for r in rows if r["model"] != "batch-calls" and r["blocks"] and r["alone"]]
    gaps = sorted(r["blocks"] / r["alone"] for r in honest)
    if gaps:
        print(f"  honest runs: blocks/alone speedup ratio {gaps[0]:.2f} .. {gaps[-1]:.2f} (median "
              f"{statistics.median(gaps):.2f}) over {len(gaps)}; failed by the check: "
              f"{sum(1 for r in honest if 'timing inconsistent' in r['detail'])}")
    report["batching"] = rows


def part_gate(out: Path, report: dict) -> None:
    fixtures = ["gate-early-done", "gate-no-wait", "gate-no-done"]
    models = ",".join([*(str(ROOT / "tests" / "fixtures" / "adversarial" / f) for f in fixtures), "torch-p2p"])
    doc, events = cli(out, "gate", ["--task", "all_reduce", "--model", models, "--world-size", "1", "--mode", "nccl",
                                    "--size", "small", "--trials", "1", "--no-profile", "--timeout", "60",
                                    "--speedup-basis", "graph"], timeout_s=400, env_extra={"PKB_GPU_GATE": "1"})
    runs = runs_by_model(doc)
    rows = []
    for item, slot in sorted(events.items()):
        model = Path(slot.get("model", "?")).name
        run = runs.get(slot.get("model")) or runs.get(model) or {}
        rows.append({"model": model, "status": run.get("status"), "speedup": run.get("speedup"),
                     "baseline_graph_us": figure(events, item, "baseline", "graph"),
                     "candidate_graph_us": figure(events, item, "candidate", "graph"),
                     "detail": (run.get("status_detail") or "")[:160]})
        print("  ", json.dumps(rows[-1]))
    gate_notes = sorted({str(n) for r in (doc or {}).get("runs", []) for n in (r.get("notes") or []) if "gate" in str(n)})
    print(f"  gate notes: {gate_notes or 'none (the gate was on)'}")
    report["gate"] = {"rows": rows, "notes": gate_notes}


def _interval(baseline: Any, candidate: Any) -> list[float] | None:
    """The speedup's point and 95% interval as timing.batched reads them (None where it cannot say)."""
    from pkb_tui.engine.timing import paired_speedup

    est = paired_speedup(baseline or [], candidate or [])
    return None if est is None else [round(est.point, 3), round(est.low, 3), round(est.high, 3)]


FAULTS = ["illegal-address", "device-assert", "endless-kernel", "gpu-oom", "gpu-hog"]


def nvml_attribution() -> dict[str, Any]:
    """Whether NVML lists a CUDA process of ours with its memory (engine.limits.GpuMemory, as the
    judge's guard reads it): a child that holds 2 GiB on cuda:0 while we look."""
    code = ("import sys, time, torch\n"
            "x = torch.ones(2 << 30, dtype=torch.uint8, device='cuda:0'); torch.cuda.synchronize()\n"
            "print('ready', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        ready = child.stdout is not None and child.stdout.readline().strip() == "ready"
        from pkb_tui.engine.limits import GIB, GpuMemory

        gpu = GpuMemory()
        listed = gpu.used_by_pid()
        reading = gpu.reading([child.pid], child.pid)
        gpu.close()
        return {"child_ready": ready, "child_pid": child.pid, "attributed": reading.attributed,
                "child_gib": round(reading.used_bytes / GIB, 2), "why_not": reading.why_not,
                "nvml_lists": {pid: (None if used is None else round(used / GIB, 2)) for pid, used in listed.items()}}
    finally:
        child.kill()
        child.wait()


def _gpu_state() -> dict[str, Any]:
    """Memory used on each GPU and the compute processes on them (nvidia-smi), for before/after."""
    def query(what: str) -> list[str]:
        try:
            out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"nvidia-smi failed: {exc}"]
        return [line.strip() for line in out.splitlines() if line.strip()]
    return {"memory_used_mib": query("gpu=index,memory.used"), "compute_apps": query("compute-apps=pid,used_memory")}


def part_faults(out: Path, report: dict) -> None:
    """GPU faults in candidates (issue 13, item 5): each ends its own run with its own verdict,
    the honest model after them passes, and nothing is left on the GPU."""
    attribution = nvml_attribution()
    print(f"  NVML per-process GPU memory: {json.dumps(attribution)}")
    before = _gpu_state()
    models = ",".join([*(str(ROOT / "tests" / "fixtures" / "gpu-faults" / f) for f in FAULTS), "torch-p2p"])
    doc, events = cli(out, "faults", ["--task", "all_reduce", "--model", models, "--world-size", "1", "--mode", "nccl",
                                      "--size", "small", "--trials", "2", "--timeout", os.environ.get("FAULT_TIMEOUT", "60"),
                                      "--no-profile"], timeout_s=500)
    time.sleep(2)
    after = _gpu_state()
    rows = []
    for model, run in runs_by_model(doc).items():
        name = Path(model).name
        ok = run.get("status") == "passed" if name == "torch-p2p" else run.get("status") != "passed"
        row = {"case": name, "verdict": run.get("status"), "detail": (run.get("status_detail") or "")[:160], "ok": ok}
        if name == "gpu-hog":  # ended by the GPU-memory limit, or the run's notes say why it could not be
            unlimited = [n for n in run.get("notes") or [] if n.startswith("GPU memory not limited")]
            row["ok"] = "exceeded its GPU-memory limit" in (run.get("status_detail") or "")
            row["not_limited"] = unlimited
            row["limits_note"] = [n for n in run.get("notes") or [] if n.startswith("limits per candidate")]
        rows.append(row)
    for row in rows:
        print("  ", json.dumps(row))
    print(f"  GPU before: {before}\n  GPU after:  {after}")
    report["faults"] = {"rows": rows, "gpu_before": before, "gpu_after": after, "nvml_attribution": attribution}


SPIN_TARGETS = (5, 50, 500, 5000)  # us: issue 11's spin kernels


def calibrate_spin() -> tuple[float, dict[int, float]]:
    """Cycles per microsecond of torch.cuda._sleep, and the length of each target as measured the
    way the device-time figure runs it: N spins captured in one CUDA graph and replayed, timed
    between two events (back-to-back eager launches add the host's launch gap to short spins:
    measured on the H200, a 5 us target read 7.3 us eager and 5.8 us in a graph)."""
    import torch

    torch.cuda.init()

    def per_call_us(cycles: int, calls: int = 200) -> float:
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                torch.cuda._sleep(cycles)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / calls

    probe = 1_000_000
    rate = probe / per_call_us(probe, 20)
    lengths = {}
    for target in SPIN_TARGETS:
        cycles = int(rate * target)
        lengths[target] = per_call_us(cycles, 200 if target < 5000 else 40)
    return rate, lengths


SPIN_TEMPLATE = '''import torch
import torch.distributed as dist

CYCLES = {cycles}
_side = torch.cuda.Stream() if {side} else None


def solution(x):
    out = x.clone()
    dist.all_reduce(out)
    if CYCLES:
        with torch.cuda.stream(_side or torch.cuda.current_stream()):
            torch.cuda._sleep(CYCLES)
    return out
'''
# Issue 11's side-stream case (the template with side=True): the right answer on the current stream,
# and a spin on a stream of its own that nothing waits for (work a candidate hides beside the timed
# stream). The eager window must hold it (the runner synchronizes the device, every stream, before
# it answers); a CUDA graph holds only what its capture recorded, and what a replay leaves out is
# judged by the replay's outputs.
SIDE_TARGET = 500  # us: well above the host's ~20-50 us a call at size small, so the eager figure shows it


def part_spin(out: Path, report: dict) -> None:
    rate, lengths = calibrate_spin()
    print(f"  spin calibration: {rate:.0f} cycles/us; measured lengths {json.dumps({k: round(v, 2) for k, v in lengths.items()})}")
    folder = Path(tempfile.mkdtemp(prefix="spin-", dir=out))
    # SPIN_TARGETS: which spins run (us, ',' apart; the 0-spin base always does), SPIN_CLONE=0 leaves out
    # the clone-only item: to re-run one that ran out of time without paying for the rest again.
    targets = [t for t in SPIN_TARGETS if str(t) in os.environ.get("SPIN_TARGETS", ",".join(map(str, SPIN_TARGETS))).split(",")]
    models = []
    for target in (0, *targets):
        model = folder / f"spin{target}"
        model.mkdir()
        (model / "all_reduce.py").write_text(SPIN_TEMPLATE.format(cycles=int(rate * target) if target else 0, side=False))
        models.append(str(model))
    if os.environ.get("SPIN_SIDE", "1") != "0":  # SPIN_SIDE=0 leaves out the side-stream item
        side = folder / "side-stream"
        side.mkdir()
        (side / "all_reduce.py").write_text(SPIN_TEMPLATE.format(cycles=int(rate * SIDE_TARGET), side=True))
        models.append(str(side))
    if os.environ.get("SPIN_CLONE", "1") != "0":
        clone = folder / "clone-only"
        clone.mkdir()
        (clone / "all_reduce.py").write_text("def solution(x):\n    return x.clone()\n")
        models.append(str(clone))
    # SPIN_TIMEOUT: each run's --timeout (its timing budget is 30% of it, at most 30 s); SPIN_CALL_S: how
    # long the batch may take in all. At 45 (H100, 2026-12-07) five of the six ran in 190 s and spin5000
    # timed out (4 rounds of its 200-call blocks in 43.7 s): re-run it with SPIN_TARGETS=5000 SPIN_CLONE=0
    # SPIN_TIMEOUT=150.
    doc, events = cli(out, "spin", ["--task", "all_reduce", "--model", ",".join(models), "--world-size", "1",
                                    "--mode", "nccl", "--size", "small", "--trials", "2", "--iterations", "200",
                                    "--timeout", os.environ.get("SPIN_TIMEOUT", "300")],
                      timeout_s=float(os.environ.get("SPIN_CALL_S", "500")))
    by_model = {Path(slot.get("model", "")).name: item for item, slot in events.items()}
    rows = []
    for method in ("graph", "eager"):
        base = figure(events, by_model.get("spin0", -1), "candidate", method)
        for target in targets:
            got = figure(events, by_model.get(f"spin{target}", -1), "candidate", method)
            if base is None or got is None:
                rows.append({"method": method, "target_us": target, "delta_us": None})
                continue
            delta = got - base
            allowed = max(1.0, 0.03 * lengths[target])
            # Issue 11's target is the device-time figure (graph). The eager rows are what an eager
            # program pays, shown beside it: below ~50 us the host's dispatch hides a spin ("ok": null).
            rows.append({"method": method, "target_us": target, "calibrated_us": round(lengths[target], 2),
                         "delta_us": round(delta, 2),
                         "ok": abs(delta - lengths[target]) <= allowed if method == "graph" else None})
    # The side-stream spin: per call, the eager figure must hold at least 90% of its calibrated length
    # (the spins queue on their stream and the current stream's work runs beside them, so the call's
    # own ~20-50 us and the block's harness share, subtracted, partly hide under them; a window without
    # the side stream would read the ~20-50 us alone).
    if "side-stream" in by_model:
        item = by_model["side-stream"]
        timing = events.get(item, {}).get("timing", {}).get("candidate") or {}
        eager = figure(events, item, "candidate", "eager")
        run = runs_by_model(doc).get("side-stream") or {}
        rows.append({"method": "eager", "what": f"side-stream spin {SIDE_TARGET} us", "calibrated_us": round(lengths[SIDE_TARGET], 2),
                     "figure_us": None if eager is None else round(eager, 2),
                     "ok": eager is not None and eager >= 0.9 * lengths[SIDE_TARGET],
                     "graph_us": figure(events, item, "candidate", "graph"), "graph_note": timing.get("graph_note"),
                     "status": run.get("status"), "speedup_eager": run.get("speedup_eager")})
    for row in rows:
        print("  ", json.dumps(row))
    # Profiled kernel time per call against the graph figure: the clone-only candidate, and the baseline.
    checks = []
    for label, item, variant in (("clone-only", by_model.get("clone-only", -1), "candidate"),
                                 ("all_reduce baseline", by_model.get("spin0", -1), "baseline")):
        if item < 0:  # left out of this call (SPIN_CLONE=0): not a failed check
            continue
        kernels = events.get(item, {}).get("kernels", {}).get(variant) or []
        per_call = sum(float(k.get("total_us") or 0.0) for k in kernels) / 3.0 if kernels else None
        graph = figure(events, item, variant, "graph")
        checks.append({"what": label, "graph_us": graph, "profiled_kernel_us_per_call": per_call,
                       "ok": graph is not None and per_call is not None and abs(graph - per_call) <= 2.0,
                       "kernels": [(k.get("name"), k.get("calls"), k.get("total_us")) for k in kernels][:6]})
    for row in checks:
        print("  ", json.dumps(row))
    report["spin"] = {"cycles_per_us": rate, "lengths_us": lengths, "rows": rows, "profiled": checks}


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def bias_parts(events: dict, item: int) -> dict[str, Any]:
    """Per method, the self-check's median per-round ratio B/C three ways: the judge's figure (wall
    less the baseline's null blocks), the runners' own event times (no hand-off in them), and the
    hand-offs alone (rank 0: in + out per block, candidate less baseline, us per block)."""
    out: dict[str, Any] = {}
    timing = events.get(item, {}).get("timing", {})
    for method in ("eager", "graph"):
        b = (timing.get("baseline") or {}).get(method) or {}
        c = (timing.get("candidate") or {}).get(method) or {}
        pairs = list(zip(b.get("reported_rounds_us") or [], c.get("reported_rounds_us") or []))
        ratios = [rb[0] / rc[0] for rb, rc in pairs if rb and rc and rb[0] and rc[0]]
        out[f"{method}_reported"] = round(_median(ratios), 4) if ratios else None
        # Where the judge's round-to-round spread comes from: the same spread of the runners' own
        # event times (the GPU's work) beside it, and the spread of one block's hand-offs in + out.
        logs = [math.log(r) for r in ratios if r > 0]
        out[f"{method}_reported_round_sd"] = round(statistics.pstdev(logs), 4) if len(logs) > 1 else None
        hand, trips = [], []
        for hb, hc in zip(b.get("handoff_rounds_us") or [], c.get("handoff_rounds_us") or []):
            if hb and hc and None not in hb[0] and None not in hc[0]:
                hand.append(sum(hc[0]) - sum(hb[0]))
                trips += [sum(hb[0]), sum(hc[0])]
        out[f"{method}_handoff_c_minus_b_us"] = round(_median(hand), 2) if hand else None
        out[f"{method}_handoff_us"] = round(_median(trips), 1) if trips else None
        out[f"{method}_handoff_sd_us"] = round(statistics.pstdev(trips), 1) if len(trips) > 1 else None
        walls = [rb[0] / rc[0] for rb, rc in zip(b.get("rounds_us") or [], c.get("rounds_us") or []) if rb and rc and rc[0]]
        out[f"{method}_rounds"] = len(walls)
        if walls:
            logs = sorted(math.log(w) for w in walls if w > 0)
            out[f"{method}_round_sd"] = round(statistics.pstdev(logs), 4) if len(logs) > 1 else None
    return out


def part_selfcheck(out: Path, report: dict, size: str = "small", timeout_s: int = 25) -> None:
    doc, events = cli(out, "selfcheck", ["--task", os.environ.get("SELFCHECK_TASKS", "all"), "--model", "baseline", "--world-size", "1", "--mode", "nccl",
                                         "--size", size, "--trials", "1", "--iterations", "1", "--no-profile",
                                         "--timeout", str(timeout_s),
                                         "--speedup-basis", os.environ.get("SELFCHECK_BASIS", "graph")], timeout_s=560)
    intervals = {r["task"]: r for r in (doc or {}).get("runs", [])}
    rows = []
    for item, slot in sorted(events.items()):
        row: dict[str, Any] = {"task": slot.get("task")}
        for method in ("eager", "graph"):
            b, c = figure(events, item, "baseline", method), figure(events, item, "candidate", method)
            row[method] = round(b / c, 3) if b and c else None
            row[f"{method}_base_us"] = round(b, 2) if b else None
        run = intervals.get(slot.get("task")) or {}
        row["status"] = run.get("status")
        row["speedup"], row["low"], row["high"] = run.get("speedup"), run.get("speedup_low"), run.get("speedup_high")
        rows.append(row)
    for row in rows:  # where a self-check's bias comes from: the runner's own device time and the hand-offs
        item = next(i for i, sl in events.items() if sl.get("task") == row["task"])
        row.update(bias_parts(events, item))
    for row in rows:  # device time: the graph figure where the call can be captured, else eager
        row["device"] = row["graph"] if row["graph"] else row["eager"]
    within_device = sum(1 for r in rows if r["device"] and abs(r["device"] - 1) <= 0.03)
    within = sum(1 for r in rows if r["eager"] and abs(r["eager"] - 1) <= 0.03)
    within_graph = sum(1 for r in rows if r["graph"] and abs(r["graph"] - 1) <= 0.03)
    graphs = sum(1 for r in rows if r["graph"])
    contain = sum(1 for r in rows if r["low"] is not None and r["low"] <= 1.0 <= r["high"])
    point_within = sum(1 for r in rows if r["speedup"] and abs(r["speedup"] - 1) <= 0.03)
    # The host's noise floor as `pkb-tui calibrate --noise-tasks collectives` would set it from the
    # eight collectives (stats.noise_floor_from_selfchecks, in this basis; exact where these intervals
    # hold no earlier floor), and how many of the other tasks' intervals reach into it: an
    # out-of-sample test of the "within noise" verdict and of the widened interval the fast_p rule uses.
    from pkb_tui.engine.calibrate import NOISE_TASKS
    from pkb_tui.engine.stats import SpeedupEstimate, noise_floor_from_selfchecks
    from pkb_tui.store.faster import within_noise

    floor = noise_floor_from_selfchecks([SpeedupEstimate(r["speedup"], r["low"] or r["speedup"], r["high"] or r["speedup"],
                                                         "", 0, 0.95)
                                         for r in rows if r["task"] in NOISE_TASKS and r["speedup"]])
    others = [r for r in rows if r["task"] not in NOISE_TASKS and r["low"] is not None]
    within_floor = sum(within_noise(r["low"], r["high"], floor) or 0 for r in others) if floor is not None else None
    for row in rows:
        print("  ", json.dumps(row))
    if floor is not None:
        print(f"  noise floor from the eight collectives: +-{floor:.2%}; the other tasks' intervals reaching into "
              f"it: {within_floor}/{len(others)}")
    print(f"  self-check ({size}, speedup basis {os.environ.get('SELFCHECK_BASIS', 'graph')}): paired speedup within "
          f"3%: {point_within}/{len(rows)}; 95% intervals containing 1.0: {contain}/{len(rows)}; device-time medians "
          f"(graph, else eager) within 3%: {within_device}/{len(rows)}; eager medians: {within}/{len(rows)}; graph: "
          f"{within_graph}/{graphs}")
    report["selfcheck"] = {"rows": rows, "eager_within_3pct": within, "graph_within_3pct": within_graph,
                           "device_within_3pct": within_device,
                           "intervals_contain_1": contain, "speedup_within_3pct": point_within, "tasks": len(rows),
                           "collectives_floor": floor, "others_within_floor": within_floor, "others": len(others)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/pkb-out"))
    parser.add_argument("--parts", default="smoke,adversarial,spin,selfcheck")
    parser.add_argument("--adversarial-configs", default="nccl:1,shared-gpu:2")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    for part in args.parts.split(","):
        print(f"=== {part}", flush=True)
        started = time.monotonic()
        try:
            if part == "smoke":
                part_smoke(out, report)
            elif part == "adversarial":
                configs = [(c.split(":")[0], int(c.split(":")[1])) for c in args.adversarial_configs.split(",")]
                part_adversarial(out, report, configs)
            elif part == "spin":
                part_spin(out, report)
            elif part == "selfcheck":
                part_selfcheck(out, report)
            elif part == "faults":
                part_faults(out, report)
            elif part == "batching":
                part_batching(out, report)
            elif part == "gate":
                part_gate(out, report)
        except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others' figures
            print(f"  part {part} failed: {type(exc).__name__}: {exc}")
            report[part] = {"error": str(exc)}
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
        (out / "judge_check.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
