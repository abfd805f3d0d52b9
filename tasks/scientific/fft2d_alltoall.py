"""Distributed 2-D real-to-complex FFT over row slabs, with the all-to-all transpose in the middle.

Signature: fft2d_alltoall(x: [R_r, C], slab_rows: [n] int64) -> (real: [R, K_r], imag: [R, K_r])

The real field [R, C] is split into row slabs (rank r holds R_r rows; slab_rows, the same on every
rank, is the plan's distribution, as fftw_mpi_local_size gives it). The transform has K = C//2 + 1
columns, split as K//n columns per rank plus one more for the first K % n ranks. Each rank: real
FFT along its rows, all-to-all so that rank q gets every rank's rows of its column block, complex
FFT along the columns. Output: rank q's columns of torch.fft.rfft2(field, norm="ortho") (unitary
scaling, as spectral solvers use, keeping values O(1)), as real and imaginary float tensors:
FFTW-MPI's "transposed out" distribution, kept in [rows, columns] order.
"""

from __future__ import annotations

import math

import torch

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="fft2d_alltoall",
    title="Distributed 2-D FFT (slab decomposition, all-to-all transpose)",
    family="scientific",
    source="FFTW-MPI (fftw_mpi_plan_dft_r2c_2d, FFTW_MPI_TRANSPOSED_OUT), heFFTe, NVIDIA cuFFTMp; "
           "pseudo-spectral turbulence solvers and FourCastNet-style spectral layers",
    why="A distributed FFT is one global transpose between two local FFTs: the all-to-all moves "
        "(n-1)/n of the whole spectrum and dominates the time at scale.",
    # K = C//2 + 1 is odd, so the column blocks are uneven; R is odd in small (uneven slabs).
    sizes={
        "small": {"rows": 45, "cols": 66},
        "default": {"rows": 8192, "cols": 8192},
        "large": {"rows": 16384, "cols": 16384},
    },
    dtypes=("float32", "float64"),  # torch.fft has no bfloat16; half only for powers of two on CUDA
    # Unitary scaling keeps coefficients ~N(0, 1). An FFT's error grows like eps * log2(R*C) on the
    # RMS: fp32 bound ~6e-8 * 28 ~ 2e-6 at 16k x 16k (measured on CPU at 8k x 8k against float64:
    # RMS 2e-7, max 1.2e-6); the atol leaves room for another FFT library's order of operations.
    tolerances={
        "float32": Tolerance(atol=5e-5, rtol=1e-4),
        "float64": Tolerance(atol=1e-12, rtol=1e-10),
    },
)


def _split(total: int, parts: int) -> list[int]:
    """The block distribution: total // parts each, one more for the first total % parts."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor]:
    rows = _split(ctx.params["rows"], ctx.world_size)
    field_slab = ctx.randn(rows[ctx.rank], ctx.params["cols"], stream=0)
    slab_rows = torch.tensor(rows, dtype=torch.int64, device=ctx.device)
    return field_slab, slab_rows


def baseline(x: torch.Tensor, slab_rows: torch.Tensor):
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    rows = slab_rows.tolist()
    spectrum = torch.fft.rfft(x, dim=1, norm="ortho")  # [R_r, K]
    cols = _split(spectrum.shape[1], n)
    starts = [sum(cols[:q]) for q in range(n)]

    # Pack the column blocks for each destination (complex as (re, im) float pairs).
    send = torch.cat([
        torch.view_as_real(spectrum[:, starts[q]:starts[q] + cols[q]].contiguous()).flatten() for q in range(n)
    ])
    recv = torch.empty(2 * sum(rows) * cols[rank], dtype=x.dtype, device=x.device)
    _comm.all_to_all_single(
        recv, send,
        output_split_sizes=[2 * rows[p] * cols[rank] for p in range(n)],
        input_split_sizes=[2 * rows[rank] * cols[q] for q in range(n)],
    )
    # Pieces arrive in source-rank order, i.e. in row order: they stack into [R, K_r].
    columns = torch.view_as_complex(recv.view(sum(rows), cols[rank], 2))
    out = torch.fft.fft(columns, dim=0, norm="ortho")
    return out.real.contiguous(), out.imag.contiguous()


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[tuple]:
    field = torch.cat([inputs[0].double() for inputs in inputs_per_rank])
    spectrum = torch.fft.rfft2(field, norm="ortho")
    blocks = spectrum.split(_split(spectrum.shape[1], len(inputs_per_rank)), dim=1)
    return [(b.real.to(ctx.dtype).contiguous(), b.imag.to(ctx.dtype).contiguous()) for b in blocks]


def traffic(ctx: TaskContext) -> Traffic:
    # Complex values of 2*b bytes. Rank r keeps its own rows of its own columns and must send its
    # rows of every other column block, R_r * (K - K_r) values, and receive the other ranks' rows of
    # its block, (R - R_r) * K_r. nccl-tests all-to-all: payload the rank's whole send buffer
    # (R_r * K values, self part included), busbw factor (n-1)/n. Memory: input read, spectrum
    # written and read (pack), packed and received buffers written and read, output written.
    # FLOPs: ~2.5 N log2 N for a real-input 2-D FFT of N = R*C points, a 1/n share each.
    n, r = ctx.world_size, ctx.rank
    total_rows, c = ctx.params["rows"], ctx.params["cols"]
    k = c // 2 + 1
    rows, cols = _split(total_rows, n), _split(k, n)
    value = 2 * ctx.dtype.itemsize
    send = rows[r] * (k - cols[r]) * value
    recv = (total_rows - rows[r]) * cols[r] * value
    memory = (rows[r] * c * ctx.dtype.itemsize + 4 * rows[r] * k * value + 3 * total_rows * cols[r] * value)
    points = total_rows * c
    return Traffic(
        send_bytes=send, recv_bytes=recv, memory_bytes=memory,
        flops=int(2.5 * points * math.log2(points) / n),
        payload_bytes=rows[r] * k * value, bus_factor=bus_factor("all_to_all", n),
    )
