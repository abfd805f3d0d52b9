"""Kernel classification on names from real traces, and profile_kernels on a real torch.profiler run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from collectors.profiler import classify_kernel, profile_kernels
from tests._dist import run_distributed

NAMES = json.loads((Path(__file__).parent / "fixtures" / "kernel_names.json").read_text())


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_every_recorded_name_gets_its_category(device_type):
    wrong = {
        name: (classify_kernel(name, device_type), expected)
        for name, expected in NAMES[device_type].items()
        if classify_kernel(name, device_type) != expected
    }
    assert wrong == {}


def test_library_namespace_decides_not_the_words_in_the_name():
    # torch's own symmetric-memory all-reduce is torch communication; the same words without a
    # library namespace are a candidate's kernel.
    assert classify_kernel("void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(float*)") == "communication"
    assert classify_kernel("one_shot_all_reduce_kernel") == "candidate"
    assert classify_kernel("void mylib::gemm_kernel<float>(float*)") == "candidate"


def _ops() -> None:
    a = torch.randn(256, 256)
    b = torch.randn(256, 256)
    c = a @ b
    d = c.clone()
    d.add_(1.0)


def test_profile_kernels_on_cpu_aggregates_operators(tmp_path):
    trace = tmp_path / "trace.json"
    rows = profile_kernels(_ops, iterations=3, device=torch.device("cpu"), trace_path=str(trace))
    by_name = {r["name"]: r for r in rows}
    assert by_name["aten::mm"]["calls"] == 3 and by_name["aten::mm"]["category"] == "compute"
    assert by_name["aten::copy_"]["category"] == "copy"
    assert [r["total_us"] for r in rows] == sorted((r["total_us"] for r in rows), reverse=True)
    assert sum(r["share_fraction"] for r in rows) == pytest.approx(1.0)
    for r in rows:
        assert r["mean_us"] == pytest.approx(r["total_us"] / r["calls"])
    assert trace.exists() and "aten::mm" in trace.read_text()


def _profile_gloo_step(rank: int, world_size: int) -> list[dict]:
    x = torch.randn(1 << 16)
    dist.all_reduce(x)  # warm-up outside the window, as the worker profiles after timing

    def step() -> None:
        y = x * 2.0
        dist.all_reduce(y)

    return profile_kernels(step, iterations=4, device=torch.device("cpu"))


def test_profile_kernels_sees_gloo_all_reduce_as_communication():
    for rows in run_distributed(2, _profile_gloo_step):
        by_name = {r["name"]: r for r in rows}
        assert by_name["gloo:all_reduce"]["category"] == "communication"
        assert by_name["gloo:all_reduce"]["calls"] == 4
        assert by_name["gloo:all_reduce"]["total_us"] > 0  # its span, not its (empty) self time
        assert by_name["aten::mul"]["category"] == "compute"
        communication = sum(r["share_fraction"] for r in rows if r["category"] == "communication")
        assert 0 < communication < 1
