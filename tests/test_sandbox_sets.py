"""What a runner may write (engine.sandbox.runner_writable): the sets probed on the H200."""

from __future__ import annotations

from pathlib import Path

from pkb_tui.engine.sandbox import runner_writable


def test_a_cpu_runner_writes_only_its_own_folders_and_proc_entry(tmp_path: Path) -> None:
    paths = runner_writable(tmp_path / "s", tmp_path / "j", "cpu", pid=4242)
    assert paths == [tmp_path / "s", tmp_path / "j", Path("/dev/null"), Path("/dev/zero"), Path("/dev/full"),
                     Path("/proc/4242")]


def test_a_gpu_runner_gets_device_files_and_shm_not_dev_or_proc(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("glob.glob", lambda pattern: {"/dev/nvidia*": ["/dev/nvidia0", "/dev/nvidiactl",
                                                                      "/dev/nvidia-caps"]}.get(pattern, []))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "mps"))
    alone = runner_writable(tmp_path / "s", tmp_path / "j", "cuda", pid=7)
    assert Path("/dev") not in alone and Path("/proc") not in alone and Path("/proc/1") not in alone
    # /dev/shm: torch's CUDA IPC (the judge's arena) opens files there for writing (H200, 2026-12-03).
    assert {Path("/dev/nvidia0"), Path("/dev/nvidiactl"), Path("/dev/nvidia-caps"), Path("/proc/7"),
            tmp_path / "mps", Path("/dev/shm")} <= set(alone)
