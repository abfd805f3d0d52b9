"""Host sampler, for machines without NVML (a laptop, CI): CPU, memory, loopback traffic.

One GpuSample per call with gpu = -1: overall CPU use (0..100 over all cores), host memory in use,
and loopback bytes/s (interface 'lo': what gloo moves between ranks on one machine). Per-rank CPU
use (100 = one full core, as top shows it) is kept in ``process_cpu_pct`` for the ranks' pids: the
samples table has no per-process column, so it lives in memory for the live view.

Shared-memory traffic between processes is not measurable from outside them, so it is not shown.
psutil is used when importable; otherwise the same figures come from /proc.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

from collectors.sample import GpuSample

NO_GPU_REASON = "no NVIDIA GPU found"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class HostSampler:
    """Host figures as a GpuSample with gpu = -1; ``reason`` says why there are no GPU figures."""

    source = "host"

    def __init__(
        self, pids: Iterable[int] = (), *, reason: str = NO_GPU_REASON, use_psutil: bool | None = None,
        proc_root: str | Path = "/proc", clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reason = reason
        self.proc = Path(proc_root)
        self.clock = clock
        self._psutil = None
        if use_psutil is not False:
            try:
                import psutil

                self._psutil = psutil
            except ImportError:
                if use_psutil:
                    raise
        self._clk_tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cpu_prev: tuple[float, float] | None = None  # (busy, total) jiffies, /proc path
        self._lo_prev: tuple[float, int] | None = None  # (monotonic s, tx bytes)
        self._proc_prev: dict[int, tuple[float, float]] = {}  # pid -> (monotonic s, cpu seconds)
        self._ps_procs: dict[int, object] = {}
        self.pids: list[int] = []
        self.process_cpu_pct: dict[int, float | None] = {}
        self.set_pids(pids)
        self._overall_cpu_pct()  # prime the deltas so the next sample has a figure
        self._loopback_bytes_per_s()

    def available(self) -> bool:
        return True

    def set_pids(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.process_cpu_pct = {pid: None for pid in self.pids}
        self._proc_prev = {p: v for p, v in self._proc_prev.items() if p in self.pids}
        self._ps_procs = {p: v for p, v in self._ps_procs.items() if p in self.pids}
        for pid in self.pids:
            self._process_cpu_pct(pid)  # prime

    def sample(self) -> list[GpuSample]:
        sample = GpuSample(
            ts=time.time(), gpu=-1, cpu_pct=self._overall_cpu_pct(),
            host_memory_used_bytes=self._memory_used_bytes(), loopback_bytes_per_s=self._loopback_bytes_per_s(),
        )
        self.process_cpu_pct = {pid: self._process_cpu_pct(pid) for pid in self.pids}
        return [sample]

    def close(self) -> None:
        pass

    # ---------------------------------------------------------------- overall CPU
    def _overall_cpu_pct(self) -> float | None:
        if self._psutil is not None:
            first = self._cpu_prev is None
            self._cpu_prev = (0.0, 0.0)
            value = self._psutil.cpu_percent(interval=None)
            return None if first else float(value)
        text = _read(self.proc / "stat")
        if text is None:
            return None
        fields = [float(x) for x in text.splitlines()[0].split()[1:]]
        # user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
        total = sum(fields[:8])
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        busy = total - idle
        prev, self._cpu_prev = self._cpu_prev, (busy, total)
        if prev is None or total <= prev[1]:
            return None
        return max(0.0, min(100.0, 100.0 * (busy - prev[0]) / (total - prev[1])))

    # ---------------------------------------------------------------- per-process CPU
    def _process_cpu_pct(self, pid: int) -> float | None:
        now = self.clock()
        if self._psutil is not None:
            proc = self._ps_procs.get(pid)
            try:
                if proc is None:
                    proc = self._ps_procs[pid] = self._psutil.Process(pid)
                    proc.cpu_percent(None)
                    return None
                return float(proc.cpu_percent(None))
            except Exception:  # gone, or not ours to read
                self._ps_procs.pop(pid, None)
                return None
        text = _read(self.proc / str(pid) / "stat")
        if text is None:
            self._proc_prev.pop(pid, None)
            return None
        after_name = text[text.rfind(")") + 2:].split()
        cpu_s = (float(after_name[11]) + float(after_name[12])) / self._clk_tck  # utime + stime
        prev = self._proc_prev.get(pid)
        self._proc_prev[pid] = (now, cpu_s)
        if prev is None or now <= prev[0] or cpu_s < prev[1]:
            return None
        return 100.0 * (cpu_s - prev[1]) / (now - prev[0])

    # ---------------------------------------------------------------- memory
    def _memory_used_bytes(self) -> float | None:
        if self._psutil is not None:
            vm = self._psutil.virtual_memory()
            return float(vm.total - vm.available)
        text = _read(self.proc / "meminfo")
        if text is None:
            return None
        info = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = float(parts[0]) * 1024  # kB
        if "MemTotal" not in info or "MemAvailable" not in info:
            return None
        return info["MemTotal"] - info["MemAvailable"]

    # ---------------------------------------------------------------- loopback
    def _loopback_tx_bytes(self) -> int | None:
        if self._psutil is not None:
            try:
                counters = self._psutil.net_io_counters(pernic=True).get("lo")
            except Exception:
                return None
            return int(counters.bytes_sent) if counters is not None else None
        text = _read(self.proc / "net" / "dev")
        if text is None:
            return None
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])  # transmit bytes (on lo every byte sent is received)
        return None

    def _loopback_bytes_per_s(self) -> float | None:
        now, tx = self.clock(), self._loopback_tx_bytes()
        prev = self._lo_prev
        self._lo_prev = (now, tx) if tx is not None else None
        if tx is None or prev is None or now <= prev[0] or tx < prev[1]:
            return None
        return (tx - prev[1]) / (now - prev[0])
