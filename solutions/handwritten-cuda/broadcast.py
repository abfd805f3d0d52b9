"""Broadcast from rank 0 by the copy engine: every rank copies rank 0's buffer with cudaMemcpyAsync.

No SM does the moving: rank 0 stages its tensor into its symmetric buffer, a device barrier tells
the others it is there, each rank issues one peer async copy (DMA over NVLink, or within the GPU in
shared-gpu mode), and a closing barrier keeps rank 0 from overwriting the buffer in its next call
while a peer's copy still runs. All of it is stream-ordered: the host never waits.
"""

from __future__ import annotations

import torch

import _handwritten_cuda as hw

ROOT = 0


def solution(x: torch.Tensor) -> torch.Tensor:
    hw.require_cuda(x, task="broadcast")
    heap = hw.heap()
    x = x.contiguous()
    out = torch.empty_like(x)
    if heap.world_size == 1:
        out.copy_(x)
        return out
    nbytes = x.numel() * x.element_size()
    buf = heap.buffer("handwritten.broadcast", (nbytes,), torch.uint8)
    if heap.rank == ROOT:
        buf.local.copy_(x.view(-1).view(torch.uint8))
        out.copy_(x)
    heap.barrier()  # rank 0's buffer is filled
    if heap.rank != ROOT:
        heap.copy_async(out.data_ptr(), buf.peer_ptrs[ROOT], nbytes)
    heap.barrier()  # every copy out of rank 0's buffer is done
    return out
