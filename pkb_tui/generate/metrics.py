"""pass@k and fast_p@k with the unbiased estimator (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code"): with n samples of which c pass, the chance that at least one of k drawn
without replacement passes is 1 - C(n-c, k) / C(n, k). fast_p@k counts as passing a sample that is
correct and more than p times faster than the baseline (ParallelKernelBench's fast_p), by the
project's one rule (store.faster.counts_as_faster): the interval, widened by the host's noise
floor, clears p, not the point alone.

A sample's outcome is that of its whole refine chain: correct when any round was correct, its
speedup the best correct round's, and it is faster than p when any correct round's is
(`up_to_round` cuts the chain, for "pass@k after r rounds").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pkb_tui.store.faster import row_counts_as_faster


def pass_at_k(n: int, c: int, k: int) -> float | None:
    """Unbiased pass@k; None when k > n (not estimable from n samples)."""
    if n < 1 or k < 1 or k > n:
        return None
    if not 0 <= c <= n:
        raise ValueError(f"c must be within 0..n (n={n}, c={c})")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class SampleOutcome:
    task_id: str
    sample: int
    correct: bool
    speedup: float | None  # the best correct round's; None when never correct or not timed
    # each correct round's speedup, speedup_low, rounds, noise_floor_fraction and interval_floor (as its results row)
    timings: list[dict[str, Any]] = field(default_factory=list)

    def fast(self, p: float) -> bool:
        """Correct and faster than p in some round, by the interval (counts_as_faster)."""
        return self.correct and any(row_counts_as_faster(timing, p) for timing in self.timings)


@dataclass
class TaskMetrics:
    task_id: str
    n: int
    correct: int
    best_speedup: float | None
    pass_at: dict[int, float | None] = field(default_factory=dict)
    fast_at: dict[str, dict[int, float | None]] = field(default_factory=dict)  # "1.0" -> k -> value


def outcomes_from_candidates(candidates: Iterable[dict[str, Any]], *, up_to_round: int | None = None) -> list[SampleOutcome]:
    """Fold candidate rows (task_id, sample, round, correct, speedup and, where measured, speedup_low,
    rounds, noise_floor_fraction) into one outcome per sample."""
    chains: dict[tuple[str, int], SampleOutcome] = {}
    for row in candidates:
        if up_to_round is not None and row["round"] > up_to_round:
            continue
        key = (row["task_id"], row["sample"])
        outcome = chains.setdefault(key, SampleOutcome(row["task_id"], row["sample"], False, None))
        if row.get("correct"):
            outcome.correct = True
            speedup = row.get("speedup")
            outcome.timings.append({key: row.get(key) for key in ("speedup", "speedup_low", "rounds", "noise_floor_fraction",
                                                                    "interval_floor")})
            if speedup is not None and (outcome.speedup is None or speedup > outcome.speedup):
                outcome.speedup = speedup
    return list(chains.values())


def task_metrics(outcomes: list[SampleOutcome], ks: Iterable[int], ps: Iterable[float] = (1.0,)) -> dict[str, TaskMetrics]:
    by_task: dict[str, list[SampleOutcome]] = {}
    for outcome in outcomes:
        by_task.setdefault(outcome.task_id, []).append(outcome)
    ks, ps = list(ks), list(ps)
    out: dict[str, TaskMetrics] = {}
    for task_id, samples in sorted(by_task.items()):
        n = len(samples)
        c = sum(s.correct for s in samples)
        speedups = [s.speedup for s in samples if s.correct and s.speedup is not None]
        metrics = TaskMetrics(task_id, n, c, max(speedups) if speedups else None)
        metrics.pass_at = {k: pass_at_k(n, c, k) for k in ks}
        for p in ps:
            fast = sum(1 for s in samples if s.fast(p))
            metrics.fast_at[f"{p:g}"] = {k: pass_at_k(n, fast, k) for k in ks}
        out[task_id] = metrics
    return out


def suite_mean(per_task: dict[str, TaskMetrics], k: int, p: float | None = None) -> float | None:
    """The mean over tasks of pass@k (or fast_p@k); tasks where k exceeds the samples are left out."""
    values = [
        (m.pass_at.get(k) if p is None else m.fast_at.get(f"{p:g}", {}).get(k))
        for m in per_task.values()
    ]
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def fast_p_curve(outcomes: list[SampleOutcome], ps: Iterable[float]) -> list[tuple[float, float]]:
    """(p, share of samples correct and faster than p) over the suite: the fast_p-vs-p plot."""
    total = len(outcomes)
    if not total:
        return []
    return [(p, sum(1 for o in outcomes if o.fast(p)) / total) for p in ps]
