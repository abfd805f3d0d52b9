"""Host sampler, for machines without NVML (a laptop, CI): CPU, memory, loopback and NIC traffic.

One GpuSample per call with gpu = -1: overall CPU use (0..100 over all cores), host memory in use,
and loopback bytes/s (interface 'lo': what gloo moves between ranks on one machine); its ``ranks``
hold each rank process's CPU use (100 = one full core, as top shows it), for the pids given in rank
order (``set_pids``), also kept in ``process_cpu_pct``.

The kernel counts CPU time in 10 ms jiffies, so rates are taken over a sliding window of about
half a second whatever the sampling rate: at 100 Hz a 10 ms delta would read 0 % or 100 %.
Shared-memory traffic between processes is not measurable from outside them, so it is not shown.
NIC bytes/s (what crosses to other nodes, where NVML has nothing to say): the physical network
interfaces' counters (those with a device in /sys/class/net) plus InfiniBand ports' data counters
(/sys/class/infiniband/*/ports/*/counters, in 4-byte words: RDMA traffic, NCCL's over IB, never
shows in the interfaces' counters).
psutil is used when importable; otherwise the same counters come from /proc.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from collectors.sample import GpuSample, RankCpu

NO_GPU_REASON = "no NVIDIA GPU found"
WINDOW_S = 0.5  # rates span about this much time
MIN_CPU_SPAN_S = 0.05  # below this a CPU share is mostly jiffy rounding: not shown
MEMORY_EVERY_S = 0.5  # memory in use moves slowly; reading it costs as much as the rest together


class _Window:
    """Rates of cumulative counters over a sliding window of readings."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.readings: deque[tuple[float, tuple[float, ...]]] = deque()

    def add(self, t: float, values: tuple[float, ...] | None) -> tuple[float, tuple[float, ...]] | None:
        """Record a reading; return (seconds, increases) since the newest reading >= window_s old
        (or the oldest one kept). None without an earlier reading or when a counter went back."""
        if values is None:
            self.readings.clear()
            return None
        self.readings.append((t, values))
        while len(self.readings) >= 2 and self.readings[1][0] <= t - self.window_s:
            self.readings.popleft()
        t0, v0 = self.readings[0]
        if t <= t0:
            return None
        deltas = tuple(v - w for v, w in zip(values, v0, strict=False))
        if any(d < 0 for d in deltas):  # counter reset (e.g. a pid reused): start over
            self.readings.clear()
            self.readings.append((t, values))
            return None
        return t - t0, deltas


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
        proc_root: str | Path = "/proc", sys_root: str | Path = "/sys", clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reason = reason
        self.proc = Path(proc_root)
        self.sys = Path(sys_root)
        self.clock = clock
        self._psutil: Any = None
        if use_psutil is not False:
            try:
                import psutil

                self._psutil = psutil
            except ImportError:
                if use_psutil:
                    raise
        self._clk_tck = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._cpu = _Window()
        self._loopback = _Window()
        self._nic = _Window()
        self._procs: dict[int, _Window] = {}
        self._ps_procs: dict[int, Any] = {}
        self._memory: tuple[float, float | None] | None = None  # (read at, bytes)
        self.pids: list[int] = []
        self.process_cpu_pct: dict[int, float | None] = {}
        self.set_pids(pids)
        now = self.clock()
        self._cpu.add(now, self._cpu_jiffies())  # first readings, so the next sample has rates
        self._loopback.add(now, self._loopback_tx_bytes())
        self._nic.add(now, self._nic_bytes())

    def available(self) -> bool:
        return True

    def set_pids(self, pids: Iterable[int] | Mapping[int, int]) -> None:
        """The rank processes to follow: in rank order (pids[r] is rank r), or rank -> pid (a node
        of a multi-node batch follows only its own ranks)."""
        by_rank = dict(pids) if isinstance(pids, Mapping) else dict(enumerate(pids))
        self.rank_of = {pid: rank for rank, pid in sorted(by_rank.items())}
        self.pids = list(self.rank_of)
        self._procs = {p: self._procs.get(p) or _Window() for p in self.pids}
        self._ps_procs = {p: v for p, v in self._ps_procs.items() if p in self.pids}
        now = self.clock()
        for pid in self.pids:
            self._procs[pid].add(now, self._process_cpu_s(pid))
        self.process_cpu_pct = {pid: None for pid in self.pids}

    def sample(self) -> list[GpuSample]:
        now = self.clock()
        cpu_pct = None
        span = self._cpu.add(now, self._cpu_jiffies())
        if span is not None and span[0] >= MIN_CPU_SPAN_S and span[1][1] > 0:
            cpu_pct = max(0.0, min(100.0, 100.0 * span[1][0] / span[1][1]))
        loopback = None
        span = self._loopback.add(now, self._loopback_tx_bytes())
        if span is not None:
            loopback = span[1][0] / span[0]
        nic_tx = nic_rx = None
        span = self._nic.add(now, self._nic_bytes())
        if span is not None:
            nic_tx, nic_rx = span[1][0] / span[0], span[1][1] / span[0]
        process_cpu_pct: dict[int, float | None] = {}
        for pid in self.pids:
            span = self._procs[pid].add(now, self._process_cpu_s(pid))
            process_cpu_pct[pid] = 100.0 * span[1][0] / span[0] if span is not None and span[0] >= MIN_CPU_SPAN_S else None
        self.process_cpu_pct = process_cpu_pct
        return [GpuSample(
            ts=time.time(), gpu=-1, cpu_pct=cpu_pct, host_memory_used_bytes=self._memory_used(now),
            loopback_bytes_per_s=loopback, nic_tx_bytes_per_s=nic_tx, nic_rx_bytes_per_s=nic_rx,
            ranks=tuple(RankCpu(self.rank_of.get(pid, r), pid, process_cpu_pct[pid]) for r, pid in enumerate(self.pids)),
        )]

    def close(self) -> None:
        pass

    # ---------------------------------------------------------------- counters
    def _cpu_jiffies(self) -> tuple[float, float] | None:
        """(busy, total) CPU time of all cores, cumulative."""
        if self._psutil is not None:
            t = self._psutil.cpu_times()
            idle = t.idle + getattr(t, "iowait", 0.0)
            total = sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"))
            return total - idle, total
        text = _read(self.proc / "stat")
        if text is None:
            return None
        fields = [float(x) for x in text.splitlines()[0].split()[1:]]
        # user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
        total = sum(fields[:8])
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return total - idle, total

    def _process_cpu_s(self, pid: int) -> tuple[float] | None:
        """User + system CPU seconds of one process, cumulative; None if it is gone."""
        if self._psutil is not None:
            try:
                proc = self._ps_procs.get(pid)
                if proc is None:
                    proc = self._ps_procs[pid] = self._psutil.Process(pid)
                t = proc.cpu_times()
                return (t.user + t.system,)
            except Exception:  # gone, or not ours to read
                self._ps_procs.pop(pid, None)
                return None
        text = _read(self.proc / str(pid) / "stat")
        if text is None:
            return None
        after_name = text[text.rfind(")") + 2:].split()  # the name may hold spaces and parentheses
        return ((float(after_name[11]) + float(after_name[12])) / self._clk_tck,)  # utime + stime

    def _memory_used(self, now: float) -> float | None:
        if self._memory is None or now - self._memory[0] >= MEMORY_EVERY_S:
            self._memory = (now, self._memory_used_bytes())
        return self._memory[1]

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

    def _loopback_tx_bytes(self) -> tuple[float] | None:
        if self._psutil is not None:
            try:
                counters = self._psutil.net_io_counters(pernic=True).get("lo")
            except Exception:
                return None
            return (float(counters.bytes_sent),) if counters is not None else None
        text = _read(self.proc / "net" / "dev")
        if text is None:
            return None
        for line in text.splitlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return (float(rest.split()[8]),)  # transmit bytes (on lo every byte sent is received)
        return None

    def _nic_bytes(self) -> tuple[float, float] | None:
        return read_nic_bytes(self.proc, self.sys)


def read_nic_bytes(proc_root: str | Path = "/proc", sys_root: str | Path = "/sys") -> tuple[float, float] | None:
    """(transmitted, received) bytes so far over the physical interfaces and InfiniBand ports;
    None where there is neither."""
    proc, sys_ = Path(proc_root), Path(sys_root)
    tx = rx = 0.0
    found = False
    text = _read(proc / "net" / "dev")
    for line in (text or "").splitlines()[2:]:
        name, _, rest = line.partition(":")
        name = name.strip()
        fields = rest.split()
        if name == "lo" or len(fields) < 9 or not (sys_ / "class" / "net" / name / "device").exists():
            continue  # loopback and virtual interfaces (bridges, veth, tunnels) cross no wire
        rx, tx, found = rx + float(fields[0]), tx + float(fields[8]), True
    ports = sys_ / "class" / "infiniband"
    try:
        counters = sorted(ports.glob("*/ports/*/counters"))
    except OSError:
        counters = []
    for folder in counters:
        sent, got = _read(folder / "port_xmit_data"), _read(folder / "port_rcv_data")
        if sent is None or got is None:
            continue
        try:
            tx, rx, found = tx + 4 * float(sent), rx + 4 * float(got), True
        except ValueError:
            continue
    return (tx, rx) if found else None


NO_NIC_REASON = "no physical network interface or InfiniBand port counters on this host"


class NicTally:
    """A node's NIC bytes over a set of windows (one variant's timed blocks, interleaved with the
    other's): ``begin()`` just before a block, ``end(calls)`` just after, ``figures()`` at the end.
    Each read is one /proc/net/dev and sysfs pass (~0.1 ms), taken outside the timed window."""

    def __init__(self, read: Callable[[], tuple[float, float] | None] = read_nic_bytes) -> None:
        self._read = read
        self._start: tuple[float, float] | None = None
        self.tx_bytes = 0.0
        self.rx_bytes = 0.0
        self.calls = 0
        self.reason: str | None = None

    def begin(self) -> None:
        self._start = self._read() if self.reason is None else None
        if self._start is None and self.reason is None:
            self.reason = NO_NIC_REASON

    def end(self, calls: int) -> None:
        start, self._start = self._start, None
        if start is None:
            return
        end = self._read()
        if end is None or end[0] < start[0] or end[1] < start[1]:
            self.reason = "the NIC counters vanished or went back (reset) during timing"
            return
        self.tx_bytes += end[0] - start[0]
        self.rx_bytes += end[1] - start[1]
        self.calls += calls

    def figures(self) -> dict[str, Any]:
        """nic_tx_bytes / nic_rx_bytes over nic_iterations calls, or nic_reason (never zeros for "unknown")."""
        if self.reason is not None or self.calls == 0:
            return {"nic_reason": self.reason or "no timed block was counted"}
        return {"nic_tx_bytes": self.tx_bytes, "nic_rx_bytes": self.rx_bytes, "nic_iterations": self.calls}
