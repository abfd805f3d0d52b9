"""Symmetric heap: the same buffer on every rank, and every peer's device pointer in each rank.

For candidate kernels that move data between GPUs themselves (peer loads/stores, copy engine):

    from pkb_tui import symheap
    heap = symheap.get_heap()                              # once per process, collective
    buf = heap.buffer("ar.in", (numel,), torch.float32)    # collective on first use, then cached
    buf.local.copy_(x)                                     # this rank's buffer as a torch tensor
    epoch = heap.next_epoch(2)
    heap.launch(kernel, grid, block, (buf.peer_ptrs_device, heap.signal_pads, heap.rank, ...))

How peers are mapped: each rank cudaMallocs its buffer, exports a CUDA IPC handle, and the handles
go round through torch.distributed.all_gather_object on the default group (gloo in shared-gpu mode,
NCCL in nccl mode; gather_object works on both). Each rank opens its peers' handles: with peer
access on an NVLink/PCIe box (cudaIpcMemLazyEnablePeerAccess), or as a same-device mapping when
several ranks share one GPU (shared-gpu mode: IPC between processes on one GPU works, torch's own
symmetric memory refuses it). Same code on 1 GPU and on 8.

Synchronisation: every rank owns a signal pad (PKB_MAX_BLOCKS x PKB_MAX_RANKS uint32 flags) that
peers write with system-scope release stores. ``DEVICE_CODE`` holds the device helpers
(pkb_block_barrier: block b of every rank meets block b of every other rank), and ``heap.barrier()``
enqueues the same barrier as a one-block kernel on the current stream. Barriers count epochs: each
barrier uses a fresh value from ``next_epoch()``, identical on all ranks because all ranks make the
same sequence of collective calls, so flags never need resetting.

Everything that decides (cache keys, sizes, alignment, which peer maps how, what a mismatch
between ranks means) is plain Python over a backend object, so it is tested on a CPU with a
stand-in for the CUDA calls. The real backend is CuPy; it is imported only when a heap is made.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import torch

from pkb_tui.errors import PkbError

ALIGNMENT_BYTES = 256  # every buffer starts on a 256-byte boundary: 16-byte vector loads always align
PKB_MAX_RANKS = 16
PKB_MAX_BLOCKS = 1024
SIGNAL_PAD_BYTES = PKB_MAX_BLOCKS * PKB_MAX_RANKS * 4
BARRIER_TIMEOUT_NS = 30_000_000_000  # a barrier spinning this long traps: a hang becomes an error

DEVICE_CODE = r"""
#define PKB_MAX_RANKS %(max_ranks)d
#define PKB_MAX_BLOCKS %(max_blocks)d
#define PKB_BARRIER_TIMEOUT_NS %(timeout_ns)dULL

__device__ __forceinline__ void pkb_st_release_sys(unsigned int* addr, unsigned int value) {
    asm volatile("st.release.sys.global.u32 [%%0], %%1;" :: "l"(addr), "r"(value) : "memory");
}
__device__ __forceinline__ unsigned int pkb_ld_acquire_sys(const unsigned int* addr) {
    unsigned int value;
    asm volatile("ld.acquire.sys.global.u32 %%0, [%%1];" : "=r"(value) : "l"(addr) : "memory");
    return value;
}
__device__ __forceinline__ unsigned long long pkb_globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %%0, %%globaltimer;" : "=l"(t));
    return t;
}

// Block blockIdx.x of this rank meets block blockIdx.x of every other rank. Everything this block
// wrote or read before the barrier is done and visible (system scope) to the peers after it.
// pads[r] is rank r's signal pad as mapped in this process; slot [block][src] is written by src only.
__device__ __forceinline__ void pkb_block_barrier(
    const unsigned long long* pads, int rank, int world, unsigned int epoch) {
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x < world) {
        unsigned int* theirs = reinterpret_cast<unsigned int*>(pads[threadIdx.x])
            + blockIdx.x * PKB_MAX_RANKS + rank;
        pkb_st_release_sys(theirs, epoch);
        const unsigned int* mine = reinterpret_cast<const unsigned int*>(pads[rank])
            + blockIdx.x * PKB_MAX_RANKS + threadIdx.x;
        unsigned long long start = pkb_globaltimer_ns();
        unsigned int spins = 0;
        while ((int)(pkb_ld_acquire_sys(mine) - epoch) < 0) {
            if ((++spins & 1023u) == 0 && pkb_globaltimer_ns() - start > PKB_BARRIER_TIMEOUT_NS) {
                __trap();  // a peer never arrived: fail loudly instead of hanging the run
            }
        }
    }
    __syncthreads();
}
""" % {"max_ranks": PKB_MAX_RANKS, "max_blocks": PKB_MAX_BLOCKS, "timeout_ns": BARRIER_TIMEOUT_NS}

_BARRIER_KERNEL = DEVICE_CODE + r"""
extern "C" __global__ void pkb_barrier_kernel(const unsigned long long* pads, int rank, int world, unsigned int epoch) {
    pkb_block_barrier(pads, rank, world, epoch);
}
"""


# ---------------------------------------------------------------------- host-side bookkeeping
def aligned_nbytes(nbytes: int, alignment: int = ALIGNMENT_BYTES) -> int:
    """Bytes to allocate for ``nbytes``: rounded up to the alignment, at least one alignment unit."""
    if nbytes < 0:
        raise ValueError(f"negative size {nbytes}")
    return max(alignment, -(-nbytes // alignment) * alignment)


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise PkbError(f"Unknown dtype {dtype!r} for a symmetric buffer.")
    return found


def buffer_key(name: str, shape: Sequence[int] | int, dtype: torch.dtype | str) -> tuple[str, tuple[int, ...], str]:
    """The cache key of a buffer: same name, shape and dtype -> the same memory."""
    dims = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise PkbError(f"Symmetric buffer {name!r} has a negative dimension in {dims}.")
    return (name, dims, str(_dtype(dtype)).removeprefix("torch."))


def buffer_nbytes(shape: tuple[int, ...], dtype: torch.dtype | str) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel * _dtype(dtype).itemsize


@dataclass(frozen=True)
class PeerRecord:
    """What a rank publishes about one allocation of its own."""

    rank: int
    host: str
    pid: int
    device_id: str  # PCI bus id: the same physical GPU has the same id in every process
    handle: bytes  # cudaIpcMemHandle_t, 64 bytes
    nbytes: int
    key: tuple


@dataclass(frozen=True)
class Mapping:
    rank: int
    how: str  # local (this rank), ipc-same-device (shared-gpu mode), ipc-peer-device (another GPU)


def plan_mappings(records: Sequence[PeerRecord], my_rank: int) -> list[Mapping]:
    """How this rank reaches each rank's allocation; raises PkbError when the ranks disagree."""
    ranks = [r.rank for r in records]
    if ranks != list(range(len(records))):
        raise PkbError(f"Symmetric heap exchange came back with ranks {ranks}; expected 0..{len(records) - 1}.")
    if len(records) > PKB_MAX_RANKS:
        raise PkbError(f"The symmetric heap supports up to {PKB_MAX_RANKS} ranks; this run has {len(records)}.")
    keys = {r.key for r in records}
    if len(keys) != 1:
        detail = "; ".join(f"rank {r.rank}: {r.key}" for r in records)
        raise PkbError(
            "Ranks asked the symmetric heap for different buffers in the same collective call "
            f"({detail}); every rank must call heap.buffer() with the same name, shape and dtype, in the same order."
        )
    sizes = {r.nbytes for r in records}
    if len(sizes) != 1:
        raise PkbError(f"Ranks allocated different sizes for {records[0].key}: {sorted(sizes)} bytes.")
    hosts = {r.host for r in records}
    if len(hosts) != 1:
        raise PkbError(
            f"The symmetric heap maps memory through CUDA IPC, which works within one host; ranks sit on {sorted(hosts)}."
        )
    mine = records[my_rank]
    out = []
    for record in records:
        if record.rank == my_rank:
            out.append(Mapping(record.rank, "local"))
        elif record.device_id == mine.device_id:
            out.append(Mapping(record.rank, "ipc-same-device"))
        else:
            out.append(Mapping(record.rank, "ipc-peer-device"))
    return out


def ranks_per_device(records: Sequence[PeerRecord]) -> int:
    """The most ranks sharing one GPU (1 in nccl mode, world size in shared-gpu mode)."""
    counts: dict[str, int] = {}
    for record in records:
        counts[record.device_id] = counts.get(record.device_id, 0) + 1
    return max(counts.values()) if counts else 1


def co_resident_blocks(sm_count: int, ranks_on_device: int, *, work_blocks: int | None = None) -> int:
    """How many blocks a kernel that meets its peers' blocks in a barrier may launch per rank.

    Blocks that spin in a barrier wait for their counterparts on the other ranks; if the ranks share
    a GPU (MPS runs their kernels concurrently) and one rank's grid filled every multiprocessor,
    a peer's blocks could never be scheduled: deadlock. Across GPUs the same holds if blocks of one
    index are resident on one GPU and not on another. So the grid is what is resident at once for
    certain: one block per multiprocessor on each GPU, shared between the ranks on it (a block of up
    to 512 threads under __launch_bounds__(512) always fits one multiprocessor).
    """
    per_rank = max(1, sm_count // max(1, ranks_on_device))
    per_rank = min(per_rank, PKB_MAX_BLOCKS)
    if work_blocks is not None:
        per_rank = min(per_rank, max(1, work_blocks))
    return max(1, per_rank)


# ---------------------------------------------------------------------- the backend's contract
class Backend(Protocol):
    """The CUDA calls the heap needs. CupyBackend is the real one; tests use a stand-in."""

    device_index: int

    def device_id(self) -> str: ...
    def sm_count(self) -> int: ...
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def memset(self, ptr: int, value: int, nbytes: int) -> None: ...
    def ipc_handle(self, ptr: int) -> bytes: ...
    def open_handle(self, handle: bytes, same_device: bool) -> int: ...
    def close_handle(self, ptr: int) -> None: ...
    def as_tensor(self, ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Any: ...
    def pointer_array(self, ptrs: Sequence[int]) -> Any: ...
    def synchronize(self) -> None: ...


Exchange = Callable[[Any], list]


def torch_exchange(obj: Any) -> list:
    """all_gather_object on the default group: works on gloo (shared-gpu) and NCCL (nccl mode)."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


# ---------------------------------------------------------------------- buffers and the heap
@dataclass
class SymmetricBuffer:
    """One buffer present on every rank, with every rank's pointer as mapped in this process."""

    key: tuple
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # the data's bytes (the allocation is aligned_nbytes of it)
    rank: int
    ptrs: list[int]  # per rank, usable by this process's kernels
    mappings: list[Mapping]
    _heap: "SymmetricHeap" = field(repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def ptr(self) -> int:
        return self.ptrs[self.rank]

    @property
    def peer_ptrs(self) -> list[int]:
        return list(self.ptrs)

    @property
    def local(self) -> torch.Tensor:
        """This rank's buffer as a torch tensor (shares the memory)."""
        return self.peer(self.rank)

    def peer(self, rank: int) -> torch.Tensor:
        """Rank ``rank``'s buffer as a torch tensor in this process (reads/writes go to its memory)."""
        cached = self._cache.get(("tensor", rank))
        if cached is None:
            cached = self._heap.backend.as_tensor(self.ptrs[rank], self.nbytes, self.dtype, self.shape)
            self._cache[("tensor", rank)] = cached
        return cached

    @property
    def peer_ptrs_device(self) -> Any:
        """Device array (uint64) of every rank's pointer: for CuPy RawKernel (NVRTC) kernels."""
        cached = self._cache.get("ptrs")
        if cached is None:
            cached = self._heap.backend.pointer_array(self.ptrs)
            self._cache["ptrs"] = cached
        return cached

    @property
    def peer_ptrs_tensor(self) -> torch.Tensor:
        """The same pointers as a torch int64 CUDA tensor: for Triton (tl.load then .to(pointer type))."""
        cached = self._cache.get("ptrs_tensor")
        if cached is None:
            cached = torch.tensor(self.ptrs, dtype=torch.int64, device=f"cuda:{self._heap.backend.device_index}")
            self._cache["ptrs_tensor"] = cached
        return cached


class SymmetricHeap:
    """Per-process owner of the symmetric buffers and the signal pads. Make it with get_heap()."""

    def __init__(self, *, rank: int, world_size: int, backend: Backend, exchange: Exchange, host: str | None = None) -> None:
        if world_size > PKB_MAX_RANKS:
            raise PkbError(f"The symmetric heap supports up to {PKB_MAX_RANKS} ranks; this run has {world_size}.")
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self._exchange = exchange
        self.host = host or socket.gethostname()
        self._buffers: dict[tuple, SymmetricBuffer] = {}
        self._owned: list[int] = []  # our own allocations, freed last
        self._opened: list[int] = []  # peers' allocations mapped here
        self._epoch = 0
        self._lock = threading.Lock()
        self._closed = False
        self._barrier_kernel = None
        self.ranks_on_device = 1
        pads = self._allocate(("__signal_pad__", (SIGNAL_PAD_BYTES,), "uint8"), SIGNAL_PAD_BYTES, zero=True)
        self._pads = pads
        self.signal_pad_ptrs = pads[0]

    # ------------------------------------------------------------ allocation
    def _allocate(self, key: tuple, nbytes: int, *, zero: bool) -> tuple[list[int], list[Mapping]]:
        ptr = self.backend.malloc(aligned_nbytes(nbytes))
        self._owned.append(ptr)
        if zero:
            self.backend.memset(ptr, 0, aligned_nbytes(nbytes))
            self.backend.synchronize()  # peers may write flags as soon as they have the handle
        record = PeerRecord(
            rank=self.rank, host=self.host, pid=os.getpid(), device_id=self.backend.device_id(),
            handle=bytes(self.backend.ipc_handle(ptr)), nbytes=nbytes, key=key,
        )
        records = [r if isinstance(r, PeerRecord) else PeerRecord(**r) for r in self._exchange(record)]
        mappings = plan_mappings(records, self.rank)
        self.ranks_on_device = ranks_per_device(records)
        ptrs = []
        for record, mapping in zip(records, mappings):
            if mapping.how == "local":
                ptrs.append(ptr)
            else:
                peer_ptr = self.backend.open_handle(record.handle, mapping.how == "ipc-same-device")
                self._opened.append(peer_ptr)
                ptrs.append(peer_ptr)
        return ptrs, mappings

    def buffer(self, name: str, shape: Sequence[int] | int, dtype: torch.dtype | str) -> SymmetricBuffer:
        """The buffer (name, shape, dtype) on every rank. Collective the first time; cached after."""
        if self._closed:
            raise PkbError("The symmetric heap was closed; get a new one with symheap.get_heap().")
        key = buffer_key(name, shape, dtype)
        with self._lock:
            found = self._buffers.get(key)
            if found is not None:
                return found
            shape_t, torch_dtype = key[1], _dtype(dtype)
            nbytes = buffer_nbytes(shape_t, torch_dtype)
            ptrs, mappings = self._allocate(key, nbytes, zero=False)
            buf = SymmetricBuffer(key, shape_t, torch_dtype, nbytes, self.rank, ptrs, mappings, self)
            self._buffers[key] = buf
            return buf

    @property
    def buffers(self) -> dict[tuple, SymmetricBuffer]:
        return dict(self._buffers)

    # ------------------------------------------------------------ synchronisation
    def next_epoch(self, count: int = 1) -> int:
        """The first of ``count`` fresh barrier epochs (never 0, which the zeroed pads hold)."""
        with self._lock:
            first = self._epoch + 1
            self._epoch += count
            return first & 0xFFFFFFFF or 1

    @property
    def signal_pads(self) -> Any:
        """Device array (uint64) of every rank's signal pad as mapped here: the `pads` argument of
        pkb_block_barrier."""
        cached = getattr(self, "_pads_device", None)
        if cached is None:
            cached = self.backend.pointer_array(self.signal_pad_ptrs)
            self._pads_device = cached
        return cached

    def max_blocks(self, work_blocks: int | None = None) -> int:
        """Grid size for a kernel whose blocks meet their peers in pkb_block_barrier."""
        return co_resident_blocks(self.backend.sm_count(), self.ranks_on_device, work_blocks=work_blocks)

    def barrier(self) -> None:
        """A barrier between all ranks, enqueued on the current stream (no host sync)."""
        if self.world_size == 1:
            return
        if self._barrier_kernel is None:
            self._barrier_kernel = self.backend.compile(_BARRIER_KERNEL, "pkb_barrier_kernel")  # type: ignore[attr-defined]
        import numpy as np

        epoch = self.next_epoch()
        args = (self.signal_pads, np.int32(self.rank), np.int32(self.world_size), np.uint32(epoch))
        self.launch(self._barrier_kernel, (1,), (32,), args)

    def launch(self, kernel: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        """Launch a CuPy RawKernel on torch's current stream, so it orders with the torch work around it."""
        self.backend.launch(kernel, grid, block, args, shared_mem)  # type: ignore[attr-defined]

    def copy_async(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        """cudaMemcpyAsync on torch's current stream (the copy engine; peers via UVA)."""
        self.backend.copy_async(dst_ptr, src_ptr, nbytes)  # type: ignore[attr-defined]

    # ------------------------------------------------------------ teardown
    def close(self) -> None:
        """Unmap peers' memory, then free our own. Safe to call twice; runs at exit."""
        if self._closed:
            return
        self._closed = True
        try:
            self.backend.synchronize()
        except Exception:
            pass
        for ptr in self._opened:
            try:
                self.backend.close_handle(ptr)
            except Exception:
                pass
        for ptr in self._owned:
            try:
                self.backend.free(ptr)
            except Exception:
                pass
        self._opened.clear()
        self._owned.clear()
        self._buffers.clear()


# ---------------------------------------------------------------------- the real backend (CuPy)
class CupyBackend:
    """CUDA through CuPy: cudaMalloc (not the memory pool: an IPC handle names a whole allocation),
    IPC handles, NVRTC kernels launched on torch's current stream."""

    def __init__(self, device_index: int) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise PkbError(
                "The symmetric heap needs CuPy on the GPU box (pip install cupy-cuda12x or cupy-cuda13x, to match CUDA)."
            ) from exc
        self.cp = cupy
        self.rt = cupy.cuda.runtime
        self.device_index = device_index
        self._streams: dict[int, Any] = {}
        self._sm_count: int | None = None

    def _device(self):
        return self.cp.cuda.Device(self.device_index)

    def device_id(self) -> str:
        """The PCI address of this GPU: the same physical GPU gives the same id in every process."""
        props = self.rt.getDeviceProperties(self.device_index)
        return "{:04x}:{:02x}:{:02x}".format(props["pciDomainID"], props["pciBusID"], props["pciDeviceID"])

    def sm_count(self) -> int:
        if self._sm_count is None:
            self._sm_count = int(self.rt.getDeviceProperties(self.device_index)["multiProcessorCount"])
        return self._sm_count

    def malloc(self, nbytes: int) -> int:
        with self._device():
            return int(self.rt.malloc(nbytes))

    def free(self, ptr: int) -> None:
        with self._device():
            self.rt.free(ptr)

    def memset(self, ptr: int, value: int, nbytes: int) -> None:
        with self._device():
            self.rt.memset(ptr, value, nbytes)

    def ipc_handle(self, ptr: int) -> bytes:
        with self._device():
            return bytes(self.rt.ipcGetMemHandle(ptr))

    def open_handle(self, handle: bytes, same_device: bool) -> int:
        with self._device():
            return int(self.rt.ipcOpenMemHandle(handle, self.rt.cudaIpcMemLazyEnablePeerAccess))

    def close_handle(self, ptr: int) -> None:
        with self._device():
            self.rt.ipcCloseMemHandle(ptr)

    def synchronize(self) -> None:
        with self._device():
            self.rt.deviceSynchronize()

    def as_tensor(self, ptr: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=f"cuda:{self.device_index}")
        # No device= here: torch finds the memory's GPU from the pointer; naming another would copy.
        raw = torch.as_tensor(_CudaArray(ptr, nbytes))
        return raw.view(dtype).view(shape)

    def pointer_array(self, ptrs: Sequence[int]) -> Any:
        import numpy as np

        with self._device():
            return self.cp.asarray(np.asarray(list(ptrs), dtype=np.uint64))

    def compile(self, source: str, name: str, options: tuple[str, ...] = ("--std=c++17",)) -> Any:
        with self._device():
            return self.cp.RawModule(code=source, options=options).get_function(name)

    def stream(self) -> Any:
        handle = torch.cuda.current_stream(self.device_index).cuda_stream
        found = self._streams.get(handle)
        if found is None:
            found = self.cp.cuda.ExternalStream(handle, self.device_index)
            self._streams[handle] = found
        return found

    def launch(self, kernel: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        with self._device(), self.stream():
            kernel(grid, block, args, shared_mem=shared_mem)

    def copy_async(self, dst_ptr: int, src_ptr: int, nbytes: int) -> None:
        with self._device():
            self.rt.memcpyAsync(dst_ptr, src_ptr, nbytes, self.rt.memcpyDefault, self.stream().ptr)


class _CudaArray:
    """A bare __cuda_array_interface__ over raw bytes, so torch can wrap memory CuPy did not allocate."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (max(nbytes, 1),), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None,
            "stream": None,
        }


# ---------------------------------------------------------------------- one heap per process
_heap: SymmetricHeap | None = None
_heap_lock = threading.Lock()


def get_heap() -> SymmetricHeap:
    """This process's heap, made on first use (collective: every rank must call it)."""
    global _heap
    with _heap_lock:
        if _heap is not None and not _heap._closed:
            return _heap
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise PkbError("The symmetric heap needs torch.distributed initialised (the harness does this for each rank).")
        if not torch.cuda.is_available():
            raise PkbError("The symmetric heap needs a GPU: this run has none (cpu mode); run in nccl or shared-gpu mode.")
        device = torch.cuda.current_device()
        _heap = SymmetricHeap(
            rank=dist.get_rank(), world_size=dist.get_world_size(), backend=CupyBackend(device), exchange=torch_exchange,
        )
        atexit.register(_heap.close)
        return _heap


def require_cuda(*tensors: torch.Tensor, who: str = "This solution") -> None:
    """Raise a clear PkbError when a CUDA-only solution is handed CPU tensors (cpu mode)."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_cuda:
            raise PkbError(
                f"{who} runs CUDA kernels and got a CPU tensor: run it in nccl or shared-gpu mode, not cpu mode."
            )
