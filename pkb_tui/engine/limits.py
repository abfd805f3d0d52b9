"""What a candidate may take of the machine, and the judge's watch over it.

A candidate's processes (its runner, whatever that runner starts, and anything that escaped by a
double fork and came back to the judge, a child subreaper) share one allowance per rank:

- host memory: resident bytes of all of them together (--max-host-memory-gib; by default half the
  machine's memory shared by the ranks);
- tasks: threads and processes together (--max-tasks), which stops a fork or thread bomb before it
  takes the box;
- output: what they print is read by the judge through a pipe; the first and the last
  OUTPUT_HALF_BYTES are kept in the log with a line saying how much was dropped between;
- CPU time: user and system seconds of all of them since the runner started, threads that ended
  and children they reaped included (--max-cpu-s; by default the run's timeout times the cores a
  rank may use, at most CPU_CORES_PER_RANK: a kernel's host side is a launching thread and a
  progress thread, so a candidate spinning 16 threads is stopped after an eighth of the timeout);
- GPU memory (CUDA modes): what NVML reports each of those processes uses, summed over every GPU
  (--max-gpu-memory-gib; default in default_gpu_memory_bytes). NVML must list the candidate's own
  runner with a figure; where it cannot (no NVML, the pids of another PID namespace, a VM that
  reports none) GPU memory is not limited and the run's notes say why.

The judge's guard thread samples /proc (and NVML) four times a second; past a limit it kills the
candidate's processes and the run ends with a verdict that names the limit. The baseline runner is
trusted and not limited.

Known gaps: a process that lives less than a look (0.25 s) and that no candidate process waits for
(SIGCHLD ignored, a double fork's) takes its CPU time with it (no cgroup here); under MPS a process the
candidate starts could make a CUDA context of its own, so the MPS pinned-memory limit
(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) is not used: it binds only the process that sets it.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pkb_tui.engine.procs import CpuReading, Usage

GIB = 2**30
DEFAULT_MAX_TASKS = 512
OUTPUT_HALF_BYTES = 1 << 20
GUARD_INTERVAL_S = 0.25
# Lines the harness itself causes in a candidate's output, left out of its last words: in the
# model's network namespace (engine.sandbox) torch's c10d cannot look up its peers' host names.
HARNESS_NOISE = ("[c10d] The hostname of the client socket cannot be retrieved",)


# Cores' worth of CPU time per second of timeout a candidate's rank may take at most (see above).
CPU_CORES_PER_RANK = 2.0
# GPU memory each rank keeps back from its candidate for itself: the judge's arena (at most
# ARENA_BUDGET_BYTES["cuda"] = 4 GiB in engine.worker), two CUDA contexts (judge and baseline
# runner, ~0.5 GiB each on Hopper) and the judge's expected and float64 outputs of a call.
JUDGE_GPU_RESERVE_BYTES = 6 * GIB


@dataclass(frozen=True)
class Limits:
    host_memory_bytes: int
    tasks: int
    cpu_s: float = math.inf
    gpu_memory_bytes: int | None = None  # None: no GPU in this mode

    @classmethod
    def from_request(cls, memory_gib: float | None, tasks: int | None, ranks_on_host: int, *,
                     cpu_s: float | None = None, timeout_s: float = 300.0, cpu_count: int | None = None,
                     gpu_memory_gib: float | None = None, gpu_total_bytes: int | None = None,
                     ranks_per_gpu: int = 1) -> Limits:
        """``gpu_total_bytes``: the rank's GPU's memory (None in cpu mode: no GPU limit);
        ``ranks_per_gpu``: the ranks of this host that share that GPU."""
        if memory_gib is None:
            memory = max(2 * GIB, int(host_memory_bytes() * 0.5 / max(1, ranks_on_host)))
        else:
            memory = int(float(memory_gib) * GIB)
        if cpu_s is None:
            cpu_s = default_cpu_s(timeout_s, cpu_count or os.cpu_count() or 1, ranks_on_host)
        gpu: int | None = None
        if gpu_total_bytes is not None:
            gpu = (int(float(gpu_memory_gib) * GIB) if gpu_memory_gib is not None
                   else default_gpu_memory_bytes(gpu_total_bytes, ranks_per_gpu))
        return cls(host_memory_bytes=memory, tasks=int(tasks or DEFAULT_MAX_TASKS), cpu_s=float(cpu_s),
                   gpu_memory_bytes=gpu)

    def describe(self) -> str:
        """The limits for a run's notes."""
        parts = [f"{self.host_memory_bytes / GIB:.1f} GiB of host memory", f"{self.tasks} threads and processes",
                 f"{self.cpu_s:g} s of CPU time"]
        if self.gpu_memory_bytes is not None:
            parts.append(f"{self.gpu_memory_bytes / GIB:.1f} GiB of GPU memory")
        return ", ".join(parts)


def default_cpu_s(timeout_s: float, cpu_count: int, ranks_on_host: int) -> float:
    """The run's timeout times the cores a rank may use: its share of the host's cores, at least
    one, at most CPU_CORES_PER_RANK."""
    cores = min(CPU_CORES_PER_RANK, max(1.0, cpu_count / max(1, ranks_on_host)))
    return round(float(timeout_s) * cores, 1)


def default_gpu_memory_bytes(gpu_total_bytes: int, ranks_per_gpu: int) -> int:
    """A rank's share of its GPU (the GPU's memory over the ranks that use it) less what the judge
    keeps (JUDGE_GPU_RESERVE_BYTES), halved: the baseline's runner, stopped or not, needs as much
    as an honest candidate for the same task. At least 1 GiB. An H200 (141 GiB) with one rank:
    67.5 GiB; eight ranks sharing it: 5.8 GiB."""
    share = gpu_total_bytes / max(1, ranks_per_gpu)
    return max(GIB, int((share - JUDGE_GPU_RESERVE_BYTES) / 2))


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return 16 * GIB


def over_limit(usage: Usage, limits: Limits, *, cpu_s: float | None = None,
               gpu_memory_bytes: int | None = None) -> str | None:
    """The sentence for a limit passed, or None. ``cpu_s``: the candidate's CPU time (CpuClock);
    ``gpu_memory_bytes``: its GPU memory (GpuMemory), None where not known."""
    if usage.resident_bytes > limits.host_memory_bytes:
        return (f"exceeded its host-memory limit: {usage.resident_bytes / GIB:.1f} GiB resident "
                f"> {limits.host_memory_bytes / GIB:.1f} GiB (--max-host-memory-gib)")
    if usage.tasks > limits.tasks:
        return (f"exceeded its limit of {limits.tasks} threads and processes: {usage.tasks} in "
                f"{usage.processes} process(es) (--max-tasks)")
    if (gpu_memory_bytes is not None and limits.gpu_memory_bytes is not None
            and gpu_memory_bytes > limits.gpu_memory_bytes):
        return (f"exceeded its GPU-memory limit: {gpu_memory_bytes / GIB:.1f} GiB > "
                f"{limits.gpu_memory_bytes / GIB:.1f} GiB (--max-gpu-memory-gib)")
    if cpu_s is not None and cpu_s > limits.cpu_s:
        return (f"exceeded its CPU-time limit: {cpu_s:.2f} s > {limits.cpu_s:g} s of CPU "
                f"in {usage.processes} process(es) (--max-cpu-s)")
    return None


class CpuClock:
    """A candidate's CPU seconds since its runner started, from the guard's looks at /proc.

    A live process counts its own time, its dead threads' and that of the children it reaped
    (cutime, cstime). A process gone since the last look counts what it had then, unless its
    parent is one of the candidate's live processes: that parent reaped it, so its time is in the
    parent's cutime now (not twice). One reaped by the judge (a double fork's escapee, the runner
    itself) would otherwise be lost."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], CpuReading] = {}
        self._gone_s = 0.0

    def update(self, readings: tuple[CpuReading, ...] | list[CpuReading]) -> float:
        now = {(r.pid, r.start_ticks): r for r in readings}
        live_pids = {r.pid for r in readings}
        for key, last in self._last.items():
            if key not in now and last.ppid not in live_pids:
                self._gone_s += last.cpu_s
        self._last = now
        return self.total_s

    @property
    def total_s(self) -> float:
        return self._gone_s + sum(r.cpu_s for r in self._last.values())


@dataclass(frozen=True)
class GpuReading:
    """A candidate's GPU memory as NVML reports it."""

    used_bytes: int  # summed over its processes and every GPU, where NVML gives a figure
    attributed: bool  # NVML listed the candidate's runner with a figure: the sum can be trusted
    why_not: str | None = None  # when not attributed: why, for the run's notes


class GpuMemory:
    """Per-process GPU memory from NVML (collectors.nvml.Nvml; ``nvml``: an injected pynvml-like
    module, as the collectors' tests do). nvmlDeviceGetComputeRunningProcesses lists the processes
    with a CUDA context; under MPS the clients are in nvmlDeviceGetMPSComputeRunningProcesses (and
    the server in the first list): both are read, a process counted once per GPU."""

    def __init__(self, nvml: Any = None) -> None:
        from collectors.nvml import Nvml

        self.nvml = Nvml(nvml)

    def used_by_pid(self) -> dict[int, int | None]:
        """pid -> bytes over every GPU (None: listed, but NVML has no figure for it)."""
        out: dict[int, int | None] = {}
        for index in range(self.nvml.device_count()):
            on_gpu: dict[int, int | None] = {}
            for function in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
                for entry in self.nvml.device_call(index, function) or []:
                    pid, used = getattr(entry, "pid", None), getattr(entry, "usedGpuMemory", None)
                    if not isinstance(pid, int):
                        continue
                    figure = int(used) if isinstance(used, int) and used >= 0 else None
                    known = on_gpu.get(pid)
                    on_gpu[pid] = figure if known is None else max(known, figure or 0)
            for pid, figure in on_gpu.items():
                if figure is None:
                    out.setdefault(pid, None)
                else:
                    out[pid] = (out.get(pid) or 0) + figure
        return out

    def reading(self, pids: list[int], runner_pid: int) -> GpuReading:
        if not self.nvml.available:
            return GpuReading(0, False, self.nvml.reason or "NVML did not start")
        listed = self.used_by_pid()
        used = sum(listed.get(pid) or 0 for pid in pids)
        if runner_pid not in listed:
            return GpuReading(used, False, (
                f"NVML does not list the candidate's runner (pid {runner_pid}) among the {len(listed)} process(es) "
                "it reports on the GPUs (pids of another PID namespace, MPS clients listed under their server, "
                "or a VM that reports none)"))
        if listed[runner_pid] is None:
            return GpuReading(used, False, "NVML lists the candidate's runner without its memory "
                                           "(no per-process figures here, as on some VMs)")
        return GpuReading(used, True)

    def close(self) -> None:
        self.nvml.close()


class GpuWatch:
    """What the guard learns of one candidate's GPU memory over its run: whether NVML ever listed
    its runner with a figure (then the limit holds), else why not, for the run's notes."""

    def __init__(self) -> None:
        self.attributed = False
        self.why_not: str | None = None

    def look(self, gpu: GpuMemory, pids: list[int], runner_pid: int, runner_alive: bool) -> int:
        """The candidate's GPU bytes now (what NVML gives a figure for)."""
        reading = gpu.reading(pids, runner_pid)
        self.attributed = self.attributed or reading.attributed
        if runner_alive:  # a runner gone is not listed by NVML: that says nothing of NVML
            self.why_not = reading.why_not
        return reading.used_bytes

    def note(self) -> str | None:
        if self.attributed or not self.why_not:
            return None
        return f"GPU memory not limited: {self.why_not}"


class OutputCapture:
    """A runner's stdout and stderr: a pipe the judge drains in a thread of its own. The first
    OUTPUT_HALF_BYTES go to the log as they come; past that only the last OUTPUT_HALF_BYTES are
    held, written with a line saying how many bytes were dropped when the runner is closed."""

    def __init__(self, log_path: Path, half_bytes: int = OUTPUT_HALF_BYTES) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.half_bytes = half_bytes
        self._log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._past_head_bytes = 0
        self._finished = False
        self.dropped_bytes = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, daemon=True, name="pkb-output")
        self._thread.start()

    def handed_over(self) -> None:
        """The runner has its copy of the write end: the judge's goes (EOF comes with the runner's)."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def _drain(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.read_fd, 1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                with self._lock:
                    if self._finished:  # a leftover process still writing after the run: ignored
                        continue
                    room = self.half_bytes - len(self._head)
                    if room > 0:
                        self._head += chunk[:room]
                        _write_all(self._log, chunk[:room])
                        chunk = chunk[room:]
                    if chunk:
                        self._past_head_bytes += len(chunk)
                        self._tail.append(chunk)
                        self._tail_bytes += len(chunk)
                        while self._tail_bytes - len(self._tail[0]) >= self.half_bytes:
                            self._tail_bytes -= len(self._tail.popleft())
        finally:
            os.close(self.read_fd)  # only here: the number is never reused under a blocked read

    def last_lines(self, count: int) -> str:
        """The last non-empty lines printed (for a verdict's 'last words')."""
        with self._lock:
            data = b"".join(self._tail) if self._tail else bytes(self._head)
        lines = [line.strip() for line in data[-8192:].decode(errors="replace").splitlines()
                 if line.strip() and not any(noise in line for noise in HARNESS_NOISE)]
        return " | ".join(lines[-count:])[:600]

    def close(self, wait_s: float = 1.0) -> None:
        """Take what is in the pipe (up to ``wait_s`` for the writers to go) and write the tail,
        with how much was dropped. Later output, from a process that outlived its runner, is
        ignored until the judge ends that process."""
        self.handed_over()
        self._thread.join(wait_s)
        with self._lock:
            if self._finished:
                return
            self._finished = True
            tail = b"".join(self._tail)[-self.half_bytes:]
            self.dropped_bytes = self._past_head_bytes - len(tail)
            if self.dropped_bytes > 0:
                _write_all(self._log, f"\n[pkb: {self.dropped_bytes:,} bytes of output dropped here; the first "
                                      f"and the last {self.half_bytes:,} are kept]\n".encode())
            _write_all(self._log, tail)
            self._tail.clear()
            os.close(self._log)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # a full disk loses log lines, never the run

