"""The GPU gate (engine.gate) alone, in two processes on one GPU: what its window adds, and whether
work of a known length in the other process moves it by that length.

    python bench/gate_probe.py [--blocks 40]

The "judge" (this process) owns a flag page and a timing event pair; a "runner" child maps the
page through CUDA IPC, and per block waits for ``go``, runs a spin of known length
(torch.cuda._sleep, calibrated here from 200 back-to-back spins in one process) and writes
``done``. The judge's window: wait go | E0 | wait done | E1. Printed per spin length: the window's
median, its spread (p10-p90, sd), and the median less the empty block's, against the calibrated
length. No project state is touched; prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pkb_tui.engine import gate  # noqa: E402

LENGTHS_US = (0, 5, 50, 500)


def _calibrate() -> tuple[float, dict[int, float]]:
    """Cycles per us of torch.cuda._sleep, and each length's measured time (200 spins, one event pair)."""
    def per_spin_us(cycles: int, count: int = 200) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(count):
            torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / count

    probe = 1_000_000
    rate = probe / per_spin_us(probe, 20)
    return rate, {us: per_spin_us(int(rate * us)) if us else 0.0 for us in LENGTHS_US}


def _runner(flags: torch.Tensor, plan: list[tuple[int, int]], inbox: Any, outbox: Any) -> None:
    torch.cuda.set_device(0)
    base = flags.data_ptr()  # the judge's tensor, mapped here by torch.multiprocessing (CUDA IPC)
    stream = gate.stream_handle(torch.cuda.current_stream())
    outbox.put("up")
    for seq, cycles in plan:
        inbox.get()  # the judge has enqueued its window's start
        gate.wait(stream, base + gate.GO_OFFSET, seq)
        if cycles:
            torch.cuda._sleep(cycles)
        gate.write(stream, base + gate.DONE_OFFSET, seq)
        outbox.put(seq)
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=40, help="blocks per spin length")
    args = parser.parse_args()
    torch.cuda.set_device(0)
    rate, lengths = _calibrate()
    flags = torch.zeros(gate.GATE_BYTES // 4, dtype=torch.int32, device="cuda")
    judge = gate.JudgeGate(torch.device("cuda", 0))
    why = judge.self_test()
    if why:
        print(f"gate not available: {why}")
        return 1
    plan = [(1 + i, int(rate * us)) for i, us in enumerate(us for us in LENGTHS_US for _ in range(args.blocks))]
    ctx = mp.get_context("spawn")
    to_runner, from_runner = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_runner, args=(flags, plan, to_runner, from_runner))
    proc.start()
    from_runner.get(timeout=120)
    base = flags.data_ptr()
    windows: dict[int, list[float]] = {us: [] for us in LENGTHS_US}
    for index, (seq, _) in enumerate(plan):
        us = LENGTHS_US[index // args.blocks]
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gate.wait(gate.stream_handle(judge.stream), base + gate.GO_OFFSET, seq)
        start.record(judge.stream)
        to_runner.put(seq)
        assert from_runner.get(timeout=60) == seq  # the runner's side is enqueued
        gate.wait(gate.stream_handle(judge.stream), base + gate.DONE_OFFSET, seq)
        stop.record(judge.stream)
        gate.write(gate.stream_handle(judge.releaser), base + gate.GO_OFFSET, seq)
        stop.synchronize()
        windows[us].append(start.elapsed_time(stop) * 1000.0)
        time.sleep(0.001)
    proc.join(timeout=60)
    empty = statistics.median(windows[0][2:])
    rows = []
    print(f"spin calibration: {rate:.0f} cycles/us")
    print(f"{'spin us':>8s} {'calibrated':>10s} {'window med':>10s} {'p10':>8s} {'p90':>8s} {'sd':>7s} {'less empty':>10s}")
    for us in LENGTHS_US:
        values = sorted(windows[us][2:])  # the first two: the runner's first launches
        med = statistics.median(values)
        row = {"spin_us": us, "calibrated_us": round(lengths[us], 2), "window_median_us": round(med, 2),
               "p10_us": round(values[len(values) // 10], 2), "p90_us": round(values[len(values) * 9 // 10], 2),
               "sd_us": round(statistics.pstdev(values), 2), "less_empty_us": round(med - empty, 2)}
        rows.append(row)
        print(f"{us:>8d} {row['calibrated_us']:>10.2f} {med:>10.2f} {row['p10_us']:>8.2f} {row['p90_us']:>8.2f} "
              f"{row['sd_us']:>7.2f} {row['less_empty_us']:>10.2f}")
    print(json.dumps({"gate_probe": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
