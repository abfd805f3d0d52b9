"""Two batches on one box time each other: what else runs is named before a batch starts, and the
host's load is noted on the runs. Real processes; NVML is the one stand-in (no GPU in CI)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from collectors.contention import competing_load, host_load_note, other_batch_ranks
from collectors.nvml import Nvml


class _FakeProcess:
    def __init__(self, pid: int) -> None:
        self.pid = pid


class _FakeNvml:
    """Two GPUs; GPU 1 does not support the process query (as some MIG set-ups answer)."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[_FakeProcess]:
        if handle == "gpu1":
            raise self.NVMLError(3)  # NOT_SUPPORTED: n/a, not an exception
        return [_FakeProcess(4242), _FakeProcess(4243)]


def test_another_batchs_ranks_gpu_users_and_a_busy_cpu_are_named(tmp_path: Path) -> None:
    # A process whose command line says it is a pkb-tui rank, not started by us... as far as the
    # check knows: we pass another pid as "me".
    fake_rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "pkb_tui.engine.worker"])
    try:
        deadline = time.monotonic() + 30
        while b"pkb_tui.engine.worker" not in Path(f"/proc/{fake_rank.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the stand-in rank did not start"
            time.sleep(0.05)
        assert fake_rank.pid in other_batch_ranks(me=1)
        assert fake_rank.pid not in other_batch_ranks()  # our own child: our own batch
        warnings = competing_load(nvml_factory=lambda: Nvml(_FakeNvml()), load_average=lambda: 1000.0, me=1)
    finally:
        fake_rank.kill()
        fake_rank.wait()
    text = " | ".join(warnings)
    assert "another pkb-tui batch is running" in text
    assert "2 other process(es) use the GPUs (pid 4242, 4243)" in text
    assert "the CPU is busy (1-minute load average 1000.0" in text


def test_a_quiet_box_gets_no_warning_and_no_nvml_is_not_an_error() -> None:
    class NoNvml:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    gateway = Nvml(NoNvml())
    assert not gateway.available and gateway.reason and gateway.compute_pids() == set()
    # Other people's batches may be running on this very box: only they may be named.
    warnings = competing_load(nvml_factory=lambda: Nvml(NoNvml()), load_average=lambda: 0.0)
    assert all(w.startswith("another pkb-tui batch") for w in warnings), warnings


def test_the_host_load_is_noted_on_every_run_of_a_batch(cli, tmp_db: Path) -> None:
    from pkb_tui.store import Store

    result = cli("run", "--task", "all_reduce", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
                 "--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 0, result.err
    run = result.json()["runs"][0]
    assert any(note.startswith("host load during the batch: 1-minute load average") for note in run["notes"])
    assert not any(note.startswith("other processes held") for note in run["notes"])  # no GPU here: nothing to say
    with Store(tmp_db) as store:
        assert host_load_note().split(" at the end")[0].split(" average")[0] in " ".join(store.run(run["id"])["notes"])


class _ListedNvml(_FakeNvml):
    """One GPU whose compute processes are the pids given."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[_FakeProcess]:
        return [_FakeProcess(pid) for pid in self.pids]


def _stranger() -> int:
    """A real process that is not a descendant of this one (its parent shell exits): another job's."""
    out = subprocess.run(["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 30
    while b"sleep" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in process did not start"
        time.sleep(0.05)
    return pid


def _end(pid: int) -> None:
    import os
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_gpu_processes_leave_out_our_own_and_name_the_others() -> None:
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stranger = _stranger()
    gone = 2**22 + 12345  # above the usual pid_max: no such process here, as a pid of another namespace
    try:
        from collectors.contention import gpu_processes, gpu_sharing_note

        found = gpu_processes(nvml_factory=lambda: Nvml(_ListedNvml([own.pid, stranger, gone])))
        assert own.pid not in found  # our child: this batch's own
        assert found[stranger] == "sleep 120" and found[gone] == ""
        assert own.pid in gpu_processes(nvml_factory=lambda: Nvml(_ListedNvml([own.pid])), me=1)
        note = gpu_sharing_note(found, {stranger: "sleep 120"})
        assert note == (f"other processes held this host's GPUs beside the batch (at the start: pid {stranger} (sleep 120), "
                        f"{gone}; at the end: pid {stranger} (sleep 120)): the timings may include their work")
        assert gpu_sharing_note({}, {}) is None
    finally:
        own.kill()
        own.wait()
        _end(stranger)


def test_a_batch_beside_another_gpu_job_says_so_on_its_runs(cli, tmp_db: Path, monkeypatch) -> None:
    import collectors.contention as contention

    stranger = _stranger()
    monkeypatch.setattr(contention, "_nvml", lambda: Nvml(_ListedNvml([stranger])))
    try:
        result = cli("run", "--task", "all_reduce", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
                     "--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile", "--json")
    finally:
        _end(stranger)
    assert result.code == 0, result.err
    assert f"1 other process(es) use the GPUs (pid {stranger})" in result.err  # the warning before the batch
    notes = result.json()["runs"][0]["notes"]
    assert (f"other processes held this host's GPUs beside the batch (at the start: pid {stranger} (sleep 120); "
            f"at the end: pid {stranger} (sleep 120)): the timings may include their work") in notes
