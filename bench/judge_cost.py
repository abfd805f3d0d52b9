"""What the judge's per-output comparison costs: compare.judge_outputs on one output of N elements.

    python bench/judge_cost.py [--device cuda] [--numel 67108877]

Prints the time of judge_outputs (median, relative errors, maxima in float64) against the old
compare_outputs, and the peak device memory on CUDA: the judge makes float64 copies of the
candidate, the baseline and the truth, so ~8 x 8 bytes per element at its peak.
"""

from __future__ import annotations

import argparse
import time

import torch

from pkb_tui.engine.compare import compare_outputs, judge_outputs
from tasks.base import DEFAULT_TOLERANCES


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--numel", type=int, default=64 * 1024 * 1024 + 13)  # all_reduce's default size
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    truth = torch.randn(args.numel, dtype=torch.float64, device=device)
    expected = truth.to(torch.bfloat16)
    candidate = expected.clone()

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(args.repeat):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            result = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
            assert result.correct
        return best * 1e3

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    judge_ms = timed(lambda: judge_outputs(candidate, expected, truth, {}))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    old_ms = timed(lambda: compare_outputs(candidate, expected, DEFAULT_TOLERANCES["bfloat16"]))
    print(f"{args.device}, {args.numel:,} bf16 elements: judge_outputs {judge_ms:.1f} ms, "
          f"compare_outputs {old_ms:.1f} ms, peak device memory {peak:.2f} GiB")


if __name__ == "__main__":
    main()
