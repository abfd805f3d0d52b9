"""Bytes per timed phase (PhaseCounters) against the replayed NVML, and the traffic flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors.counters import PhaseCounters, nvml_index_for_cuda_device, traffic_flag
from collectors.replay import ReplayNvml

TRACE = json.loads((Path(__file__).parent / "fixtures" / "nvml_trace.json").read_text())


def field(gpu: int, tick: int, key: str) -> int:
    return TRACE["devices"][gpu]["ticks"][tick]["fields"][key]


def phase(gpu: int, first: int, last: int, iterations: int = 10, *, ticks: bool = False, trace: dict = TRACE,
          **kw) -> dict:
    """Counters started at tick ``first`` and stopped at tick ``last`` on replayed GPU ``gpu``;
    with ``ticks``, PhaseCounters.tick() is called at every trace tick in between, as the timing
    loop calls it between iterations."""
    replay = ReplayNvml(trace)
    counters = PhaseCounters(gpu, nvml=replay, clock=replay.clock, **kw)
    assert counters.available()
    replay.step(first)
    counters.start()
    for _ in range(last - first):
        replay.step()
        if ticks and replay.cursor < last:
            counters.tick()
    return counters.stop(iterations)


def unwrapped_steps(gpu: int, key: str, first: int, last: int) -> int:
    return sum((field(gpu, t + 1, key) - field(gpu, t, key)) % 2**32 for t in range(first, last))


def test_nvlink_bytes_over_a_phase_sum_every_link():
    out = phase(0, 1, 3, iterations=10)
    tx = sum(field(0, 3, f"138:{l}") - field(0, 1, f"138:{l}") for l in range(4)) * 1024
    rx = sum(field(0, 3, f"139:{l}") - field(0, 1, f"139:{l}") for l in range(4)) * 1024
    assert out["nvlink_tx_bytes"] == tx and out["nvlink_rx_bytes"] == rx
    assert out["nvlink_bytes"] == max(tx, rx)  # the busier direction, as Traffic.wire_bytes counts
    assert out["nvlink_bytes_per_iter"] == pytest.approx(max(tx, rx) / 10)
    link1 = (field(0, 3, "138:1") - field(0, 1, "138:1") + field(0, 3, "139:1") - field(0, 1, "139:1")) * 1024
    assert out["links"][1] == link1
    assert out["elapsed_s"] == pytest.approx(0.1)


def test_a_short_phase_takes_pcie_from_the_unwrapped_counters():
    out = phase(0, 2, 3)  # 50 ms, inside Gen5's wrap-safe window; TX wraps in between
    assert field(0, 3, "197:0") < field(0, 2, "197:0")
    assert out["pcie_source"] == "counters"
    assert out["pcie_tx_bytes"] == (field(0, 3, "197:0") - field(0, 2, "197:0")) % 2**32
    assert out["pcie_rx_bytes"] == field(0, 3, "198:0") - field(0, 2, "198:0")


def test_a_long_phase_takes_pcie_from_gpm_where_a_second_wrap_was_possible():
    # 100 ms unticked: more than Gen5 x16 needs to wrap 4 GiB twice. GPM lags the traffic by
    # ~100-150 ms, so by default it is not trusted under 1 s: no figure, and why.
    out = phase(0, 1, 3)
    assert out["pcie_bytes"] is None and out["pcie_source"] is None
    assert "shorter than the 1.0 s" in out["reason"] and "wrap-safe" in out["reason"]
    out = phase(0, 1, 3, gpm_min_phase_s=0.1)  # as a phase of seconds would be treated
    gpm = TRACE["devices"][0]["ticks"][3]["gpm"]
    assert out["pcie_source"] == "gpm"
    assert out["pcie_tx_bytes"] == pytest.approx(gpm["20"] * 2**20 * 0.1, abs=1)
    assert out["pcie_rx_bytes"] == pytest.approx(gpm["21"] * 2**20 * 0.1, abs=1)


def test_without_gpm_a_long_phase_has_no_pcie_figure():
    assert phase(1, 1, 3)["pcie_source"] == "counters"  # 100 ms is inside Gen4's window
    out = phase(1, 0, 6)  # 300 ms on a GPU without GPM, never read in between
    assert out["pcie_bytes"] is None and out["pcie_source"] is None
    assert "wrap-safe" in out["reason"]
    assert out["nvlink_bytes"] is not None


def test_a_long_phase_read_in_steps_keeps_the_exact_pcie_counters():
    # 300 ms on the A100 stand-in (no GPM), read every 50 ms: exact, however many wraps in all.
    out = phase(1, 0, 6, ticks=True)
    assert out["pcie_source"] == "counters"
    assert out["pcie_tx_bytes"] == unwrapped_steps(1, "197:0", 0, 6)
    assert out["pcie_rx_bytes"] == unwrapped_steps(1, "198:0", 0, 6)
    # On the H100 stand-in the counters read in steps win over GPM's rates too; TX wraps at 2 -> 3.
    out = phase(0, 1, 3, ticks=True)
    assert out["pcie_source"] == "counters"
    assert out["pcie_tx_bytes"] == unwrapped_steps(0, "197:0", 1, 3)


def test_tick_reads_only_when_half_the_wrap_window_has_gone():
    replay = ReplayNvml(TRACE)
    counters = PhaseCounters(0, nvml=replay, clock=replay.clock)
    counters.start()
    reads = replay.calls.get("nvmlDeviceGetFieldValues", 0)
    for _ in range(5):
        counters.tick()  # the clock has not moved: nothing to read
    assert replay.calls.get("nvmlDeviceGetFieldValues", 0) == reads
    replay.step()  # 50 ms: past half of Gen5's ~61 ms window
    counters.tick()
    assert replay.calls["nvmlDeviceGetFieldValues"] == reads + 1
    assert replay.field_requests[-1] == [(197, 0), (198, 0)]  # PCIe only: NVLink's 64-bit counters need no steps


def test_a_counter_reset_inside_the_phase_gives_no_nvlink_figure():
    out = phase(0, 4, 6)  # link 2 TX resets between ticks 4 and 5
    assert out["nvlink_tx_bytes"] is None and out["nvlink_bytes"] is None
    assert out["links"][2] is None
    assert out["nvlink_rx_bytes"] is not None


def test_a_gpu_without_nvlink_says_so():
    out = phase(2, 1, 3, gpm_min_phase_s=0.1)
    assert out["nvlink_bytes"] is None and out["links"] == {}
    assert "NVLink" in out["reason"]
    assert out["pcie_source"] == "gpm"


def test_gpm_zero_nvlink_on_a_gpu_without_links_is_unavailable_not_idle():
    # Seen on a one-GPU H200: NVLink fields NOT_SUPPORTED, no link up, yet GPM's NVLink totals read 0.
    trace = json.loads(json.dumps(TRACE))
    for tick in trace["devices"][2]["ticks"]:
        if tick.get("gpm"):
            tick["gpm"]["60"] = tick["gpm"]["61"] = 0.0
    out = phase(2, 1, 3, trace=trace, gpm_min_phase_s=0.1)
    assert out["nvlink_tx_bytes"] is None and out["nvlink_bytes"] is None
    assert out["pcie_source"] == "gpm"


def test_no_gpu_gives_all_none():
    out = PhaseCounters(None).stop(5)
    assert out["nvlink_bytes"] is None and out["pcie_bytes"] is None and out["reason"]


def test_cuda_index_maps_to_nvml_index(monkeypatch):
    replay = ReplayNvml(TRACE)
    replay.nvmlInit()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert nvml_index_for_cuda_device(0, replay) == 2
    assert nvml_index_for_cuda_device(1, replay) == 0
    # A UUID beats the environment.
    assert nvml_index_for_cuda_device(0, replay, uuid="11111111-1111-1111-1111-111111111111") == 1


def test_the_flag_fires_below_the_model_and_on_waste_in_nccl_mode_only():
    model = 1_000_000
    assert traffic_flag(500_000, model, mode="nccl") == "below_model"
    assert traffic_flag(950_000, model, mode="nccl") is None  # inside the 10% tolerance
    assert traffic_flag(1_500_000, model, mode="nccl") is None
    assert traffic_flag(2_500_000, model, mode="nccl") == "wasteful"
    for mode in ("shared-gpu", "cpu"):
        assert traffic_flag(0, model, mode=mode) is None
        assert traffic_flag(10 * model, model, mode=mode) is None
    assert traffic_flag(None, model, mode="nccl") is None
    assert traffic_flag(123, 0, mode="nccl") is None


def test_blocks_of_a_phase_add_up_and_a_missing_block_spoils_the_sum():
    from collectors.counters import combine_phases

    a = phase(0, 1, 2, iterations=5)
    b = phase(0, 2, 3, iterations=5)
    whole = combine_phases([a, b], 10)
    assert whole["nvlink_tx_bytes"] == a["nvlink_tx_bytes"] + b["nvlink_tx_bytes"]
    assert whole["pcie_rx_bytes"] == a["pcie_rx_bytes"] + b["pcie_rx_bytes"] and whole["pcie_source"] == "counters"
    assert whole["links"][1] == a["links"][1] + b["links"][1]
    assert whole["nvlink_bytes_per_iter"] == pytest.approx(max(whole["nvlink_tx_bytes"], whole["nvlink_rx_bytes"]) / 10)
    reset = phase(0, 4, 6)  # link 2 TX resets in this block
    spoiled = combine_phases([a, reset], 15)
    assert spoiled["nvlink_tx_bytes"] is None and spoiled["links"][2] is None and spoiled["links"][1] is not None
    assert "backwards" in spoiled["reason"]
