"""Statistics of interleaved timings: a variant's figures, the speedup with a confidence interval,
whether a speedup is within the box's noise, and when to stop timing.

Input shape (what the worker measures per method, eager or graph): ``rounds[r]`` is the list of
per-call times in microseconds of round r, the slowest rank's figure per call. Baseline and
candidate take turns (B C, C B, B C, ...), so round r of the baseline and round r of the candidate
were measured back to back and share whatever the box was doing then.

The speedup interval pairs by round (see ``speedup_interval``). Pure Python on purpose: the
worker calls ``next_round_needed`` between rounds on GPU boxes that have torch but maybe no numpy.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pkb_tui.store import faster

Rounds = Sequence[Sequence[float]]

# The location of one round's samples: "median" by default. "p25" (the first quartile) follows
# the fast mode of a bimodal clock (gloo on a loaded CPU box: a call either gets the core or
# waits a scheduler tick) where the median flips between modes from round to round;
# bench/stats_round_statistic.py measures which is steadier. "trimmed": mean of the middle 50%.
ROUND_STATISTICS = ("median", "p25", "trimmed")
CPU_ROUND_STATISTIC = "p25"  # chosen by bench/stats_round_statistic.py on the 2-core dev VM (see docs)
DEFAULT_TARGET_HALF_WIDTH = 0.02  # stop timing once the interval is within +-2% of the speedup
MIN_ROUNDS = 6  # the fewest rounds whose order statistics bound the median at 95% (see below)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of already sorted values, q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def round_location(samples: Sequence[float], statistic: str = "median") -> float:
    """One round's typical per-call time by ``statistic`` (one of ROUND_STATISTICS)."""
    if not samples:
        raise ValueError("a round with no samples has no location")
    values = sorted(samples)
    if statistic == "median":
        return percentile(values, 50)
    if statistic == "p25":
        return percentile(values, 25)
    if statistic == "trimmed":
        cut = len(values) // 4
        middle = values[cut: len(values) - cut] or values
        return sum(middle) / len(middle)
    raise ValueError(f"unknown round statistic {statistic!r}; choose one of {', '.join(ROUND_STATISTICS)}")


@dataclass
class VariantTiming:
    """A variant's figures over every sample of every round (the results row's time columns)."""

    median_us: float
    p10_us: float
    p90_us: float
    mean_us: float
    min_us: float
    max_us: float
    samples: int
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_rounds(rounds: Rounds) -> VariantTiming:
    """Median and spread of a variant, pooled over its rounds."""
    pooled = sorted(float(x) for r in rounds for x in r)
    if not pooled:
        raise ValueError("no timing samples to summarize")
    return VariantTiming(
        median_us=percentile(pooled, 50), p10_us=percentile(pooled, 10), p90_us=percentile(pooled, 90),
        mean_us=sum(pooled) / len(pooled), min_us=pooled[0], max_us=pooled[-1],
        samples=len(pooled), rounds=sum(1 for r in rounds if len(r)),
    )


@dataclass
class SpeedupEstimate:
    """baseline time / candidate time: the point estimate and a confidence interval."""

    point: float
    low: float
    high: float
    method_note: str
    rounds: int
    confidence: float  # the interval's nominal confidence (what was asked)

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the point: 0.02 reads "+-2%"."""
        return (self.high - self.low) / (2.0 * self.point) if self.point > 0 else math.inf

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2.0**n


def min_rounds(confidence: float = 0.95) -> int:
    """The fewest rounds whose smallest and largest per-round ratios bound the median ratio with
    at least ``confidence`` (6 at 95%: 1 - 2 / 2**6 = 0.969)."""
    n = 1
    while 1.0 - 2.0 * _binom_cdf_half(0, n) < confidence:
        n += 1
    return n


def _median_interval(sorted_values: list[float], confidence: float) -> tuple[float, float]:
    """Distribution-free interval for the median of i.i.d. values (the sign test inverted), with
    Hettmansperger & Sheather's (1986) interpolation between neighbouring order statistics so the
    coverage is close to ``confidence`` rather than the next binomial step above it."""
    n = len(sorted_values)
    # coverage of [x_(k), x_(n-k+1)] (1-indexed) is P(k <= X <= n-k) = 1 - 2 P(X <= k-1)
    def coverage(k: int) -> float:
        return 1.0 - 2.0 * _binom_cdf_half(k - 1, n)

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    lower, upper = sorted_values[k - 1], sorted_values[n - k]
    if k + 1 <= (n + 1) // 2:
        g_k, g_k1 = coverage(k), coverage(k + 1)
        if g_k > g_k1 and g_k > confidence:
            share = (g_k - confidence) / (g_k - g_k1)
            lam = (n - k) * share / (k + (n - 2 * k) * share)
            lower = (1 - lam) * sorted_values[k - 1] + lam * sorted_values[k]
            upper = (1 - lam) * sorted_values[n - k] + lam * sorted_values[n - k - 1]
    return lower, upper


def speedup_interval(
    baseline_rounds: Rounds, candidate_rounds: Rounds, *, confidence: float = 0.95, seed: int = 0,
    resamples: int = 2000, statistic: str = "median",
) -> SpeedupEstimate:
    """The candidate's speedup over the baseline, with a ``confidence`` interval.

    Paired by round: d_r = log(loc(baseline round r) / loc(candidate round r)), loc the round's
    median (or ``statistic``). Baseline and candidate of one round ran back to back, so whatever
    drifts slower than a round (clocks, temperature, another job on the box) multiplies both and
    cancels in d_r; pooling all samples instead (a ratio of overall medians) would put that drift
    into the noise and, if the load changed while one variant had more rounds behind it, into the
    answer. Alternating the order (B C, C B) cancels what changes within a round.

    The point is exp(median of d_r); the interval is the distribution-free interval for that
    median (the sign test inverted: order statistics of d_r, interpolated), which assumes only
    that rounds are independent. Its coverage holds for bimodal or heavy-tailed round ratios
    (gloo on a loaded CPU box), where a t interval or a mean would be pulled by a few bad rounds.
    Fewer rounds than ``min_rounds(confidence)`` (6 at 95%) cannot bound a median at that
    confidence; then the interval comes from a bootstrap that resamples calls within each round
    (``resamples`` draws, ``seed``), which covers call-to-call noise but not round-to-round
    drift, and ``method_note`` says so.
    """
    if len(baseline_rounds) != len(candidate_rounds):
        raise ValueError(f"{len(baseline_rounds)} baseline rounds but {len(candidate_rounds)} candidate rounds: rounds pair up")
    pairs = [(list(b), list(c)) for b, c in zip(baseline_rounds, candidate_rounds) if len(b) and len(c)]
    if not pairs:
        raise ValueError("no round has samples of both variants")
    if any(x <= 0 for b, c in pairs for x in (*b, *c)):
        raise ValueError("per-call times must be positive")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")

    logs = sorted(math.log(round_location(b, statistic) / round_location(c, statistic)) for b, c in pairs)
    point = math.exp(statistics.median(logs))
    n = len(logs)
    if n >= min_rounds(confidence):
        low, high = _median_interval(logs, confidence)
        note = (f"median of {n} per-round ratios ({statistic} per round, paired by round); "
                f"{confidence:.0%} sign-test interval over rounds")
        return SpeedupEstimate(point, math.exp(low), math.exp(high), note, n, confidence)

    rng = random.Random(seed)
    draws: list[float] = []
    for _ in range(resamples):
        resampled = []
        for b, c in pairs:
            rb = [b[rng.randrange(len(b))] for _ in b]
            rc = [c[rng.randrange(len(c))] for _ in c]
            resampled.append(math.log(round_location(rb, statistic) / round_location(rc, statistic)))
        draws.append(statistics.median(resampled))
    draws.sort()
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = percentile(draws, tail), percentile(draws, 100.0 - tail)
    note = (f"only {n} round(s): {confidence:.0%} bootstrap over calls within each round "
            f"({resamples} resamples); round-to-round drift is not in this interval")
    return SpeedupEstimate(point, math.exp(min(low, math.log(point))), math.exp(max(high, math.log(point))), note, n,
                           confidence)


def within_noise(estimate: SpeedupEstimate, noise_floor_fraction: float | None) -> bool:
    """True when this box's own noise could explain the speedup: the interval reaches into
    [1/(1+f), 1+f], f the host's self-check spread (calibrate's noise floor). Without a measured
    floor (None) the test is whether the interval contains 1.0. (store.faster holds the rule.)"""
    return bool(faster.within_noise(estimate.low, estimate.high, noise_floor_fraction))


def clears(estimate: SpeedupEstimate | None, threshold: float, noise_floor_fraction: float | None = None) -> bool:
    """Faster than ``threshold`` with confidence: the interval's lower end, widened by the host's
    noise floor, is above it (the leaderboard's fast_1 / fast_1.5 rule, store.faster)."""
    return estimate is not None and faster.counts_as_faster(estimate.point, estimate.low, threshold, has_interval=True,
                                                            noise_floor=noise_floor_fraction)


@dataclass
class RoundDecision:
    more: bool  # time another round (one baseline block and one candidate block)
    reason: str
    rounds: int
    estimate: SpeedupEstimate | None


def next_round_needed(
    baseline_rounds: Rounds, candidate_rounds: Rounds, *, elapsed_s: float, budget_s: float,
    target_half_width: float = DEFAULT_TARGET_HALF_WIDTH, least_rounds: int | None = None,
    max_rounds: int = 200, confidence: float = 0.95, statistic: str = "median",
) -> RoundDecision:
    """Should the worker time another round? Pure: it sees the rounds so far and the clock.

    Yes until there are at least ``least_rounds`` (default min_rounds(confidence): enough for the sign-test interval) and
    the interval's relative half-width is at most ``target_half_width``; no once ``max_rounds``
    are done or another round (estimated as the mean round so far) would overrun ``budget_s``.
    The worker stores ``rounds`` with the result whichever way it stopped.
    """
    rounds = min(len(baseline_rounds), len(candidate_rounds))
    least = least_rounds if least_rounds is not None else min_rounds(confidence)
    estimate = None
    if rounds >= least or rounds >= max_rounds or (rounds and elapsed_s + elapsed_s / rounds > budget_s):
        try:
            estimate = speedup_interval(baseline_rounds[:rounds], candidate_rounds[:rounds], confidence=confidence,
                                        statistic=statistic, resamples=200)
        except ValueError:
            estimate = None
    if rounds >= max_rounds:
        return RoundDecision(False, f"stopped at the round limit ({max_rounds})", rounds, estimate)
    per_round_s = elapsed_s / rounds if rounds else 0.0
    if rounds and elapsed_s + per_round_s > budget_s:
        width = f"+-{estimate.relative_half_width:.1%}" if estimate else "no interval"
        return RoundDecision(False, f"time budget ({budget_s:g} s) spent after {rounds} rounds ({width})", rounds, estimate)
    if rounds < least:
        return RoundDecision(True, f"{rounds} of at least {least} rounds", rounds, estimate)
    if estimate is not None and estimate.relative_half_width <= target_half_width:
        return RoundDecision(False, f"interval within +-{target_half_width:.0%} after {rounds} rounds", rounds, estimate)
    return RoundDecision(True, "interval still wider than the target", rounds, estimate)


def noise_floor_for(row: dict[str, Any] | None, basis: str) -> float | None:
    """The host's noise floor for the timing method ``basis`` from a noise_floor calibration row
    (Store.latest_noise_floor): the eager floor is the row's column, the graph floor its detail's.
    A row from before the graph floor was kept, or a host where no self-check was capturable,
    gives the graph basis the eager floor: eager is the noisier method in the H200 self-check
    (medians within 3%: eager 3/35, graph 23/28), so the likely wider, conservative pick. None
    without a row."""
    if not row:
        return None
    eager = row.get("noise_floor_fraction")
    if basis == "graph":
        graph = (row.get("detail") or {}).get("graph_noise_floor_fraction")
        return graph if graph is not None else eager
    return eager


def widened(estimate: SpeedupEstimate, floor: float | None) -> SpeedupEstimate:
    """``estimate``'s interval with the host's between-process spread folded in: each side's
    distance from the point (in log space) and ln(1 + floor) combined in quadrature. The rounds
    sample what varies from round to round, not what differs steadily between two processes
    running the same code (H100, 2026-12-06, the gate's self-check: 29 graph medians within 1.6%
    of 1.0, their rounds' intervals +-0.05-0.5%, holding 1.0 for 6 of 29); the floor, the largest
    distance from 1.0 of the host's own self-check (calibrate), stands for that spread. From the
    other 28 tasks of that run (leave one out), 28 of 29 widened intervals held 1.0. None or 0:
    unchanged."""
    if not floor or floor <= 0 or estimate.point <= 0:
        return estimate
    spread = math.log1p(floor)
    low_side = math.log(estimate.point / estimate.low) if estimate.low > 0 else math.inf
    high_side = math.log(estimate.high / estimate.point) if estimate.high > 0 else 0.0
    low = estimate.point * math.exp(-math.hypot(low_side, spread)) if math.isfinite(low_side) else estimate.low
    high = estimate.point * math.exp(math.hypot(high_side, spread))
    return SpeedupEstimate(point=estimate.point, low=low, high=high, rounds=estimate.rounds,
                           confidence=estimate.confidence,
                           method_note=f"{estimate.method_note}; widened by this host's spread between processes "
                                       f"(+-{floor:.1%}, calibrate)")


def noise_floor_from_selfchecks(estimates: Sequence[SpeedupEstimate]) -> float | None:
    """A host's noise floor from baseline-vs-itself runs, as a fraction (0.03: +-3%), or None.

    The least spread between processes with which every self-check's interval, widened by it as
    ``widened`` does (in quadrature, log space), holds 1.0: per self-check, the distance of its
    point from 1.0 beyond what its own rounds' interval already covers. A self-check whose rounds
    hold 1.0 asks for nothing; one read without an interval (low = high = point) asks for its whole
    distance from 1.0. The intervals must be the rounds' alone (calibrate's runs fold in no floor).
    """
    needs = []
    for e in estimates:
        if e is None or e.point <= 0:
            continue
        distance = abs(math.log(e.point))
        facing = e.low if e.point > 1.0 else e.high  # the interval's side towards 1.0
        covered = abs(math.log(e.point / facing)) if facing and facing > 0 else 0.0
        needs.append(math.sqrt(max(0.0, distance * distance - covered * covered)))
    if not needs:
        return None
    return math.expm1(max(needs))


@dataclass
class MethodRounds:
    """One timing method's samples for a run (the worker's contract): absent with a reason."""

    baseline_rounds: list[list[float]] | None = None
    candidate_rounds: list[list[float]] | None = None
    note: str | None = None  # e.g. "not capturable: the candidate synchronizes the host"


def timing_result_fields(
    eager: MethodRounds, graph: MethodRounds | None = None, *, basis: str = "eager",
    noise_floor_fraction: float | None = None, confidence: float = 0.95, statistic: str = "median",
    seed: int = 0, interval_floors: dict[str, float | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """The results-row timing columns for both variants, {variant: {column: value}}.

    median_us / p10..max_us / speedup / speedup_low / speedup_high / within_noise hold the figure of
    ``basis`` (eager or graph; the user's pick); eager_* and graph_* keep both. Roofline columns are
    the launcher's (it evaluates them on median_us). ``interval_floors``: per method, the host's
    calibrated floor folded into that method's interval (``widened``); the basis's goes in
    interval_floor, and within_noise is then whether the widened interval holds 1.0 (the floor is
    not applied twice). Without one, the rounds' interval, judged against ``noise_floor_fraction``.
    """
    if basis not in ("eager", "graph"):
        raise ValueError(f"unknown speedup basis {basis!r}; choose eager or graph")
    out: dict[str, dict[str, Any]] = {"baseline": {"timing_method": basis}, "candidate": {"timing_method": basis}}
    estimates: dict[str, SpeedupEstimate | None] = {}
    for name, method in (("eager", eager), ("graph", graph)):
        if method is None:
            continue
        if name == "graph":
            for fields in out.values():
                fields["graph_note"] = method.note
        for variant, rounds in (("baseline", method.baseline_rounds), ("candidate", method.candidate_rounds)):
            if not rounds or not any(len(r) for r in rounds):
                continue
            figures = summarize_rounds(rounds)
            fields = out[variant]
            fields.update({f"{name}_median_us": figures.median_us, f"{name}_p10_us": figures.p10_us,
                           f"{name}_p90_us": figures.p90_us})
            if name == basis:
                fields.update(median_us=figures.median_us, p10_us=figures.p10_us, p90_us=figures.p90_us,
                              mean_us=figures.mean_us, min_us=figures.min_us, max_us=figures.max_us,
                              iterations=figures.samples, rounds=figures.rounds)
        estimate = None
        if method.baseline_rounds and method.candidate_rounds:
            try:
                estimate = speedup_interval(method.baseline_rounds, method.candidate_rounds, confidence=confidence,
                                            statistic=statistic, seed=seed)
            except ValueError:
                estimate = None
        floor_in = (interval_floors or {}).get(name)
        if estimate is not None and floor_in:
            estimate = widened(estimate, floor_in)
        estimates[name] = estimate
        if estimate is not None:
            out["candidate"].update({f"speedup_{name}": estimate.point, f"speedup_{name}_low": estimate.low,
                                     f"speedup_{name}_high": estimate.high})
    picked = estimates.get(basis)
    floor_in = (interval_floors or {}).get(basis) or None
    if picked is not None:
        out["candidate"].update(speedup=picked.point, speedup_low=picked.low, speedup_high=picked.high,
                                within_noise=int(within_noise(picked, None if floor_in else noise_floor_fraction)),
                                speedup_note=picked.method_note)
    out["candidate"]["noise_floor_fraction"] = noise_floor_fraction
    out["candidate"]["interval_floor"] = floor_in if picked is not None else None
    return out


def round_statistic_for(mode: str) -> str:
    """The per-round statistic a mode's speedups use: p25 in cpu mode (steadier on gloo's bimodal
    clock, see CPU_ROUND_STATISTIC), the median elsewhere."""
    return CPU_ROUND_STATISTIC if mode == "cpu" else "median"
