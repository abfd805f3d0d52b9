"""Timing arithmetic of the judge (engine.worker), kept apart so it can be tested on its own.

The judge times a *block* of calls (each on fresh inputs) with its own clock, from the command to
the runner's answer, with the runner's harness cost (a block of null calls that only store
outputs, on the trusted baseline runner) subtracted: per call = (wall - overhead) / calls. The
runner's own device-event figure for the block is never the verdict; ``reconcile`` only checks
that it could be true (a runner whose report is impossible was tampered with).
"""

from __future__ import annotations

import math
from typing import Any

from pkb_tui.engine.stats import Rounds, SpeedupEstimate, min_rounds, percentile, round_location, speedup_interval

# A runner's report may exceed the judge's wall time around it by this much (clock granularity).
REPORT_SLACK_US = 50.0


def per_call_us(wall_us: float, overhead_us: float, calls: int) -> float:
    """One call's time in a block the judge timed: the harness's share subtracted, never below 0."""
    return max(0.0, wall_us - overhead_us) / max(1, calls)


def reconcile(blocks: list[tuple[float, float]], overhead_us: float) -> str | None:
    """Could a runner's reports of its blocks' device time be true, given the judge's wall times?

    ``blocks``: (wall_us, reported_us) per block, both from one rank. Impossible: a report above
    the wall time around it, or not a number. A lie: in most blocks, less than a tenth of what the
    block took beyond the harness's share. (Per block the lower bound would be unsafe: a runner
    descheduled on a loaded CPU reports far less than its judge waited, now and then.) The verdict
    never rests on these reports; a runner caught lying about them was tampered with.
    Returns None when they reconcile, else the sentence."""
    if not blocks:
        return None
    ratios = []
    for wall_us, reported_us in blocks:
        if not math.isfinite(reported_us) or reported_us < 0 or reported_us > wall_us + REPORT_SLACK_US:
            return f"reported {reported_us:.0f} us for a block the judge timed at {wall_us:.0f} us"
        ratios.append(reported_us / max(wall_us - overhead_us, 1.0))
    typical = percentile(sorted(ratios), 50)
    if typical < 0.1:
        return f"reported {100 * typical:.1f}% of the time the judge saw in a typical block"
    return None


# Blocks hold many calls so that the harness's share of a window is small; nothing but the runner
# (the candidate's process) sequences those calls, so a patched runner can turn a block into fewer
# operations (fixture adversarial/batch-calls: one all_reduce of the block's inputs laid end to end,
# every output right; 8.9x on the CPU box before this check). Each round therefore also times one
# call alone, on an input no block held, and ``batched`` compares the speedup in blocks with the
# speedup alone. The two differ for honest code too: in a block the host's launches overlap the
# device and a call's chain of dependent kernels runs without the launch latency between them, so
# a candidate of a few tiny kernels gains more in blocks than alone (H100, 2026-12-05: an honest
# handwritten all_gather read 11.6x in blocks against 2.6x alone; honest blocks/alone ratios
# 0.14-4.5). So two rules, each on the intervals (low end in blocks against high end alone):
# - the speedup is (almost) only in blocks: alone at most ALONE_AT_MOST, in blocks more than
#   BATCHED_LIMIT times that (2x on a GPU; 3x on CPU, where gloo reads a call alone 0.4-1.4x of
#   the same code in another process);
# - a gross gap: in blocks more than BATCHED_GROSS times the speedup alone, however fast alone.
BATCHED_LIMIT = {"cuda": 2.0, "cpu": 3.0}
ALONE_AT_MOST = 2.0
BATCHED_GROSS = 8.0
# A candidate's call alone at or below the harness's share reads 0 (per_call_us): as this, so its
# speedup alone is unbounded and nothing is flagged.
_RESOLVED_US = 1e-3


def paired_speedup(baseline: Rounds, candidate: Rounds, statistic: str = "median") -> SpeedupEstimate | None:
    """The speedup over rounds paired by index (stats.speedup_interval), a candidate's figure at or
    below the harness's share read as _RESOLVED_US; None with fewer rounds of both than bound a
    median at 95% (6), or where a round of the baseline is within the harness's jitter."""
    pairs = [([max(x, _RESOLVED_US) for x in b], [max(x, _RESOLVED_US) for x in c])
             for b, c in zip(baseline, candidate) if b and c]
    if len(pairs) < min_rounds() or any(round_location(b, statistic) <= _RESOLVED_US for b, _ in pairs):
        return None
    return speedup_interval([b for b, _ in pairs], [c for _, c in pairs], statistic=statistic)


def _gap(in_blocks: float, alone: float, limit: float) -> bool:
    """The rules above, on one figure in blocks and one alone (alone never read below 1x)."""
    bound = max(alone, 1.0)
    return (alone <= ALONE_AT_MOST and in_blocks > limit * bound) or in_blocks > BATCHED_GROSS * bound


def _estimates(block_rounds: tuple[Rounds, Rounds], single_rounds: tuple[Rounds, Rounds], calls: int,
               statistic: str) -> tuple[SpeedupEstimate, SpeedupEstimate] | None:
    if calls <= 1:
        return None  # a block of one call is its own call alone
    in_blocks, alone = paired_speedup(*block_rounds, statistic), paired_speedup(*single_rounds, statistic)
    return (in_blocks, alone) if in_blocks is not None and alone is not None else None


def batched(block_rounds: tuple[Rounds, Rounds], single_rounds: tuple[Rounds, Rounds], calls: int, limit: float,
            statistic: str = "median") -> str | None:
    """A sentence when the candidate's speedup in blocks of ``calls`` calls cannot come from the
    same calls one at a time (the rules above, low end in blocks against high end alone); None when
    it can, or when the figures cannot say (paired_speedup's None, a block of one call).
    ``block_rounds``, ``single_rounds``: (baseline, candidate) per-call times per round, the
    harness's share subtracted; paired by round as the verdict's own speedup is."""
    estimates = _estimates(block_rounds, single_rounds, calls, statistic)
    if estimates is None or not _gap(estimates[0].low, estimates[1].high, limit):
        return None
    in_blocks, alone = estimates
    return (f"timing inconsistent: {in_blocks.point:.1f}x [{in_blocks.low:.1f}, {in_blocks.high:.1f}] the baseline's "
            f"speed per call in blocks of {calls} calls but {alone.point:.1f}x [{alone.low:.1f}, {alone.high:.1f}] one "
            f"call at a time; a runner that turns a block's calls into fewer operations gains a speed no program "
            f"whose next call waits for this one has")


ALONE_NOTE = "the speedup of calls one at a time"  # how cap_at_alone's note begins (the screens show it)


def capped_at_alone(note: str | None) -> bool:
    """Whether a results row's speedup_note says its figure is the speed alone (cap_at_alone)."""
    return bool(note) and str(note).startswith(ALONE_NOTE)


def unconfirmed_in_blocks(block_rounds: tuple[Rounds, Rounds], single_rounds: tuple[Rounds, Rounds], calls: int,
                          limit: float, statistic: str = "median") -> SpeedupEstimate | None:
    """The speedup one call at a time where the one in blocks looks like batching and the intervals
    never decided (``batching_unresolved`` once the rounds are over); else None. What the run may
    claim then is the speed its calls showed alone: a runner that batches a block's calls, on a
    clock too noisy for its rounds (H100, 2026-12-06: adversarial/batch-calls at size small passed
    4.4x [1.75, 6.10] in blocks after 6 rounds), gains nothing from the noise."""
    estimates = _estimates(block_rounds, single_rounds, calls, statistic)
    if estimates is None:
        return None
    in_blocks, alone = estimates
    if _gap(in_blocks.point, alone.point, limit) and not _gap(in_blocks.low, alone.high, limit):
        return alone
    return None


def cap_at_alone(candidate: dict[str, Any], alone: SpeedupEstimate, basis: str, in_blocks_calls: int,
                 noise_floor_fraction: float | None = None) -> dict[str, Any]:
    """``candidate``'s results columns (stats.timing_result_fields) with every method's speedup
    above the speedup alone replaced by it (point and interval: widened as the columns' are, where
    interval_floor says they are), and a note that says why."""
    from pkb_tui.store import faster

    out = dict(candidate)
    capped = []
    for name in ("eager", "graph"):
        point = out.get(f"speedup_{name}")
        if point is None or point <= alone.point:
            continue
        capped.append(f"{name} {point:.2f}x [{out.get(f'speedup_{name}_low') or 0:.2f}, {out.get(f'speedup_{name}_high') or 0:.2f}]")
        out.update({f"speedup_{name}": alone.point, f"speedup_{name}_low": alone.low, f"speedup_{name}_high": alone.high})
    if not capped:
        return out
    if out.get(f"speedup_{basis}") is not None:
        out.update(speedup=out[f"speedup_{basis}"], speedup_low=out[f"speedup_{basis}_low"],
                   speedup_high=out[f"speedup_{basis}_high"],
                   within_noise=faster.within_noise(out[f"speedup_{basis}_low"], out[f"speedup_{basis}_high"],
                                                    faster.floor_to_apply({**out, "noise_floor_fraction": noise_floor_fraction})))
    out["speedup_note"] = (f"{ALONE_NOTE} ({alone.point:.2f}x [{alone.low:.2f}, {alone.high:.2f}]): "
                           f"in blocks of {in_blocks_calls} calls it read {', '.join(capped)}, which calls alone did not "
                           f"confirm within the timing budget (a runner that turns a block's calls into fewer "
                           f"operations gains that way; timing.batched)")
    return out


def batching_unresolved(block_rounds: tuple[Rounds, Rounds], single_rounds: tuple[Rounds, Rounds], calls: int,
                        limit: float, statistic: str = "median") -> bool:
    """True while the points meet one of ``batched``'s rules but its intervals do not decide yet:
    the judge then times more rounds (to its round limit and time budget), so a batching runner on
    a noisy clock is not let through for want of rounds (gloo on the 2-core box: calls alone of one
    code read 100-4,900 us, and six rounds bound nothing)."""
    return unconfirmed_in_blocks(block_rounds, single_rounds, calls, limit, statistic) is not None
