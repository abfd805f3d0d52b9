"""Timing arithmetic of the judge (engine.worker), kept apart so it can be tested on its own.

The judge times a *block* of calls (each on fresh inputs) with its own clock, from the command to
the runner's answer, with the runner's harness cost (a block of null calls that only store
outputs, on the trusted baseline runner) subtracted: per call = (wall - overhead) / calls. The
runner's own device-event figure for the block is never the verdict; ``reconcile`` only checks
that it could be true (a runner whose report is impossible was tampered with).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# A runner's report may exceed the judge's wall time around it by this much (clock granularity).
REPORT_SLACK_US = 50.0


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


def summarize(values: list[float]) -> TimingStats:
    """Median and spread of per-call figures (one per block)."""
    ordered = sorted(values)
    return TimingStats(
        median_us=percentile(ordered, 50), p10_us=percentile(ordered, 10), p90_us=percentile(ordered, 90),
        mean_us=sum(ordered) / len(ordered), min_us=ordered[0], max_us=ordered[-1], iterations=len(ordered),
    )


def per_call_us(wall_us: float, overhead_us: float, calls: int) -> float:
    """One call's time in a block the judge timed: the harness's share subtracted, never below 0."""
    return max(0.0, wall_us - overhead_us) / max(1, calls)


def reconcile(wall_us: float, reported_us: float, overhead_us: float) -> bool:
    """Could a runner's report of a block's device time be true, given the judge's wall time?

    Never more than the wall time around it; never a small fraction of the block minus the
    harness's share. The lower bound is loose on purpose: a runner descheduled on a loaded CPU
    reports less than the judge waited, and the verdict never rests on this figure anyway."""
    if not math.isfinite(reported_us) or reported_us < 0:
        return False
    if reported_us > wall_us + REPORT_SLACK_US:
        return False
    return reported_us >= 0.2 * (wall_us - 2.0 * overhead_us) - 5_000.0
