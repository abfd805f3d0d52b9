"""All-reduce (sum) by peer loads through the symmetric heap: one-shot below 512 KiB, two-shot above.

One-shot: every rank reads every rank's whole buffer and sums it (one kernel, latency-bound sizes).
Two-shot: rank r sums chunk r of every buffer (reduce-scatter), then reads the other ranks' reduced
chunks (all-gather): 2(n-1)/n of the data per rank over the links, the bandwidth-optimal amount.
"""

from __future__ import annotations

import numpy as np
import torch

import _handwritten_cuda as hw

ONE_SHOT_MAX_BYTES = 512 * 1024


def solution(x: torch.Tensor) -> torch.Tensor:
    hw.require_cuda(x, task="all_reduce")
    heap = hw.heap()
    world = heap.world_size
    flat = x.contiguous().view(-1)
    out = torch.empty_like(flat)
    if world == 1:
        out.copy_(flat)
        return out.view_as(x)
    n = flat.numel()
    per_vector = hw.VECTOR_BYTES // flat.element_size()
    chunk = hw.round_up(-(-n // world), per_vector)  # chunk starts stay 16-byte aligned
    buf = heap.buffer("handwritten.all_reduce", (chunk * world,), flat.dtype)
    buf.local[:n].copy_(flat)
    common = (buf.peer_ptrs_device, heap.signal_pads, np.int32(heap.rank), np.int32(world))
    if n * flat.element_size() <= ONE_SHOT_MAX_BYTES:
        epoch = heap.next_epoch(2)
        blocks = hw.grid(heap, n // per_vector + 1)
        heap.launch(hw.typed("reduce", flat.dtype, "all_reduce"), (blocks,), (hw.THREADS,),
                    (*common, np.uint32(epoch), np.uint64(out.data_ptr()), np.int64(0), np.int64(n)))
    else:
        epoch = heap.next_epoch(3)
        blocks = hw.grid(heap, chunk // per_vector + 1)
        heap.launch(hw.typed("twoshot", flat.dtype, "all_reduce"), (blocks,), (hw.THREADS,),
                    (*common, np.uint32(epoch), np.uint64(out.data_ptr()), np.int64(n), np.int64(chunk)))
    return out.view_as(x)
