"""Spatially sharded 2-D convolution: exchange halo rows with the neighbouring slabs, then convolve.

Signature: stencil_halo_exchange(x: [N, C_in, H_r, W], weight: [C_out, C_in, k, k], bias: [C_out])
    -> y: [N, C_out, H_r, W]

The image (or simulation grid) [N, C_in, H, W] is split along its height into row slabs (H // n rows
each, one more for the first H % n ranks; every slab holds at least k//2 rows). weight and bias are
replicated. Output: this rank's rows of conv2d(whole image, weight, bias, padding=k//2), i.e. zero
padding at the image's border only. Each rank sends its first k//2 rows up and its last k//2 rows
down, receives its neighbours' in return, and convolves the extended slab: the halo pattern of MPI
finite-difference stencils and of spatially parallel CNNs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tasks import _comm
from tasks.base import TaskContext, TaskSpec, Tolerance, Traffic, bus_factor

TASK = TaskSpec(
    id="stencil_halo_exchange",
    title="Halo exchange for a sharded 2-D convolution / stencil",
    family="scientific",
    source="Spatial parallelism for CNNs (Dryden et al., IPDPS'19; LBANN/DiHydrogen) on DeepCAM "
           "climate images; MPI halo exchange of finite-difference stencil codes",
    why="Splitting large images or grids spatially lets more GPUs work on one sample; each "
        "convolution then waits on two small neighbour exchanges, a latency-bound step per layer.",
    sizes={
        "small": {"batch": 2, "in_channels": 3, "out_channels": 4, "height": 53, "width": 37, "kernel": 5},
        # DeepCAM's 1152 x 768 climate images at 64 channels; large: 2x the resolution, 128 channels.
        "default": {"batch": 2, "in_channels": 64, "out_channels": 64, "height": 1152, "width": 768, "kernel": 3},
        "large": {"batch": 4, "in_channels": 128, "out_channels": 128, "height": 2304, "width": 1536, "kernel": 3},
    },
    dtypes=("float32", "bfloat16", "float64"),
    # Weights scaled 1/sqrt(C_in k^2) keep outputs O(1); each output is a dot product of C_in k^2 <=
    # 1152 terms accumulated in fp32 (bf16 convolutions too) and rounded once to the dtype, plus bias.
    tolerances={
        "float32": Tolerance(atol=2e-5, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
        "float64": Tolerance(atol=1e-12, rtol=1e-10),
    },
)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    p = ctx.params
    rows = _split(p["height"], ctx.world_size)[ctx.rank]
    x = ctx.randn(p["batch"], p["in_channels"], rows, p["width"], stream=0)
    gen = ctx.shared_generator(stream=1)
    fan_in = p["in_channels"] * p["kernel"] ** 2
    weight = torch.randn(p["out_channels"], p["in_channels"], p["kernel"], p["kernel"], generator=gen,
                         device=ctx.device) / math.sqrt(fan_in)
    bias = 0.1 * torch.randn(p["out_channels"], generator=gen, device=ctx.device)
    return x, weight.to(ctx.dtype), bias.to(ctx.dtype)


def baseline(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    n = torch.distributed.get_world_size()
    rank = torch.distributed.get_rank()
    halo = weight.shape[-1] // 2
    above = rank - 1 if rank > 0 else None
    below = rank + 1 if rank < n - 1 else None
    halo_shape = (x.shape[0], x.shape[1], halo, x.shape[3])
    # Missing neighbours (image border) leave zero rows: the convolution's zero padding.
    from_above = torch.zeros(halo_shape, dtype=x.dtype, device=x.device)
    from_below = torch.zeros(halo_shape, dtype=x.dtype, device=x.device)
    # Phase 1: last rows down, halo from above. Phase 2: first rows up, halo from below.
    _comm.sendrecv(x[:, :, -halo:] if below is not None else None, below,
                   from_above if above is not None else None, above)
    _comm.sendrecv(x[:, :, :halo] if above is not None else None, above,
                   from_below if below is not None else None, below)
    extended = torch.cat([from_above, x, from_below], dim=2)
    return F.conv2d(extended, weight, bias, padding=(0, halo))


def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list[torch.Tensor]:
    image = torch.cat([inputs[0].double() for inputs in inputs_per_rank], dim=2)
    weight, bias = inputs_per_rank[0][1].double(), inputs_per_rank[0][2].double()
    out = F.conv2d(image, weight, bias, padding=weight.shape[-1] // 2)
    rows = _split(ctx.params["height"], len(inputs_per_rank))
    return [part.to(ctx.dtype).contiguous() for part in out.split(rows, dim=2)]


def traffic(ctx: TaskContext) -> Traffic:
    # Rank r sends k//2 rows of N*C_in*W values to each neighbour it has (two inside, one at either
    # end) and receives as many. Point-to-point: busbw = algbw over the bytes one rank sends.
    # Memory: the slab and halos read, the weight read, the output written. FLOPs: the convolution,
    # which cuDNN runs in TF32 for float32 under PyTorch's defaults (measured on an H200: 106.6% of
    # the plain float32 floor at one rank).
    n, r = ctx.world_size, ctx.rank
    p = ctx.params
    b = ctx.dtype.itemsize
    rows = _split(p["height"], n)[r]
    halo_bytes = p["batch"] * p["in_channels"] * (p["kernel"] // 2) * p["width"] * b
    neighbours = (r > 0) + (r < n - 1)
    slab_in = p["batch"] * p["in_channels"] * rows * p["width"]
    slab_out = p["batch"] * p["out_channels"] * rows * p["width"]
    weight_elems = p["out_channels"] * p["in_channels"] * p["kernel"] ** 2 + p["out_channels"]
    return Traffic(
        send_bytes=neighbours * halo_bytes, recv_bytes=neighbours * halo_bytes,
        memory_bytes=(slab_in + slab_out + weight_elems) * b + neighbours * halo_bytes,
        flops=2 * slab_out * p["in_channels"] * p["kernel"] ** 2,
        tf32_flops=2 * slab_out * p["in_channels"] * p["kernel"] ** 2,
        payload_bytes=neighbours * halo_bytes, bus_factor=bus_factor("sendrecv", n),
    )
