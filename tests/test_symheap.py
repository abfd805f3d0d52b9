"""The symmetric heap's host-side bookkeeping, on a CPU.

The CUDA calls (cudaMalloc, IPC handles) are replaced by a stand-in "device" whose memory is host
bytearrays, so the heap's own logic runs for real: rank threads exchanging records through a real
barrier, and once through real gloo processes (all_gather_object, as on the GPU box).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import pytest
import torch

from pkb_tui import symheap
from pkb_tui.errors import PkbError
from pkb_tui.symheap import (
    ALIGNMENT_BYTES, SIGNAL_PAD_BYTES, Mapping, PeerRecord, SymmetricHeap, aligned_nbytes, buffer_key,
    co_resident_blocks, plan_mappings, ranks_per_device,
)
from tests._dist import run_distributed


class FakeDevice:
    """Memory shared by every rank of a test: allocations, IPC mappings, and what was freed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.memory: dict[int, bytearray] = {}
        self.aliases: dict[int, int] = {}  # mapped address -> owner's address
        self.next_ptr = 1 << 32
        self.freed: list[int] = []
        self.closed: list[int] = []
        self.events: list[tuple[int, str, int]] = []  # (rank, call, ptr) in order

    def resolve(self, ptr: int) -> bytearray:
        return self.memory[self.aliases.get(ptr, ptr)]


class FakeBackend:
    def __init__(self, device: FakeDevice, rank: int, device_id: str = "0000:19:00.0", sm_count: int = 132) -> None:
        self.device, self.rank, self._device_id, self._sm = device, rank, device_id, sm_count
        self.device_index = 0

    def device_id(self) -> str:
        return self._device_id

    def sm_count(self) -> int:
        return self._sm

    def malloc(self, nbytes: int) -> int:
        assert nbytes % ALIGNMENT_BYTES == 0, "allocations are aligned"
        with self.device.lock:
            ptr = self.device.next_ptr
            self.device.next_ptr += nbytes + (1 << 20)
            self.device.memory[ptr] = bytearray(b"\xab" * nbytes)  # not zero: memset must be real
            self.device.events.append((self.rank, "malloc", ptr))
            return ptr

    def free(self, ptr: int) -> None:
        with self.device.lock:
            assert ptr in self.device.memory and ptr not in self.device.freed, "double or foreign free"
            self.device.freed.append(ptr)
            self.device.events.append((self.rank, "free", ptr))

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        self.device.resolve(ptr)[:nbytes] = bytes([value]) * nbytes

    def ipc_handle(self, ptr: int) -> bytes:
        return ptr.to_bytes(8, "little") + self.rank.to_bytes(8, "little") + bytes(48)

    def open_handle(self, handle: bytes, same_device: bool) -> int:
        owner_ptr, owner_rank = int.from_bytes(handle[:8], "little"), int.from_bytes(handle[8:16], "little")
        if owner_rank == self.rank:  # as CUDA: a process cannot open its own handle
            raise RuntimeError("cudaErrorInvalidContext")
        with self.device.lock:
            mapped = self.device.next_ptr
            self.device.next_ptr += 1 << 20
            self.device.aliases[mapped] = owner_ptr
            self.device.events.append((self.rank, "open", mapped))
            return mapped

    def close_handle(self, ptr: int) -> None:
        with self.device.lock:
            assert ptr in self.device.aliases
            self.device.closed.append(ptr)
            self.device.events.append((self.rank, "close", ptr))

    def as_tensor(self, ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        memory = self.device.resolve(ptr)
        return torch.frombuffer(memory, dtype=torch.uint8, count=nbytes).view(dtype).view(shape)

    def pointer_array(self, ptrs: Sequence[int]) -> list[int]:
        return list(ptrs)

    def synchronize(self) -> None:
        pass


class ThreadExchange:
    """all_gather_object between rank threads."""

    def __init__(self, world_size: int) -> None:
        self.slots: list[Any] = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.calls = 0

    def for_rank(self, rank: int):
        def exchange(obj: Any) -> list:
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            if rank == 0:
                self.calls += 1
            self.barrier.wait()
            return out

        return exchange


def on_ranks(world_size: int, fn, *, device_ids: Sequence[str] | None = None) -> tuple[list[Any], FakeDevice]:
    """fn(heap) on world_size rank threads sharing one FakeDevice; results in rank order."""
    device = FakeDevice()
    exchange = ThreadExchange(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException | None] = [None] * world_size

    def body(rank: int) -> None:
        try:
            backend = FakeBackend(device, rank, device_ids[rank] if device_ids else "0000:19:00.0")
            heap = SymmetricHeap(rank=rank, world_size=world_size, backend=backend, exchange=exchange.for_rank(rank), host="box")
            results[rank] = fn(heap)
        except BaseException as exc:  # collected and re-raised in the test's thread
            errors[rank] = exc
            exchange.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    if first is not None:
        raise first
    return results, device


def test_sizes_are_aligned_and_keys_normalised():
    assert aligned_nbytes(0) == ALIGNMENT_BYTES
    assert aligned_nbytes(1) == ALIGNMENT_BYTES
    assert aligned_nbytes(256) == 256
    assert aligned_nbytes(257) == 512
    with pytest.raises(ValueError):
        aligned_nbytes(-1)
    assert buffer_key("x", 10, torch.float32) == buffer_key("x", (10,), "float32") == ("x", (10,), "float32")
    assert buffer_key("x", [3, 4], "torch.bfloat16") == ("x", (3, 4), "bfloat16")
    assert buffer_key("x", (3, 4), torch.float16) != buffer_key("x", (4, 3), torch.float16)
    with pytest.raises(PkbError):
        buffer_key("x", (-1,), torch.float32)
    with pytest.raises(PkbError):
        buffer_key("x", (1,), "float33")


def test_every_rank_sees_every_peers_buffer_through_its_mapping():
    def body(heap: SymmetricHeap):
        buf = heap.buffer("data", (5, 7), torch.float32)
        buf.local.copy_(torch.full((5, 7), float(heap.rank + 1)) * torch.arange(35.0).view(5, 7))
        heap._exchange(None)  # a host barrier: everyone has written
        seen = {r: buf.peer(r).clone() for r in range(heap.world_size)}
        return buf.mappings, seen, buf.ptrs

    results, device = on_ranks(4, body)
    for rank, (mappings, seen, ptrs) in enumerate(results):
        assert [m.how for m in mappings] == ["local" if r == rank else "ipc-same-device" for r in range(4)]
        for peer, values in seen.items():
            assert torch.equal(values, float(peer + 1) * torch.arange(35.0).view(5, 7))
        assert len(set(ptrs)) == 4
    # Each rank opened exactly the handles of its 3 peers, for the signal pad and the buffer.
    opens = [e for e in device.events if e[1] == "open"]
    assert len(opens) == 4 * 3 * 2


def test_buffers_are_cached_per_name_shape_and_dtype():
    def body(heap: SymmetricHeap):
        a = heap.buffer("x", (1000,), torch.float32)
        b = heap.buffer("x", 1000, "float32")
        c = heap.buffer("x", (1000,), torch.bfloat16)
        d = heap.buffer("x", (999,), torch.float32)
        return a is b, a is c, a is d, len(heap.buffers)

    results, device = on_ranks(2, body)
    for same, same_other_dtype, same_other_shape, count in results:
        assert same and not same_other_dtype and not same_other_shape
        assert count == 3
    mallocs = [e for e in device.events if e[1] == "malloc"]
    assert len(mallocs) == 2 * (1 + 3)  # signal pad + three distinct buffers per rank


def test_signal_pads_start_zeroed_and_epochs_agree_across_ranks():
    def body(heap: SymmetricHeap):
        pad = heap.backend.as_tensor(heap.signal_pad_ptrs[heap.rank], SIGNAL_PAD_BYTES, torch.uint8, (SIGNAL_PAD_BYTES,))
        return bool((pad == 0).all()), [heap.next_epoch(2), heap.next_epoch(), heap.next_epoch(3), heap.next_epoch()]

    results, _ = on_ranks(3, body)
    assert all(zeroed for zeroed, _ in results)
    assert all(epochs == [1, 3, 4, 7] for _, epochs in results)


def test_ranks_asking_for_different_shapes_get_a_clear_error():
    def body(heap: SymmetricHeap):
        heap.buffer("x", (100 + heap.rank,), torch.float32)

    with pytest.raises(PkbError, match="same name, shape and dtype"):
        on_ranks(2, body)


def test_ranks_on_different_gpus_map_each_other_as_peers():
    def body(heap: SymmetricHeap):
        return [m.how for m in heap.buffer("x", 64, torch.float16).mappings], heap.ranks_on_device, heap.max_blocks()

    ids = [f"0000:{0x19 + r:02x}:00.0" for r in range(4)]
    results, _ = on_ranks(4, body, device_ids=ids)
    for rank, (hows, per_device, blocks) in enumerate(results):
        assert hows == ["local" if r == rank else "ipc-peer-device" for r in range(4)]
        assert per_device == 1 and blocks == 132


def test_close_unmaps_peers_then_frees_its_own_and_only_once():
    def body(heap: SymmetricHeap):
        heap.buffer("x", (10,), torch.float32)
        heap.buffer("y", (20,), torch.float32)
        heap._exchange(None)
        heap.close()
        heap.close()
        with pytest.raises(PkbError, match="closed"):
            heap.buffer("z", (1,), torch.float32)
        return heap.rank

    _, device = on_ranks(2, body)
    assert sorted(device.freed) == sorted(device.memory)  # every allocation freed exactly once
    assert sorted(device.closed) == sorted(device.aliases)  # every mapping closed
    for rank in range(2):
        mine = [call for r, call, _ in device.events if r == rank]
        last_close = max(i for i, c in enumerate(mine) if c == "close")
        first_free = min(i for i, c in enumerate(mine) if c == "free")
        assert last_close < first_free  # peers' mappings go before our own memory


def test_plan_mappings_rejects_mixed_hosts_and_too_many_ranks():
    def rec(rank: int, host: str = "a", nbytes: int = 8) -> PeerRecord:
        return PeerRecord(rank, host, 1, "dev", b"", nbytes, ("x", (2,), "float32"))

    assert plan_mappings([rec(0), rec(1)], 1) == [Mapping(0, "ipc-same-device"), Mapping(1, "local")]
    with pytest.raises(PkbError, match="within one host"):
        plan_mappings([rec(0, "a"), rec(1, "b")], 0)
    with pytest.raises(PkbError, match="different sizes"):
        plan_mappings([rec(0, nbytes=8), rec(1, nbytes=16)], 0)
    with pytest.raises(PkbError, match="expected 0..1"):
        plan_mappings([rec(1), rec(0)], 0)
    with pytest.raises(PkbError, match="up to"):
        plan_mappings([rec(r) for r in range(symheap.PKB_MAX_RANKS + 1)], 0)


def test_grid_size_leaves_room_for_every_rank_sharing_the_gpu():
    assert co_resident_blocks(132, 1) == 132
    assert co_resident_blocks(132, 2) == 66
    assert co_resident_blocks(132, 4) == 33
    assert co_resident_blocks(132, 4, work_blocks=5) == 5
    assert co_resident_blocks(132, 4, work_blocks=0) == 1
    assert co_resident_blocks(4, 8) == 1
    recs = [PeerRecord(r, "h", 1, "gpu0" if r < 3 else "gpu1", b"", 8, ()) for r in range(4)]
    assert ranks_per_device(recs) == 3


def test_cpu_tensors_get_a_sentence_not_a_cuda_crash():
    with pytest.raises(PkbError, match="not cpu mode"):
        symheap.require_cuda(torch.ones(3), who="handwritten-cuda all_reduce")


def _exchange_over_gloo(rank: int, world_size: int) -> list[str]:
    device = FakeDevice()  # per process: only the records travel, as on the GPU box
    heap = SymmetricHeap(
        rank=rank, world_size=world_size, backend=FakeBackend(device, rank, f"gpu{rank % 2}"),
        exchange=symheap.torch_exchange,
    )
    buf = heap.buffer("grad", (3, 5), torch.bfloat16)
    return [m.how for m in buf.mappings]


def test_handles_travel_through_real_gloo_all_gather_object():
    results = run_distributed(3, _exchange_over_gloo)
    assert results[0] == ["local", "ipc-peer-device", "ipc-same-device"]
    assert results[1] == ["ipc-peer-device", "local", "ipc-peer-device"]
    assert results[2] == ["ipc-same-device", "ipc-peer-device", "local"]


def test_get_heap_outside_a_distributed_run_says_what_is_missing():
    with pytest.raises(PkbError, match="torch.distributed"):
        symheap.get_heap()
