"""What a runner leaves behind: its CUDA IPC files in /dev/shm (cuda.shm.<uid>.<pid hex>.<n>, which
the driver leaves after its process exits: H200, driver 580), and lines in its output the harness caused."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pkb_tui.engine import procs

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir() or not os.access(SHM, os.W_OK), reason="no writable /dev/shm")


def _ipc_file(pid: int) -> Path:
    return SHM / f"cuda.shm.{os.getuid()}.{pid:x}.1"


def _dead_pids(count: int) -> list[int]:
    pids = [p for p in range(4_000_000 + os.getpid() % 1000, 4_200_000, 7919) if not procs.alive(p)]  # above pid_max
    return pids[:count]


def test_only_the_runners_own_cuda_ipc_files_go() -> None:
    dead, other = _dead_pids(2)
    mine, theirs, torch_file = _ipc_file(dead), _ipc_file(other), SHM / f"torch_{dead}_1_0"
    for path in (mine, theirs, torch_file):
        path.write_bytes(b"x")
    try:
        procs.remove_cuda_ipc_files(dead)
        assert not mine.exists()
        assert theirs.exists() and torch_file.exists()  # another pid's, and torch's (its owner unlinks them)
    finally:
        for path in (mine, theirs, torch_file):
            path.unlink(missing_ok=True)


def test_the_sweep_takes_dead_processes_files_of_this_batch_only() -> None:
    dead, dead_before = _dead_pids(2)
    started = time.time() - 1.0
    fresh_dead, live, old_dead = _ipc_file(dead), _ipc_file(os.getpid()), _ipc_file(dead_before)
    torch_dead, torch_live = SHM / f"torch_{dead}_123_0", SHM / f"torch_{os.getpid()}_123_0"
    for path in (fresh_dead, live, old_dead, torch_dead, torch_live):
        path.write_bytes(b"x")
    os.utime(old_dead, (started - 3600, started - 3600))  # before the batch: not ours to judge
    try:
        assert procs.sweep_cuda_ipc_files(since_s=started) >= 2
        assert not fresh_dead.exists() and not torch_dead.exists()
        assert live.exists() and old_dead.exists() and torch_live.exists()
    finally:
        for path in (fresh_dead, live, old_dead, torch_dead, torch_live):
            path.unlink(missing_ok=True)


def test_last_words_leave_out_the_namespace_s_host_name_warning(tmp_path: Path) -> None:
    """In the model's network namespace torch's c10d warns it cannot look up a peer's host name;
    that line is the harness's, not the candidate's last words."""
    from pkb_tui.engine.limits import OutputCapture

    capture = OutputCapture(tmp_path / "runner.log")
    os.write(capture.write_fd, b"CUDA error: an illegal memory access was encountered\n"
             b"[W1203 21:26:11.192786806 socket.cpp:207] [c10d] The hostname of the client socket cannot be "
             b"retrieved. err=-3\n")
    capture.close()
    assert capture.last_lines(2) == "CUDA error: an illegal memory access was encountered"
