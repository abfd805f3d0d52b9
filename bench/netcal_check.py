"""The network calibration's timing checked against known durations (engine.netcal), on two gloo
processes on 127.0.0.1 (or two GPUs with --mode nccl): prints, per size,

- the window's seconds with no delay and with the receiver holding its acknowledgement for a known
  --delay-ms: the difference should read that delay (the window closes at the acknowledgement);
- the seconds per window against the bytes in it (more calls of one size, and larger messages): a
  line through them (least squares) whose slope is the bandwidth and whose intercept the fixed
  cost: the time should grow with the bytes, whichever way they grow.

    python bench/netcal_check.py [--mode cpu|nccl] [--delay-ms 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (message bytes, calls per window): the bytes per window grow 16-fold at one size, and 4-fold by size.
WINDOWS = {"cpu": ((1 << 20, 4), (1 << 20, 16), (1 << 20, 64), (4 << 20, 16), (16 << 20, 4)),
           "nccl": ((16 << 20, 4), (16 << 20, 16), (16 << 20, 64), (64 << 20, 16), (256 << 20, 4))}


def _rank(rank: int, port: int, mode: str, delay_s: float, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from pkb_tui.engine import netcal

    device = torch.device(f"cuda:{rank}" if mode == "nccl" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if mode == "nccl" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=2)
    peer, sender = 1 - rank, rank == 0
    out = []
    for size, calls in WINDOWS[mode]:
        plain = netcal.measure_stream_s(peer, sender, device, size, calls, repeats)
        delayed = netcal.measure_stream_s(peer, sender, device, size, calls, repeats, receiver_delay_s=delay_s)
        if sender:
            out.append((size, calls, statistics.median(plain), statistics.median(delayed)))
    latency = netcal.measure_latency_us(peer, sender, device, repeats=repeats)
    if sender:
        queue.put((out, statistics.median(latency)))
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["cpu", "nccl"], default="cpu")
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_rank, args=(r, port, args.mode, args.delay_ms / 1e3, args.repeats, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    if queue.empty():
        print("the ranks reported nothing", file=sys.stderr)
        return 1
    points, latency_us = queue.get()
    print(f"{args.mode}: latency (8-byte ping-pong, one way) {latency_us:.1f} us")
    print(f"{'size':>9} {'calls':>5} {'bytes/window':>13} {'window ms':>10} {'+delay ms':>10} {'difference ms':>14} {'GB/s':>6}")
    for size, calls, plain, delayed in points:
        print(f"{size / 2**20:>5.0f} MiB {calls:>5} {calls * size / 2**20:>9.0f} MiB {plain * 1e3:>10.2f} "
              f"{delayed * 1e3:>10.2f} {(delayed - plain) * 1e3:>14.2f} {calls * size / plain / 1e9:>6.2f}")
    xs = [calls * size for size, calls, _, _ in points]
    ys = [plain for _, _, plain, _ in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    intercept = mean_y - slope * mean_x
    print(f"window seconds = {intercept * 1e3:.3f} ms + bytes / {1 / slope / 1e9:.2f} GB/s (least squares over the sizes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
