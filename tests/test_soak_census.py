"""The soak's census (bench/soak.py): what counts as grown, and the GPU's figures from nvidia-smi
where NVML cannot start, or none at all on a box without a GPU."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "soak.py"


@pytest.fixture
def soak():
    spec = importlib.util.spec_from_file_location("pkb_soak_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectors import nvml

    def missing():
        raise ImportError("no pynvml here")

    monkeypatch.setattr(nvml, "load_nvml", missing)


def test_gpu_memory_grows_only_past_the_drivers_drift_and_everything_else_by_one(soak) -> None:
    before = {"processes": 10, "database bytes": 100, soak.GPU_MEMORY_KEY: 500, "MPS daemons": 0}
    drift = {"processes": 10, "database bytes": 9000, soak.GPU_MEMORY_KEY: 564, "MPS daemons": 0}
    assert soak.grown(before, drift) == []
    leak = {"processes": 11, "database bytes": 100, soak.GPU_MEMORY_KEY: 565, "MPS daemons": 1}
    assert soak.grown(before, leak) == ["processes", soak.GPU_MEMORY_KEY, "MPS daemons"]


def test_without_nvml_the_gpu_figures_come_from_nvidia_smi(soak, no_nvml, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\ncase "$1" in\n  --query-gpu=*) printf "1200\\n3\\n" ;;\n'
                    '  --query-compute-apps=*) printf "4242\\n4242\\n77\\n" ;;\nesac\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    figures = soak.gpu_census()
    assert figures[soak.GPU_MEMORY_KEY] == 1203
    assert figures["GPU compute processes"] == 2  # one process on two GPUs counts once
    assert "MPS daemons" in figures


def test_a_box_without_a_gpu_has_no_gpu_figures_and_the_census_still_works(soak, no_nvml, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    figures = soak.census(tmp_path / "runs.db")
    assert soak.GPU_MEMORY_KEY not in figures and "MPS daemons" not in figures
    assert figures["processes"] > 0


def test_open_files_names_what_was_opened_since(soak, tmp_path: Path) -> None:
    before = soak.open_files()
    path = tmp_path / "held-open"
    with open(path, "w"):
        now = soak.open_files()
    new = [target for fd, target in now.items() if before.get(fd) != target]
    assert new == [str(path)]
    assert str(path) not in soak.open_files().values()
