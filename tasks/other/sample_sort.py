"""Distributed sample sort (parallel sorting by regular sampling): splitters from gathered samples,
then one all-to-all with data-dependent, uneven splits.

Signature: sample_sort(keys: [N_r]) -> bucket: [M_r] (sorted; M_r depends on the data)

Each rank holds N_r keys (N_r differs per rank; rank r's keys are also shifted by 0.3*r, so the data
is skewed across ranks as real shards are). Each rank sorts its keys and takes s = SAMPLES_PER_RANK
regular samples (positions (2i+1)*N_r // 2s: PSRS's regular sampling, oversampled as GPU sample
sorts do, since PSRS's n samples per rank leave buckets up to twice the mean); the n*s samples are
all-gathered and sorted, and splitter k (k = 1..n-1) is sample k*s of them. Key x belongs to bucket
#{splitters < x} (ties with a splitter stay below it). Rank q returns bucket q, sorted: together
the buckets are the sorted concatenation of all keys. Bucket sizes are exchanged first (all-to-all
of n counts), then the keys (all_to_all_single with those splits).
"""

from __future__ import annotations

import torch

from tasks import _comm
from tasks.base import EXACT_OUTPUT, TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

SAMPLES_PER_RANK = 64

TASK = TaskSpec(
    id="sample_sort",
    title="Distributed sample sort (PSRS: regular samples, splitters, uneven all-to-all)",
    family="other",
    source="Parallel Sorting by Regular Sampling (Shi & Schaeffer, 1992), oversampled; distributed sort in "
           "Dask-cuDF / cuDF and HykSort; MoE token sorting by expert",
    why="The splits depend on the data, so every rank must learn its receive counts before the "
        "exchange: a latency-bound count exchange followed by a bandwidth-bound irregular all-to-all.",
    # Keys per rank (about; ranks hold different counts). default: 512M keys over 8 GPUs.
    sizes={
        "small": {"keys_per_rank": 1201},
        "default": {"keys_per_rank": 64 * 1024 * 1024 + 3},
        "large": {"keys_per_rank": 256 * 1024 * 1024 + 5},
    },
    dtypes=("float32", "bfloat16", "float64"),
    # Sorting moves keys and never computes new ones: bit-exact in every dtype.
    tolerances={name: Tolerance(atol=0.0, rtol=0.0) for name in ("float32", "bfloat16", "float64")},
    output_tolerances={"*": EXACT_OUTPUT},  # the float64 baseline moves/selects the same values: exact
)


def _keys_on(rank: int, params: dict) -> int:
    base = params["keys_per_rank"]
    return base + (rank * 7919) % (base // 4 + 1)  # uneven, fixed by the rank


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor]:
    keys = ctx.randn(_keys_on(ctx.rank, ctx.params), stream=0, dtype=torch.float32) + 0.3 * ctx.rank
    return (keys.to(ctx.dtype),)


def _regular_samples(sorted_keys: torch.Tensor) -> torch.Tensor:
    length, s = sorted_keys.numel(), SAMPLES_PER_RANK
    positions = torch.tensor([(2 * i + 1) * length // (2 * s) for i in range(s)], device=sorted_keys.device)
    return sorted_keys[positions]


def _splitters(all_samples: torch.Tensor, n: int) -> torch.Tensor:
    ordered = torch.sort(all_samples).values
    positions = torch.arange(1, n, device=ordered.device) * SAMPLES_PER_RANK
    return ordered[positions]


def baseline(keys: torch.Tensor) -> torch.Tensor:
    n = torch.distributed.get_world_size()
    local = torch.sort(keys).values
    all_samples = torch.empty(n * SAMPLES_PER_RANK, dtype=keys.dtype, device=keys.device)
    _comm.all_gather_single(all_samples, _regular_samples(local))
    splitters = _splitters(all_samples, n)

    # Keys <= splitter k end before position searchsorted(..., right=True): bucket boundaries.
    ends = torch.searchsorted(local, splitters, right=True)
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device=keys.device), ends,
                        torch.full((1,), local.numel(), dtype=torch.int64, device=keys.device)])
    send_counts = bounds.diff()
    recv_counts = torch.empty_like(send_counts)
    _comm.all_to_all_single(recv_counts, send_counts)

    recv_splits = recv_counts.tolist()
    bucket = torch.empty(sum(recv_splits), dtype=keys.dtype, device=keys.device)
    _comm.all_to_all_single(bucket, local, recv_splits, send_counts.tolist())
    return torch.sort(bucket).values  # n sorted runs: a merge in real code


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    n = len(inputs_per_rank)
    keys = [inputs[0] for inputs in inputs_per_rank]
    samples = torch.cat([_regular_samples(torch.sort(k).values) for k in keys])
    splitters = _splitters(samples, n)
    everything = torch.cat(keys)
    bucket_of = torch.bucketize(everything, splitters, right=False)  # #{splitters < x}
    return [torch.sort(everything[bucket_of == q]).values for q in range(n)]


def traffic(ctx: TaskContext) -> Traffic:
    # Data-dependent; the model is the expectation: regular sampling gives buckets of ~N/n keys
    # (N = all keys), so a rank sends the (n-1)/n of its keys that belong elsewhere and receives
    # (n-1)/n of its bucket's. Plus the samples all-gathered and n int64 counts exchanged.
    # nccl-tests all-to-all: payload the rank's keys, factor (n-1)/n. Memory: local sort (read,
    # write), send read, bucket written, final merge read and written: ~6 passes over the keys.
    n, r = ctx.world_size, ctx.rank
    b = ctx.dtype.itemsize
    mine = _keys_on(r, ctx.params)
    bucket = sum(_keys_on(q, ctx.params) for q in range(n)) // n
    extra = (n - 1) * (SAMPLES_PER_RANK * b + 8)
    send = (n - 1) * mine * b // n + extra
    recv = (n - 1) * bucket * b // n + extra
    return Traffic(
        send_bytes=send, recv_bytes=recv, memory_bytes=3 * (mine + bucket) * b,
        payload_bytes=mine * b, bus_factor=bus_factor("all_to_all", n),
    )
