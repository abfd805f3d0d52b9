"""CPU-time and GPU-memory limits per candidate (engine.limits).

GPU memory: NVML is faked (CI has no GPU), as the collectors' tests do: the guard's sum over the
candidate's pids, the verdict past the limit, and the run's note where NVML cannot attribute memory
to the candidate's runner. CPU time: real processes; and a real batch (torchrun, gloo, two ranks)
whose candidate burns CPU in threads past a small --max-cpu-s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from collectors import nvml as N
from pkb_tui.engine import limits, procs
from pkb_tui.engine.limits import GIB, GpuMemory, GpuWatch, Limits, over_limit

ROOT = Path(__file__).resolve().parents[1]
BURNER = ROOT / "tests" / "fixtures" / "containment" / "cpu-burner"
HONEST = ROOT / "solutions" / "torch-p2p"
NOTHING = procs.Usage(0, 1, 1)


class FakeNvml:
    """The few pynvml calls GpuMemory makes; processes per GPU as (pid, bytes or None)."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    def __init__(self, compute: list[list[tuple[int, int | None]]],
                 mps: list[list[tuple[int, int | None]]] | None = None, init_error: int | None = None) -> None:
        self.compute, self.mps, self.init_error = compute, mps, init_error

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.compute)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    @staticmethod
    def _entries(rows: list[tuple[int, int | None]]) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in rows]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return self._entries(self.compute[handle])

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[Any]:
        if self.mps is None:
            raise self.NVMLError(N.NVML_ERROR_NOT_SUPPORTED)
        return self._entries(self.mps[handle])


RUNNER, CHILD, STRANGER = 4101, 4102, 999


def _limit(gib: float) -> Limits:
    return Limits(host_memory_bytes=64 * GIB, tasks=512, gpu_memory_bytes=int(gib * GIB))


def test_gpu_memory_over_the_limit_sums_the_candidates_processes_over_every_gpu() -> None:
    # The runner and a child it started, on two GPUs; a stranger's 50 GiB is not the candidate's.
    fake = FakeNvml([[(RUNNER, 3 * GIB), (CHILD, 3 * GIB), (STRANGER, 50 * GIB)], [(CHILD, 2 * GIB)]])
    watch = GpuWatch()
    used = watch.look(GpuMemory(fake), [RUNNER, CHILD], RUNNER, runner_alive=True)
    assert used == 8 * GIB
    verdict = over_limit(NOTHING, _limit(6), gpu_memory_bytes=used)
    assert verdict == "exceeded its GPU-memory limit: 8.0 GiB > 6.0 GiB (--max-gpu-memory-gib)"
    assert watch.note() is None  # the runner was listed with a figure: the limit holds


def test_gpu_memory_under_the_limit_passes() -> None:
    fake = FakeNvml([[(RUNNER, 3 * GIB), (STRANGER, 50 * GIB)]])
    used = GpuWatch().look(GpuMemory(fake), [RUNNER], RUNNER, runner_alive=True)
    assert used == 3 * GIB
    assert over_limit(NOTHING, _limit(6), gpu_memory_bytes=used) is None


def test_gpu_memory_under_mps_counts_the_clients_not_their_server() -> None:
    server = 777  # nvidia-cuda-mps-server holds every client's memory in the compute list
    fake = FakeNvml([[(server, 40 * GIB)]], mps=[[(RUNNER, 7 * GIB), (STRANGER, 30 * GIB)]])
    watch = GpuWatch()
    used = watch.look(GpuMemory(fake), [RUNNER], RUNNER, runner_alive=True)
    assert used == 7 * GIB and watch.attributed
    assert "7.0 GiB > 6.0 GiB" in (over_limit(NOTHING, _limit(6), gpu_memory_bytes=used) or "")


@pytest.mark.parametrize("fake, why", [
    # Another PID namespace (a container): NVML's pids are the host's, the runner is not among them.
    (FakeNvml([[(123456, 60 * GIB)]]), "NVML does not list the candidate's runner (pid 4101) among the 1 process"),
    # A VM that lists processes without their memory.
    (FakeNvml([[(RUNNER, None)]]), "NVML lists the candidate's runner without its memory"),
    # MPS clients listed under their server only.
    (FakeNvml([[(777, 40 * GIB)]], mps=[[]]), "MPS clients listed under their server"),
    # No NVML at all.
    (FakeNvml([], init_error=N.NVML_ERROR_LIBRARY_NOT_FOUND), "no NVIDIA driver found"),
])
def test_gpu_memory_nvml_cannot_attribute_to_the_runner_says_so_in_the_runs_notes(fake: FakeNvml, why: str) -> None:
    watch = GpuWatch()
    used = watch.look(GpuMemory(fake), [RUNNER, CHILD], RUNNER, runner_alive=True)
    assert used == 0
    assert over_limit(NOTHING, _limit(6), gpu_memory_bytes=used) is None
    note = watch.note()
    assert note is not None and note.startswith("GPU memory not limited: ") and why in note, note


def test_a_runner_seen_once_is_limited_and_a_dead_runner_says_nothing_of_nvml() -> None:
    fake = FakeNvml([[(RUNNER, 2 * GIB)]])
    watch = GpuWatch()
    watch.look(GpuMemory(fake), [RUNNER], RUNNER, runner_alive=True)
    fake.compute = [[]]  # the runner ended (killed, crashed): NVML no longer lists it
    watch.look(GpuMemory(fake), [RUNNER], RUNNER, runner_alive=False)
    assert watch.note() is None
    never = GpuWatch()
    never.look(GpuMemory(FakeNvml([[]])), [RUNNER], RUNNER, runner_alive=False)
    assert never.note() is None  # it died before a look: nothing learnt either way


def test_default_limits_follow_the_gpu_the_timeout_and_the_cores() -> None:
    h200 = 141 * GIB
    one = Limits.from_request(None, None, 8, timeout_s=300, cpu_count=128, gpu_total_bytes=h200, ranks_per_gpu=1)
    assert one.gpu_memory_bytes == int((h200 - 6 * GIB) / 2)  # 67.5 GiB beside the baseline and the judge
    shared = Limits.from_request(None, None, 8, timeout_s=300, cpu_count=128, gpu_total_bytes=h200, ranks_per_gpu=8)
    assert 5 * GIB < (shared.gpu_memory_bytes or 0) < 6 * GIB
    assert one.cpu_s == 600.0  # 16 cores a rank, at most 2 counted: 16 spinning threads stop at timeout/8
    small = Limits.from_request(None, None, 2, timeout_s=300, cpu_count=2)
    assert small.cpu_s == 300.0 and small.gpu_memory_bytes is None  # cpu mode: no GPU to limit
    given = Limits.from_request(None, None, 2, cpu_s=7, gpu_memory_gib=3, timeout_s=300, gpu_total_bytes=h200)
    assert (given.cpu_s, given.gpu_memory_bytes) == (7.0, 3 * GIB)
    assert "7 s of CPU time, 3.0 GiB of GPU memory" in given.describe()


def test_cpu_clock_counts_threads_children_reaped_and_processes_gone() -> None:
    """Real processes: a parent that burns CPU in a child it reaps (its cutime), then exits; its
    time stays counted after it is gone (the judge, not the candidate, reaps it)."""
    code = ("import os, time\n"
            "def burn(s):\n    end = time.process_time() + s\n    while time.process_time() < end: pass\n"
            "pid = os.fork()\nif pid == 0:\n    burn(0.6); os._exit(0)\n"
            "os.waitpid(pid, 0)\nburn(0.3)\nprint('done', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    clock = limits.CpuClock()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        seen = clock.update(procs.usage_of([proc.pid]).cpu)
        assert seen >= 0.85, seen  # 0.3 s its own + 0.6 s of the child it reaped
    finally:
        proc.kill()
        proc.wait()
    assert clock.update(procs.usage_of([proc.pid]).cpu) == seen  # gone: what it had is kept
    verdict = over_limit(NOTHING, Limits(64 * GIB, 512, cpu_s=0.5), cpu_s=clock.total_s)
    assert verdict is not None and "exceeded its CPU-time limit" in verdict and "> 0.5 s" in verdict


def test_cpu_clock_does_not_count_a_reaped_child_twice() -> None:
    parent, child = procs.CpuReading(10, 1, 1, 1.0), procs.CpuReading(11, 2, 10, 2.0)
    clock = limits.CpuClock()
    assert clock.update([parent, child]) == 3.0
    # The child exited and its parent (a candidate process) reaped it: its 2 s are in the parent's cutime now.
    assert clock.update([procs.CpuReading(10, 1, 1, 3.5)]) == 3.5
    # A process re-parented to the judge (a double fork) and gone: its last figure stays counted.
    escaped = procs.CpuReading(12, 3, os.getpid(), 4.0)
    clock.update([procs.CpuReading(10, 1, 1, 3.5), escaped])
    assert clock.update([procs.CpuReading(10, 1, 1, 3.5)]) == 7.5


@pytest.mark.timeout(900)
def test_a_candidate_burning_cpu_in_threads_is_stopped_at_its_cpu_time_limit(cli, tmp_db: Path, tmp_path: Path) -> None:
    result = cli("run", "--task", "all_reduce", "--model", f"{BURNER},{HONEST}", "--world-size", "2", "--mode", "cpu",
                 "--size", "small", "--trials", "2", "--no-timing", "--no-profile", "--timeout", "300",
                 "--runs-dir", str(tmp_path / "runs"), "--max-cpu-s", "4", "--json")
    runs = {r["model"]: r for r in result.json()["runs"]}
    burner = runs["cpu-burner"]
    assert burner["status"] == "error", burner
    assert "exceeded its CPU-time limit" in burner["status_detail"], burner["status_detail"]
    assert "> 4 s of CPU" in burner["status_detail"] and "(--max-cpu-s)" in burner["status_detail"]
    assert runs["torch-p2p"]["status"] == "passed", runs["torch-p2p"]
    notes = runs["torch-p2p"]["notes"]
    assert any("4 s of CPU time" in n and n.startswith("limits per candidate and rank") for n in notes), notes


def test_a_limit_that_is_not_positive_is_a_usage_error(cli, tmp_db: Path) -> None:
    result = cli("run", "--task", "all_reduce", "--model", str(HONEST), "--world-size", "2", "--mode", "cpu",
                 "--max-cpu-s", "0")
    assert result.code == 2, (result.code, result.err)
    assert "--max-cpu-s must be positive" in result.err
    result = cli("run", "--task", "all_reduce", "--model", str(HONEST), "--world-size", "2", "--mode", "cpu",
                 "--max-gpu-memory-gib", "-1")
    assert result.code == 2 and "--max-gpu-memory-gib must be positive" in result.err


def test_the_clock_reads_this_process() -> None:
    start = time.process_time()
    while time.process_time() - start < 0.2:
        pass
    (reading,) = procs.usage_of([os.getpid()]).cpu
    assert reading.pid == os.getpid() and reading.cpu_s >= 0.2
