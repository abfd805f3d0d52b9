"""When a speedup counts as "faster": one rule for every score the project prints (the leaderboard,
PKB's per-problem fast_p, the generation loop's fast_p@k). Pure; the store and the generation
metrics import it, the engine's stats module holds the same arithmetic for live figures.

A measured speedup has an interval over its interleaved rounds, and the host has a noise floor
f (calibrate: how far the baseline timed against itself reads from 1.0, 0.03 = +-3%). The rounds'
interval does not hold everything that differs between two processes running the same code (the
allocator's addresses, which SMs and memory channels the copies land on): on the H200 VM a
baseline against itself in two runner processes read up to 2.7% apart with round-to-round spread
under 1%. So a candidate counts as faster than p only when its interval, widened by the floor,
clears p: low / (1 + f) > p. Rows from before intervals were measured are judged by their point.
Rows whose interval already holds the floor (interval_floor set: stats.widened folded it in when
the run was stored) are judged by the interval as it is: the floor is not applied twice.
"""

from __future__ import annotations


def within_noise(low: float | None, high: float | None, floor: float | None) -> int | None:
    """1 when the host's noise could explain the speedup: the interval reaches into [1/(1+f), 1+f];
    without a measured floor, whether it contains 1.0. None without an interval."""
    if low is None or high is None:
        return None
    f = max(0.0, floor or 0.0)
    return int(low <= 1.0 + f and high >= 1.0 / (1.0 + f))


def counts_as_faster(speedup: float | None, speedup_low: float | None, threshold: float, *, has_interval: bool,
                     noise_floor: float | None = None) -> bool:
    """Faster than ``threshold`` with confidence: the interval's lower end, widened by the host's
    noise floor, is above it. A row without an interval (has_interval False: measured before
    intervals were) is judged by its point."""
    if has_interval:
        f = max(0.0, noise_floor or 0.0)
        return speedup_low is not None and speedup_low / (1.0 + f) > threshold
    return speedup is not None and speedup > threshold


def floor_to_apply(row: dict) -> float | None:
    """The floor a results row's interval is still to be widened by: none where the interval holds
    it already (interval_floor), else the floor the run was judged against (noise_floor_fraction)."""
    return None if row.get("interval_floor") is not None else row.get("noise_floor_fraction")


def row_counts_as_faster(row: dict, threshold: float) -> bool:
    """counts_as_faster on a candidate's results row (speedup, speedup_low, rounds,
    noise_floor_fraction, interval_floor): a row has an interval when it counted rounds or stored a
    lower end."""
    low = row.get("speedup_low")
    return counts_as_faster(row.get("speedup"), low, threshold,
                            has_interval=row.get("rounds") is not None or low is not None,
                            noise_floor=floor_to_apply(row))
