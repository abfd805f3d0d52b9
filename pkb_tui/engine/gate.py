"""The GPU gate: a graph block timed on the GPU by the judge's own events, no host in the window.

A graph block's figure on the judge's host clock holds two pipe hand-offs (~140 us a block on
the H200 VM, sd 13 us and more under load): most of a ~1 ms block of ~1 us calls, which is why
the self-check's graph medians strayed while the runners' own event times agreed within 1.5%.
The runner's own events cannot be the figure (the candidate's process records them). So the
judge holds its own stream and the runner's on two 32-bit flags in the arena, with the driver's
stream memory operations (cuStreamWaitValue32 / cuStreamWriteValue32, no kernel of ours):

    judge stream:  wait go >= seq | E0 | write inputs, poison outputs, flush L2 | wait done >= seq | snapshot | E1
    runner stream:                       wait go >= seq | replay the block's graph | write done = seq

Both sides enqueue everything first, the judges pass a barrier, and each judge releases its go
flag from a second stream. E1 - E0 is GPU time between the judge's two events, whichever context
ran in between (contexts without MPS take turns on the GPU; with MPS they overlap, and the window
still spans them). Why it cannot be gamed:

- The inputs land after E0: a runner that starts before go computes on stale inputs, and the
  outputs are poisoned after E0 too.
- The judge judges the *snapshot*, copied in its own stream after ``done`` and before E1: a runner
  that writes ``done`` before its work ends leaves poisoned or stale bytes in the snapshot and
  fails; every output byte that passes was written after E0 and before E1.
- A runner that never writes ``done``, or holds ``go`` down, cannot hang the judge: the judge
  writes both flags itself after its deadline (a stream that is not blocked), once the
  candidate's processes are ended.

The flags live in the first ``GATE_BYTES`` of the arena (judge-owned memory, mapped by the runner).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

GATE_BYTES = 256  # the arena's first bytes: the go flag at 0, the done flag at 4
GO_OFFSET = 0
DONE_OFFSET = 4
_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ (cyclic comparison: (int32)(*addr - value) >= 0)

TRACE = os.environ.get("PKB_GATE_TRACE") == "1"  # each step of each gated block to the process's log

_driver: Any = None
_unavailable: str | None = None


class GateError(RuntimeError):
    """The driver refused a stream memory operation."""


def _functions() -> tuple[Any, Any]:
    """cuStreamWaitValue32 and cuStreamWriteValue32 from the CUDA driver torch has loaded."""
    global _driver, _unavailable
    if _driver is None and _unavailable is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            _unavailable = f"the CUDA driver library could not be opened ({exc})"
        else:
            found = []
            for name in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
                fn = getattr(lib, f"{name}_v2", None) or getattr(lib, name, None)
                if fn is None:
                    _unavailable = f"the CUDA driver has no {name}"
                    break
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                found.append(fn)
            else:
                _driver = tuple(found)
    if _driver is None:
        raise GateError(_unavailable or "stream memory operations are not available")
    return _driver


def _check(code: int, what: str) -> None:
    if code != 0:
        raise GateError(f"{what} failed with CUDA driver error {code}"
                        + (" (stream memory operations not supported on this GPU or driver)" if code == 801 else ""))


def wait(stream_handle: int, address: int, value: int) -> None:
    """Enqueue on ``stream_handle`` (a cudaStream_t as an int): hold it until the 32-bit word at
    device ``address`` reaches ``value`` (cyclically)."""
    wait_fn, _ = _functions()
    _check(wait_fn(ctypes.c_void_p(stream_handle), address, value & 0xFFFFFFFF, _WAIT_GEQ), "cuStreamWaitValue32")


def write(stream_handle: int, address: int, value: int) -> None:
    """Enqueue on ``stream_handle``: store ``value`` at device ``address`` once the stream's earlier
    work is done (with a memory barrier: that work's writes are visible first)."""
    _, write_fn = _functions()
    _check(write_fn(ctypes.c_void_p(stream_handle), address, value & 0xFFFFFFFF, 0), "cuStreamWriteValue32")


def upload(graph: Any, stream: int) -> str | None:
    """Set up a captured graph on the GPU (cuGraphUpload) without running it; None when done, else
    why not. A graph's first launch does that set-up, and behind a held wait the first launch of a
    graph of 4,096 nodes or more did not return until the wait was released (H100, 2026-12-06,
    bench/gate_depth.py; 2,048 returned); uploaded first, 16,384 nodes returned in 1.2 ms."""
    try:
        exec_handle = int(graph.raw_cuda_graph_exec())
        lib = ctypes.CDLL("libcuda.so.1")
    except (AttributeError, RuntimeError, TypeError, OSError) as exc:
        return f"no graph upload ({type(exc).__name__}: {exc})"
    fn = getattr(lib, "cuGraphUpload", None)
    if fn is None:
        return "the CUDA driver has no cuGraphUpload"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    code = fn(ctypes.c_void_p(exec_handle), ctypes.c_void_p(stream))
    return None if code == 0 else f"cuGraphUpload failed with CUDA driver error {code}"


def trace(who: str, step: str, seq: int) -> None:
    """One line per step of a gated block (PKB_GATE_TRACE=1): where a block that never ends stopped."""
    if TRACE:
        print(f"pkb gate {time.monotonic():.6f} {who} seq {seq}: {step}", file=sys.stderr, flush=True)


def watch(seconds: float = 3.0) -> None:
    """With PKB_GATE_TRACE=1: every thread's Python stack to stderr if the block is still going
    ``seconds`` from now (where a block that never ends is stuck on the host); ``unwatch`` disarms."""
    if TRACE:
        import faulthandler

        faulthandler.dump_traceback_later(seconds, repeat=False, file=sys.stderr)


def unwatch() -> None:
    if TRACE:
        import faulthandler

        faulthandler.cancel_dump_traceback_later()


def stream_handle(stream: Any) -> int:
    return int(stream.cuda_stream)


class Window:
    """One gated block's events and where its flags and outputs are."""

    def __init__(self, seq: int, arena: Any, out_start: int, end: int, start: Any, stop: Any) -> None:
        self.seq, self.arena, self.out_start, self.end = seq, arena, out_start, end
        self.start, self.stop = start, stop  # the judge's timing events E0, E1


class JudgeGate:
    """The judge's side on one GPU: a stream of its own for the window (non-blocking, so nothing
    else of the judge waits behind its held start), one for releasing the flags, and the mirror:
    the block's inputs staged there before the window and its outputs snapshotted there inside it
    (the judge judges the snapshot, never the arena after the window)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.releaser = torch.cuda.Stream(device)
        self.mirror: Any = None
        self.seq = 0
        self.warmed: set[tuple[int, int, int, int]] = set()

    def self_test(self, timeout_s: float = 2.0) -> str | None:
        """None when a held stream waits for its flag and goes on once it is written; else why not."""
        import time

        torch = self.torch
        flags = torch.zeros(GATE_BYTES // 4, dtype=torch.int32, device=self.device)
        torch.cuda.synchronize(self.device)
        marker = torch.cuda.Event()
        try:
            wait(stream_handle(self.stream), flags.data_ptr(), 1)
            marker.record(self.stream)
            time.sleep(0.002)
            held = not marker.query()
            write(stream_handle(self.releaser), flags.data_ptr(), 1)
        except GateError as exc:
            return str(exc)
        end = time.monotonic() + timeout_s
        while not marker.query():
            if time.monotonic() > end:
                return "a held stream did not go on once its flag was written"
            time.sleep(0.0005)
        return None if held else "a stream told to wait for a flag did not wait"

    def stage(self, arena: Any, end: int) -> Any:
        """The mirror, at least ``end`` bytes (inputs are written into it before the window), and the
        arena's flags zeroed (a new arena holds garbage; the last block's values are stale)."""
        torch = self.torch
        if self.mirror is None or self.mirror.numel() < end:
            self.mirror = None
            self.mirror = torch.empty(end, dtype=torch.uint8, device=self.device)
        arena[:GATE_BYTES].zero_()
        return self.mirror

    def open(self, arena: Any, out_start: int, end: int, flush: Any) -> Window:
        """Enqueue the window's start: held until ``go``; E0; the staged inputs copied into the
        arena, its output slots poisoned, L2 flushed. Call after ``stage`` and a synchronize."""
        torch = self.torch
        layout = (arena.data_ptr(), self.mirror.data_ptr(), out_start, end)
        if layout not in self.warmed:
            # The window's own operations run once unheld first, on the same slices: with lazy
            # module loading (CUDA's default) the first launch of a kernel behind the held wait can
            # block this host until go, which only this host releases (bench/gate_depth.py hung
            # so). Never the staged inputs into the arena: the runner is awake now, and inputs it
            # saw before go would let it compute the block outside the window (the head-start
            # attack). The copies in the window are device-to-device memcpys of contiguous bytes,
            # as this one is; the poison and the flush are the kernels.
            with torch.cuda.stream(self.stream):
                self.mirror[out_start:end].copy_(arena[out_start:end])
            self._window_work(arena, out_start, end, flush, inputs=False)
            self.stream.synchronize()
            self.warmed.add(layout)
        self.seq += 1
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        window = Window(self.seq, arena, out_start, end, start, stop)
        wait(stream_handle(self.stream), arena.data_ptr() + GO_OFFSET, window.seq)
        start.record(self.stream)
        self._window_work(arena, out_start, end, flush)
        return window

    def _window_work(self, arena: Any, out_start: int, end: int, flush: Any, *, inputs: bool = True) -> None:
        """On the gate stream: the staged inputs copied into the arena (``inputs``), its output
        slots poisoned, L2 flushed."""
        with self.torch.cuda.stream(self.stream):
            if inputs and out_start > GATE_BYTES:
                arena[GATE_BYTES:out_start].copy_(self.mirror[GATE_BYTES:out_start])
            arena[out_start:end].fill_(0xFF)  # poison: a slot the runner never writes reads NaN
            flush()

    def close(self, window: Window) -> None:
        """Enqueue the window's end: held until ``done``; the outputs snapshotted; E1."""
        torch = self.torch
        wait(stream_handle(self.stream), window.arena.data_ptr() + DONE_OFFSET, window.seq)
        with torch.cuda.stream(self.stream):
            self.mirror[window.out_start:window.end].copy_(window.arena[window.out_start:window.end])
            window.stop.record(self.stream)

    def release(self, window: Window, *, done_too: bool = False) -> None:
        """Let the window run (``go``); ``done_too``: end it without the runner (a failure, no block)."""
        write(stream_handle(self.releaser), window.arena.data_ptr() + GO_OFFSET, window.seq)
        if done_too:
            write(stream_handle(self.releaser), window.arena.data_ptr() + DONE_OFFSET, window.seq)

    def ended(self, window: Window) -> bool:
        """Whether the window's end event (enqueued by ``close``) has been reached."""
        return bool(window.stop.query())

    def elapsed_us(self, window: Window) -> float:
        return float(window.start.elapsed_time(window.stop)) * 1000.0

    def outputs(self) -> Any:
        """What outputs are built from after a gated block: the snapshot."""
        return self.mirror
