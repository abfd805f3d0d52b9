"""All-to-all (equal splits) by peer loads: rank r pulls chunk r of every rank's input.

Inputs are staged with each destination's chunk on a 256-byte boundary (one strided copy), so the
loads from peers stay aligned; stores land at chunk s of the output, as wide as its size allows.
"""

from __future__ import annotations

import numpy as np
import torch

import _handwritten_cuda as hw
from pkb_tui.symheap import ALIGNMENT_BYTES


def solution(x: torch.Tensor) -> torch.Tensor:
    hw.require_cuda(x, task="all_to_all")
    heap = hw.heap()
    world = heap.world_size
    x = x.contiguous()
    out = torch.empty_like(x)
    if world == 1:
        out.copy_(x)
        return out
    chunk_bytes = x.numel() * x.element_size() // world
    pitch = hw.round_up(chunk_bytes, ALIGNMENT_BYTES)
    buf = heap.buffer("handwritten.all_to_all", (world, pitch), torch.uint8)
    buf.local[:, :chunk_bytes].copy_(x.view(-1).view(torch.uint8).view(world, chunk_bytes))
    width = hw.word_bytes(chunk_bytes)
    epoch = heap.next_epoch(2)
    blocks = hw.grid(heap, chunk_bytes // width)
    heap.launch(hw.kernel(f"pull_w{width}"), (blocks,), (hw.THREADS,),
                (buf.peer_ptrs_device, heap.signal_pads, np.int32(heap.rank), np.int32(world), np.uint32(epoch),
                 np.uint64(out.data_ptr()), np.int64(chunk_bytes), np.int64(heap.rank * pitch)))
    return out
