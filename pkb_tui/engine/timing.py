"""The one timing function. Its clocks are bound when this module is imported, which the worker
does before it imports any candidate: a candidate that patches time.perf_counter_ns,
torch.cuda.Event or torch.cuda.synchronize afterwards changes nothing measured here.

GPU: a device event pair around every iteration; the whole device is synchronized before the
closing event, so work a variant hides on other streams is counted. CPU: a monotonic clock.
Ranks are aligned by a barrier (on the control group) before every iteration, outside the timed
window. The reported figure is, per iteration, the slowest rank; then median and spread over
iterations. The worker times baseline and candidate in alternating blocks (``split_rounds``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

_perf_counter_ns = time.perf_counter_ns
_cuda_event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_synchronize = torch.cuda.Event.synchronize
_event_elapsed_ms = torch.cuda.Event.elapsed_time
_cuda_synchronize = torch.cuda.synchronize


# Interleaved timing: the variants of an item take turns in this many blocks (see worker).
ROUNDS = 5


def split_rounds(iterations: int, rounds: int) -> list[int]:
    """``iterations`` split into at most ``rounds`` blocks as even as can be, the larger first."""
    rounds = max(1, min(rounds, iterations))
    base, extra = divmod(iterations, rounds)
    return [base + (1 if k < extra else 0) for k in range(rounds)]


@dataclass
class TimingStats:
    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    min_us: float
    max_us: float
    iterations: int


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values, q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_per_rank: list[list[float]]) -> TimingStats:
    """Per iteration the slowest rank, then statistics over iterations."""
    iterations = min(len(s) for s in samples_per_rank)
    slowest = sorted(max(s[i] for s in samples_per_rank) for i in range(iterations))
    return TimingStats(
        median_us=percentile(slowest, 50), p10_us=percentile(slowest, 10), p90_us=percentile(slowest, 90),
        mean_us=sum(slowest) / iterations, min_us=slowest[0], max_us=slowest[-1], iterations=iterations,
    )


def time_iterations(
    call: Callable[[int], Any], *, iterations: int, warmup: int, device: torch.device,
    barrier: Callable[[], None], keep_last: int = 0,
    on_start: Callable[[], None] | None = None, between: Callable[[], None] | None = None,
) -> tuple[list[float], list[Any]]:
    """Run call(i) warmup + iterations times; return per-iteration microseconds and the outputs of
    the last ``keep_last`` timed iterations (so the caller can check them).

    ``on_start`` runs once after the warm-up, the device idle; ``between`` after every timed
    iteration, outside its timed window with the device idle (the byte counters use both).
    """
    on_gpu = device.type == "cuda"
    for i in range(warmup):
        call(i)
    if on_gpu:
        _cuda_synchronize(device)
    if on_start is not None:
        on_start()
    samples_us: list[float] = []
    kept: list[Any] = []
    for i in range(iterations):
        barrier()
        if on_gpu:
            start, end = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
            _event_record(start)
            out = call(i)
            _cuda_synchronize(device)
            _event_record(end)
            _event_synchronize(end)
            samples_us.append(_event_elapsed_ms(start, end) * 1000.0)
        else:
            t0 = _perf_counter_ns()
            out = call(i)
            samples_us.append((_perf_counter_ns() - t0) / 1000.0)
        if between is not None:
            between()
        if i >= iterations - keep_last:
            kept.append(out)
        else:
            del out
    return samples_us, kept
