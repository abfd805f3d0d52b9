"""What the basic collectives share: tolerances and named sizes.

Sums over ranks: a sum over n ranks rounds n-1 times in the working dtype (NCCL and gloo
accumulate in it), and the partial sums of n randn values reach ~6*sqrt(n) in the tails of 1e8 elements, so the absolute error
grows like (n-1) * unit roundoff * |partial sum| however small the final sum is. Measured at n=8
over 3.2e7 elements, sequential (ring) and pairwise (tree) orders and fp32-accumulate-then-round:
worst |error| - 0.03*|ref| = 0.056 in bfloat16, 0.0069 in float16 (float32: 2e-6). The atol below
is about twice that, sized for up to 8 ranks; a dropped or doubled contribution (an O(1) error on
most elements) is still far outside it.
"""

from __future__ import annotations

from tasks.base import EXACT_OUTPUT, OutputTolerance, Tolerance

SUM_OVER_RANKS_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=1e-5, rtol=1e-5),
    "float16": Tolerance(atol=1.5e-2, rtol=5e-3),
    "bfloat16": Tolerance(atol=1e-1, rtol=3e-2),
}

# Pure data movement (gather, scatter, broadcast, all-to-all) must be bit-exact in every dtype.
EXACT_TOLERANCES: dict[str, Tolerance] = {
    name: Tolerance(atol=0.0, rtol=0.0) for name in ("float32", "float16", "bfloat16", "float64")
}

# The same for the judge's per-output tolerances (tasks.base.OutputTolerance): the float64 run of
# the baseline moves the same values, so its error is zero and the candidate's must be too.
EXACT_OUTPUTS: dict[str, OutputTolerance] = {"*": EXACT_OUTPUT}

# Sizes of the row-chunked collectives: rows_per_rank x cols per rank's chunk. Odd on purpose:
# chunking and vector-width bugs hide behind powers of two. default: ~34 MB float32 per chunk.
CHUNKED_SIZES: dict[str, dict[str, int]] = {
    "small": {"rows_per_rank": 37, "cols": 129},
    "default": {"rows_per_rank": 4099, "cols": 2049},
    "large": {"rows_per_rank": 16387, "cols": 4099},
}

# Sizes of the flat (1-D) collectives, as all_reduce.
FLAT_SIZES: dict[str, dict[str, int]] = {
    "small": {"numel": 10_007},
    "default": {"numel": 64 * 1024 * 1024 + 13},
    "large": {"numel": 512 * 1024 * 1024 + 7},
}
