"""A killed CUDA runner's IPC file in /dev/shm is removed with it, and nobody else's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pkb_tui.engine.worker import _remove_ipc_files

SHM = Path("/dev/shm")


@pytest.mark.skipif(not SHM.is_dir() or not os.access(SHM, os.W_OK), reason="no writable /dev/shm")
def test_only_the_runners_own_cuda_ipc_files_go() -> None:
    dead, other = 4_000_000 + os.getpid() % 1000, 4_100_000 + os.getpid() % 1000  # above any real pid_max default
    mine = SHM / f"cuda.shm.{os.getuid()}.{dead:x}.1"
    theirs = SHM / f"cuda.shm.{os.getuid()}.{other:x}.1"
    torch_file = SHM / f"torch_{dead}_1_0"
    for path in (mine, theirs, torch_file):
        path.write_bytes(b"x")
    try:
        _remove_ipc_files(dead)
        assert not mine.exists()
        assert theirs.exists() and torch_file.exists()  # another pid's, and torch's (its owner unlinks them)
    finally:
        for path in (mine, theirs, torch_file):
            path.unlink(missing_ok=True)
