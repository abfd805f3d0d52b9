"""All-gather by peer loads: every rank pulls every rank's block from its symmetric buffer.

Each thread issues its loads from all ranks before storing (up to 8 in flight), starting at a
different peer on every rank so the links are not all hit in the same order. Loads are as wide as
the block size allows (16 bytes when it is a multiple of 16).
"""

from __future__ import annotations

import numpy as np
import torch

import _handwritten_cuda as hw


def solution(x: torch.Tensor) -> torch.Tensor:
    hw.require_cuda(x, task="all_gather")
    heap = hw.heap()
    world = heap.world_size
    x = x.contiguous()
    out = x.new_empty(world * x.shape[0], *x.shape[1:])
    if world == 1:
        out.copy_(x)
        return out
    nbytes = x.numel() * x.element_size()
    buf = heap.buffer("handwritten.all_gather", (nbytes,), torch.uint8)
    buf.local.copy_(x.view(-1).view(torch.uint8))
    width = hw.word_bytes(nbytes)
    epoch = heap.next_epoch(2)
    blocks = hw.grid(heap, nbytes // width)
    heap.launch(hw.kernel(f"pull_w{width}"), (blocks,), (hw.THREADS,),
                (buf.peer_ptrs_device, heap.signal_pads, np.int32(heap.rank), np.int32(world), np.uint32(epoch),
                 np.uint64(out.data_ptr()), np.int64(nbytes), np.int64(0)))
    return out
