"""The host sampler (psutil and /proc paths) and the Telemetry thread that picks a sampler."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from collectors.host import HostSampler
from collectors.replay import ReplayNvml
from collectors.telemetry import Telemetry
from pkb_tui.errors import PkbError
from pkb_tui.store.store import connect

TRACE = json.loads((Path(__file__).parent / "fixtures" / "nvml_trace.json").read_text())


class _NoDriver:
    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

    def nvmlInit(self):
        raise self.NVMLError(12)  # LIBRARY_NOT_FOUND


def write_proc(root: Path, *, busy: int, idle: int, lo_tx: int, pid_ticks: tuple[int, int], avail_kb: int) -> None:
    (root / "net").mkdir(parents=True, exist_ok=True)
    (root / "4242").mkdir(exist_ok=True)
    (root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (root / "meminfo").write_text(f"MemTotal:       16000000 kB\nMemFree:  1000 kB\nMemAvailable:   {avail_kb} kB\n")
    (root / "net" / "dev").write_text(
        "Inter-|   Receive |  Transmit\n face |bytes packets|bytes packets\n"
        f"    lo: {lo_tx} 10 0 0 0 0 0 0 {lo_tx} 10 0 0 0 0 0 0\n"
        "  eth0: 5 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n"
    )
    utime, stime = pid_ticks
    rest = " ".join(["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)] + ["0"] * 30)
    (root / "4242" / "stat").write_text(f"4242 (python worker) {rest}\n")


def test_proc_figures_are_exact_deltas(tmp_path):
    now = [100.0]
    write_proc(tmp_path, busy=1000, idle=3000, lo_tx=10_000, pid_ticks=(50, 50), avail_kb=4_000_000)
    host = HostSampler([4242], use_psutil=False, proc_root=tmp_path, clock=lambda: now[0])
    hz = os.sysconf("SC_CLK_TCK")
    now[0] = 102.0
    # +300 busy and +100 idle jiffies: 75% of all cores; the rank used 1.5 s of CPU in 2 s.
    write_proc(tmp_path, busy=1300, idle=3100, lo_tx=10_000 + 4_000_000, pid_ticks=(50 + int(1.0 * hz), 50 + int(0.5 * hz)),
               avail_kb=3_000_000)
    (sample,) = host.sample()
    assert sample.gpu == -1
    assert sample.cpu_pct == pytest.approx(75.0)
    assert sample.loopback_bytes_per_s == pytest.approx(2_000_000.0)
    assert sample.host_memory_used_bytes == (16_000_000 - 3_000_000) * 1024
    assert host.process_cpu_pct[4242] == pytest.approx(75.0)
    assert [(r.rank, r.pid, r.cpu_pct) for r in sample.ranks] == [(0, 4242, pytest.approx(75.0))]  # rank 0's process
    assert sample.nvlink_tx_bytes_per_s is None and sample.power_w is None  # no GPU figures, not zeros
    assert host.reason == "no NVIDIA GPU found"


def test_rates_span_half_a_second_whatever_the_sampling_rate(tmp_path):
    """At 100 Hz a 10 ms jiffy delta would read 0 % or 100 %; the window keeps it steady."""
    now = [0.0]
    busy, idle = 0, 0
    write_proc(tmp_path, busy=busy, idle=idle, lo_tx=0, pid_ticks=(0, 0), avail_kb=1)
    host = HostSampler(use_psutil=False, proc_root=tmp_path, clock=lambda: now[0])
    readings = []
    for tick in range(1, 101):  # 1 s at 100 Hz; one busy jiffy every 4th tick of one core (25 %)
        now[0] = tick * 0.01
        busy += 1 if tick % 4 == 0 else 0
        idle += 0 if tick % 4 == 0 else 1
        write_proc(tmp_path, busy=busy, idle=idle, lo_tx=tick * 1000, pid_ticks=(0, 0), avail_kb=1)
        (sample,) = host.sample()
        readings.append(sample.cpu_pct)
        assert sample.loopback_bytes_per_s == pytest.approx(100_000.0)
    assert readings[:4] == [None] * 4  # under 50 ms of history: no CPU share yet
    assert all(r == pytest.approx(25.0, abs=2.5) for r in readings[50:])


def test_a_missing_rank_process_gives_none(tmp_path):
    write_proc(tmp_path, busy=1, idle=1, lo_tx=1, pid_ticks=(1, 1), avail_kb=1)
    host = HostSampler([999_999], use_psutil=False, proc_root=tmp_path)
    host.sample()
    assert host.process_cpu_pct == {999_999: None}


@pytest.mark.parametrize("use_psutil", [True, False])
def test_the_real_host_is_readable(use_psutil):
    host = HostSampler([os.getpid()], use_psutil=use_psutil)
    started = time.monotonic()
    while time.monotonic() - started < 0.1:  # some CPU time, over more than a few jiffies
        sum(i * i for i in range(10_000))
    (sample,) = host.sample()
    assert sample.cpu_pct is None or 0.0 <= sample.cpu_pct <= 100.0
    assert sample.host_memory_used_bytes > 0
    assert sample.loopback_bytes_per_s is None or sample.loopback_bytes_per_s >= 0
    assert host.process_cpu_pct[os.getpid()] is not None


def test_telemetry_uses_nvml_when_it_sees_gpus_and_stamps_the_run(tmp_path):
    db = tmp_path / "runs.db"
    replay = ReplayNvml(TRACE)
    telemetry = Telemetry(db, interval_s=0.1, nvml=replay)
    assert telemetry.source == "nvml" and telemetry.reason is None
    assert telemetry.gpu_names[0] == "NVIDIA H100 80GB HBM3"
    telemetry.sample_once()
    telemetry.set_run(42)
    replay.step()
    telemetry.sample_once()
    telemetry.stop()
    assert set(telemetry.ring.latest_per_gpu()) == {-1, 0, 1, 2}
    conn = connect(db, readonly=True)
    stamped = conn.execute("SELECT gpu, run_id FROM samples WHERE run_id = 42 ORDER BY gpu").fetchall()
    assert [r["gpu"] for r in stamped] == [0, 1, 2]  # the host row is not due again within 100 ms
    assert conn.execute("SELECT COUNT(*) FROM link_samples WHERE run_id = 42").fetchone()[0] == 4 + 2
    assert replay.initialized == 0  # NVML released


def test_without_nvml_telemetry_says_plainly_there_is_no_gpu(tmp_path):
    telemetry = Telemetry(tmp_path / "runs.db", nvml=_NoDriver())
    try:
        assert telemetry.source == "host"
        assert telemetry.reason.startswith("no NVIDIA GPU found")
        assert "driver" in telemetry.reason
        samples = telemetry.sample_once()
        assert [s.gpu for s in samples] == [-1]
    finally:
        telemetry.stop()


def test_pkb_force_cpu_picks_the_host_sampler(tmp_path, monkeypatch):
    monkeypatch.setenv("PKB_FORCE_CPU", "1")
    telemetry = Telemetry(None, record=False, nvml=ReplayNvml(TRACE))
    assert telemetry.source == "host" and "PKB_FORCE_CPU" in telemetry.reason
    telemetry.stop()


def test_record_false_touches_no_database(tmp_path):
    telemetry = Telemetry(tmp_path / "runs.db", record=False, nvml=_NoDriver())
    telemetry.sample_once()
    telemetry.stop()
    assert not (tmp_path / "runs.db").exists()


def test_intervals_faster_than_100hz_are_refused():
    with pytest.raises(PkbError):
        Telemetry(None, interval_s=0.001, record=False, nvml=_NoDriver())


class _SlowGpu:
    """A sampler slower than the interval, recording how many samplings ever ran at once."""

    def __init__(self):
        self.active = 0
        self.most_active = 0
        self.calls = 0
        self.lock = threading.Lock()

    def sample(self):
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        time.sleep(0.03)
        with self.lock:
            self.active -= 1
            self.calls += 1
        return []

    def pcie_step_interval_s(self):
        return None  # no GPU read through its 32-bit PCIe counters

    def close(self):
        pass


def test_the_sampling_thread_never_overlaps_itself(tmp_path):
    telemetry = Telemetry(tmp_path / "runs.db", interval_s=0.01, nvml=_NoDriver())
    slow = _SlowGpu()
    telemetry.gpu = slow  # 30 ms per sampling against a 10 ms interval
    telemetry.start()
    deadline = time.monotonic() + 30
    while slow.calls < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    telemetry.stop()
    assert slow.calls >= 5
    assert slow.most_active == 1
    assert telemetry.error is None


def test_nic_bytes_come_from_physical_interfaces_and_infiniband_ports_not_loopback_or_bridges(tmp_path: Path) -> None:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    now = [10.0]

    def write(eth_rx: int, eth_tx: int, ib_words_tx: int, ib_words_rx: int) -> None:
        (proc / "net").mkdir(parents=True, exist_ok=True)
        (proc / "net" / "dev").write_text(
            "Inter-|   Receive |  Transmit\n face |bytes packets|bytes packets\n"
            "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n"
            f"  eth0: {eth_rx} 1 0 0 0 0 0 0 {eth_tx} 1 0 0 0 0 0 0\n"
            f" br-a1: {eth_rx * 7} 1 0 0 0 0 0 0 {eth_tx * 7} 1 0 0 0 0 0 0\n")
        counters = sys_root / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
        counters.mkdir(parents=True, exist_ok=True)
        (counters / "port_xmit_data").write_text(f"{ib_words_tx}\n")
        (counters / "port_rcv_data").write_text(f"{ib_words_rx}\n")

    (sys_root / "class" / "net" / "eth0" / "device").mkdir(parents=True)  # a physical NIC; br-a1 has no device
    write(1_000, 2_000, 100, 200)
    host = HostSampler(use_psutil=False, proc_root=proc, sys_root=sys_root, clock=lambda: now[0])
    now[0] = 12.0
    write(1_000 + 4_000_000, 2_000 + 2_000_000, 100 + 1_000_000, 200 + 500_000)
    (sample,) = host.sample()
    # 2 MB/s eth0 out + 4 x 1M words over 2 s from the IB port; the bridge and lo are not counted.
    assert sample.nic_tx_bytes_per_s == pytest.approx(1_000_000 + 2_000_000)
    assert sample.nic_rx_bytes_per_s == pytest.approx(2_000_000 + 1_000_000)
    bare = HostSampler(use_psutil=False, proc_root=tmp_path / "nothing", sys_root=tmp_path / "none")
    assert bare.sample()[0].nic_tx_bytes_per_s is None  # no counters: n/a, never 0
