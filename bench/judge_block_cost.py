"""Where a timed block's time goes on the judge's side: per step, for N calls of one task at world
size 1 (the judge's own work around a block: fresh inputs, expected outputs, the float64 truth,
the stacked check of every call's outputs). Prints one line per step.

    python bench/judge_block_cost.py [--task all_reduce] [--size small] [--calls 512] [--pkb-root DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pkb_tui.engine.compare import clone_value, float64_copies, judge_outputs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="all_reduce")
    parser.add_argument("--size", default="small")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--pkb-root", default=None)
    parser.add_argument("--full-median", action="store_true", help="the median over every element (as before)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if cuda else "gloo")
    if args.pkb_root:
        from pkb_tui.pkb.tasks import pkb_tasks

        task = pkb_tasks(args.pkb_root)[args.task]
    else:
        from tasks.base import load_task

        task = load_task(args.task)
    dtype = args.dtype or task.spec.dtypes[0]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(label: str, fn):
        sync()
        t0 = time.perf_counter()
        value = fn()
        sync()
        print(f"{label:28s} {1000 * (time.perf_counter() - t0):9.1f} ms", flush=True)
        return value

    ctx = lambda k: task.context(rank=0, world_size=1, dtype=dtype, size=args.size, seed=1000 + k,  # noqa: E731
                                 device=device, mode="nccl" if cuda else "cpu")
    task.baseline(*clone_value(task.make_inputs(ctx(0))))  # import and warm
    n = args.calls
    inputs = timed(f"make_inputs x{n}", lambda: [task.make_inputs(ctx(k)) for k in range(n)])
    expected = timed(f"baseline x{n}", lambda: [task.baseline(*clone_value(x)) for x in inputs])
    truths = timed(f"float64 baseline x{n}", lambda: [task.baseline(*float64_copies(x)) for x in inputs])
    from pkb_tui.engine import compare
    from pkb_tui.engine.worker import STACK_ELEMENTS, Rule, _stack

    if args.full_median:
        compare.MEDIAN_SAMPLE = 1 << 62
    rule = Rule(task)
    elements = sum(t.numel() for t in compare.tensors_in(expected[0]))
    chunk = max(1, STACK_ELEMENTS // max(1, elements))

    def judge_chunks() -> None:
        for first in range(0, n, chunk):
            part = slice(first, first + chunk)
            stacked = _stack(expected[part]), _stack(expected[part]), _stack(truths[part])
            if stacked[0] is not None:
                rule.judge(*stacked, "stacked")

    timed(f"judge stacked ({chunk} a chunk)", judge_chunks)
    if args.full_median:
        stacked = timed("stack x3 (all calls)", lambda: (_stack(expected), _stack(expected), _stack(truths)))
        if stacked[0] is not None:
            timed("judge all stacked", lambda: rule.judge(*stacked, "stacked"))
    timed("judge 8 one by one", lambda: [judge_outputs(expected[k], expected[k], truths[k],
                                                        task.spec.output_tolerance, "x") for k in range(min(8, n))])
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
