"""Which per-round statistic gives the steadier cpu-mode self-check: median, p25 or trimmed mean.

Two gloo ranks time the same all-reduce as "baseline" and "candidate" in interleaved rounds
(B C, C B, ...), per call a barrier then the call, the slowest rank's time per call; then
stats.speedup_interval per statistic. Repeated, quiet and with a CPU burner beside it. Prints per
statistic: the self-checks' worst distance from 1.0x, how many 95% intervals contain 1.0, the mean
relative half-width. Run: PYTHONPATH=$PWD python bench/stats_round_statistic.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import time


def _rank(rank: int, port: int, numel: int, rounds: int, calls: int, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.randn(numel)

    def call() -> None:
        out = x.clone()
        dist.all_reduce(out)

    for _ in range(5):
        call()
    experiments = []
    for _ in range(repeats):
        per_variant: dict[str, list[list[float]]] = {"baseline": [], "candidate": []}
        for r in range(rounds):
            order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
            for variant in order:
                samples = []
                for _ in range(calls):
                    dist.barrier()
                    t0 = time.perf_counter_ns()
                    call()
                    samples.append((time.perf_counter_ns() - t0) / 1e3)
                per_variant[variant].append(samples)
        experiments.append(per_variant)
    gathered: list = [None, None]
    dist.all_gather_object(gathered, experiments)
    if rank == 0:
        slowest = []
        for e0, e1 in zip(*gathered):
            slowest.append({v: [[max(a, b) for a, b in zip(r0, r1)] for r0, r1 in zip(e0[v], e1[v])] for v in e0})
        queue.put(slowest)
    dist.destroy_process_group()


def _burn(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def measure(numel: int, rounds: int, calls: int, repeats: int, loaded: bool) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop = ctx.Event()
    burner = ctx.Process(target=_burn, args=(stop,)) if loaded else None
    if burner:
        burner.start()
    procs = [ctx.Process(target=_rank, args=(r, port, numel, rounds, calls, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if burner:
        stop.set()
        burner.join()
    return queue.get()


def main() -> None:
    from pkb_tui.engine import stats

    parser = argparse.ArgumentParser()
    parser.add_argument("--numel", type=int, default=10_007)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    print(f"cpu self-check: all_reduce of {args.numel} floats, 2 gloo ranks, {args.rounds} rounds x {args.calls} calls, "
          f"{args.repeats} repeats, {os.cpu_count()} cores")
    for loaded in (False, True):
        experiments = measure(args.numel, args.rounds, args.calls, args.repeats, loaded)
        print(f"\n{'loaded (one busy process beside it)' if loaded else 'quiet'}:")
        print(f"{'statistic':<10} {'worst |x-1|':>12} {'contain 1.0':>12} {'mean +-':>9}  points")
        for statistic in stats.ROUND_STATISTICS:
            estimates = [stats.speedup_interval(e["baseline"], e["candidate"], statistic=statistic) for e in experiments]
            worst = max((max(e.point, 1.0 / e.point) - 1.0 for e in estimates if e.point > 0), default=0.0)
            contain = sum(e.contains(1.0) for e in estimates)
            width = sum(e.relative_half_width for e in estimates) / len(estimates)
            points = " ".join(f"{e.point:.3f}" for e in estimates)
            print(f"{statistic:<10} {worst:>11.1%} {contain:>7}/{len(estimates):<4} {width:>8.1%}  {points}")


if __name__ == "__main__":
    main()
