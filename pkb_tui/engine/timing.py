"""Timing arithmetic of the judge (engine.worker), kept apart so it can be tested on its own.

The judge times a *block* of calls (each on fresh inputs) with its own clock, from the command to
the runner's answer, with the runner's harness cost (a block of null calls that only store
outputs, on the trusted baseline runner) subtracted: per call = (wall - overhead) / calls. The
runner's own device-event figure for the block is never the verdict; ``reconcile`` only checks
that it could be true (a runner whose report is impossible was tampered with).
"""

from __future__ import annotations

import math

from pkb_tui.engine.stats import percentile

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
# call alone, on an input no block held. An honest candidate is about as much faster alone as in
# blocks: how much a block's pipelining (the host's launches overlapping the device) changes that
# differs between two codes by a small factor, so only a larger gap is taken for batching. On a
# GPU 2x; on CPU 3x, where gloo's clock makes a call alone read 0.4-1.4x of itself between two
# processes of the same code (the CPU box, 6 rounds).
BATCHED_LIMIT = {"cuda": 2.0, "cpu": 3.0}


def batched(block_us: tuple[float, float], single_us: tuple[float, float], calls: int, limit: float) -> str | None:
    """A sentence when the candidate's speedup in blocks of ``calls`` calls is more than ``limit``
    times its speedup one call at a time (and itself above ``limit``); None when the two agree or a
    call alone is not resolved. ``block_us``, ``single_us``: (baseline, candidate) per call, one
    statistic over the rounds, the harness's share subtracted."""
    (block_b, block_c), (single_b, single_c) = block_us, single_us
    if calls <= 1 or min(block_b, block_c, single_b, single_c) <= 0:
        return None  # a call alone within the harness's jitter (or no figure): nothing to compare
    in_blocks, alone = block_b / block_c, single_b / single_c
    if in_blocks > limit and in_blocks > limit * alone:
        return (f"timing inconsistent: {in_blocks:.1f}x the baseline's speed per call in blocks of {calls} calls "
                f"but {alone:.1f}x one call at a time; a runner that turns a block's calls into fewer operations "
                f"gains a speed no program whose next call waits for this one has")
    return None
