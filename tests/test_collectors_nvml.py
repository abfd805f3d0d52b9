"""The NVML sampler against replayed counter sequences (tests/fixtures/nvml_trace.json).

Expected rates are worked out here from the trace's own numbers, independently of the sampler:
(value_after - value_before) * unit / (NVML timestamp difference).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collectors import nvml as N
from collectors.nvml import NvmlSampler, counter_rate, CounterValue, pcie_wrap_safe_s
from collectors.replay import ReplayNvml

TRACE_PATH = Path(__file__).parent / "fixtures" / "nvml_trace.json"


@pytest.fixture
def trace() -> dict:
    return json.loads(TRACE_PATH.read_text())


def run(trace: dict, ticks: int, **sampler_kw):
    """Sample once per tick; returns (samples per tick, replay, sampler)."""
    replay = ReplayNvml(trace)
    sampler = NvmlSampler(nvml=replay, clock=replay.clock, **sampler_kw)
    per_tick = []
    for k in range(ticks):
        per_tick.append({s.gpu: s for s in sampler.sample()})
        if k < ticks - 1:
            replay.step()
    return per_tick, replay, sampler


def field(trace: dict, gpu: int, tick: int, key: str) -> int:
    return trace["devices"][gpu]["ticks"][tick]["fields"][key]


def dt_s(trace: dict, gpu: int, a: int, b: int) -> float:
    ticks = trace["devices"][gpu]["ticks"]
    return (ticks[b]["t_us"] - ticks[a]["t_us"]) / 1e6


def test_each_link_is_read_with_its_own_scope_and_summed_per_gpu(trace):
    per_tick, replay, _ = run(trace, 3)
    gpu0 = per_tick[2][0]
    expected_links = {
        link: (field(trace, 0, 2, f"138:{link}") - field(trace, 0, 1, f"138:{link}")) * 1024 / dt_s(trace, 0, 1, 2)
        for link in range(4)
    }
    assert {l.link: l.tx_bytes_per_s for l in gpu0.links} == pytest.approx(expected_links)
    # Different links carry different traffic, so a sampler reading link 0 four times would be caught.
    assert len(set(expected_links.values())) == 4
    assert gpu0.nvlink_tx_bytes_per_s == pytest.approx(sum(expected_links.values()))
    expected_rx = sum(
        (field(trace, 0, 2, f"139:{l}") - field(trace, 0, 1, f"139:{l}")) * 1024 for l in range(4)
    ) / dt_s(trace, 0, 1, 2)
    assert gpu0.nvlink_rx_bytes_per_s == pytest.approx(expected_rx)
    # Every NVLink request names its link as scope; none is a bare (scope 0) read of another link.
    nvlink_requests = {r for batch in replay.field_requests for r in batch if r[0] in (138, 139)}
    assert {(138, l) for l in range(4)} <= nvlink_requests
    assert all(isinstance(r, tuple) and len(r) == 2 for batch in replay.field_requests for r in batch)


def test_a_bare_field_id_would_read_link_0_only(trace):
    """The trap the sampler avoids, shown on the replay: scope 0 is link 0, 0xFFFFFFFF is all links."""
    replay = ReplayNvml(trace)
    replay.nvmlInit()
    bare, all_links = replay.nvmlDeviceGetFieldValues(replay.nvmlDeviceGetHandleByIndex(0), [138, (138, N.SCOPE_ALL_LINKS)])
    assert bare.value.ullVal == field(trace, 0, 0, "138:0")
    assert all_links.value.ullVal == sum(field(trace, 0, 0, f"138:{l}") for l in range(4))


def test_only_active_links_are_sampled(trace):
    per_tick, _, sampler = run(trace, 2)
    assert sampler.gpu(1).links == [0, 2]  # link 1 of GPU 1 is down
    assert [l.link for l in per_tick[1][1].links] == [0, 2]


def test_a_counter_that_goes_backwards_gives_no_rate_for_that_interval(trace):
    per_tick, _, _ = run(trace, 7)
    at_reset = per_tick[5][0]  # link 2's TX counter reset between ticks 4 and 5
    link2 = next(l for l in at_reset.links if l.link == 2)
    assert link2.tx_bytes_per_s is None
    assert at_reset.nvlink_tx_bytes_per_s is None  # a partial sum would understate: no total
    assert at_reset.nvlink_rx_bytes_per_s is not None  # RX did not reset
    after = per_tick[6][0]
    link2_after = next(l for l in after.links if l.link == 2)
    expected = (field(trace, 0, 6, "138:2") - field(trace, 0, 5, "138:2")) * 1024 / dt_s(trace, 0, 5, 6)
    assert link2_after.tx_bytes_per_s == pytest.approx(expected)
    assert after.nvlink_tx_bytes_per_s is not None


def test_pcie_32bit_counters_are_unwrapped(trace):
    per_tick, replay, _ = run(trace, 6)
    # GPU 1 has no GPM, so its PCIe rates come from the counters; TX wraps between ticks 3 and 4.
    before, after = field(trace, 1, 3, "197:0"), field(trace, 1, 4, "197:0")
    assert after < before
    expected = ((after - before) % 2**32) / dt_s(trace, 1, 3, 4)
    assert per_tick[4][1].pcie_tx_bytes_per_s == pytest.approx(expected)
    assert per_tick[4][1].pcie_tx_bytes_per_s > 0
    # GPU 0 forced onto counters too: it wraps between ticks 2 and 3.
    per_tick, _, _ = run(trace, 4, pcie_counters=True)
    before, after = field(trace, 0, 2, "197:0"), field(trace, 0, 3, "197:0")
    assert after < before
    expected = ((after - before) % 2**32) / dt_s(trace, 0, 2, 3)
    # GPM is present on GPU 0 and its rate wins once it has one, so compare the counter maths directly.
    rate = counter_rate(
        CounterValue(0, before), CounterValue(int(dt_s(trace, 0, 2, 3) * 1e6), after), modulus=2**32,
    )
    assert rate == pytest.approx(expected)


def test_pcie_counters_are_not_read_where_gpm_gives_the_rates(trace):
    _, replay, sampler = run(trace, 3)
    assert sampler.gpu(0).pcie_counters is False  # GPM on: the ~320 us counter read is skipped
    assert sampler.gpu(1).pcie_counters is True
    batches_for_gpu0 = replay.field_requests  # all GPUs mixed; GPU 0's batches hold link 3
    assert not any((197, 0) in b and (138, 3) in b for b in batches_for_gpu0[-3:])
    assert "nvmlDeviceGetPcieThroughput" not in replay.calls


def test_unsupported_fields_are_none_never_zero(trace):
    per_tick, replay, sampler = run(trace, 4)
    h200 = per_tick[3][2]  # NVLink fields NOT_SUPPORTED and no link count
    assert sampler.gpu(2).links == []
    assert h200.nvlink_tx_bytes_per_s is None and h200.nvlink_rx_bytes_per_s is None
    assert h200.links == []
    a100 = per_tick[3][1]
    assert a100.temperature_c is None  # NOT_SUPPORTED on this GPU
    assert a100.dram_bw_util_pct is None and a100.tensor_active_pct is None  # no GPM
    # An unsupported call is asked once per GPU, not every sample.
    assert replay.calls["nvmlDeviceGetTemperature"] == 2 * 4 + 1


def test_gpm_rates_are_converted_from_mib_per_s_and_fill_pcie_sm_dram_tensor(trace):
    per_tick, _, _ = run(trace, 4)
    gpm = trace["devices"][0]["ticks"][3]["gpm"]
    h100 = per_tick[3][0]
    assert h100.pcie_tx_bytes_per_s == pytest.approx(gpm["20"] * 2**20)
    assert h100.pcie_rx_bytes_per_s == pytest.approx(gpm["21"] * 2**20)
    assert h100.sm_util_pct == gpm["2"]
    assert h100.dram_bw_util_pct == gpm["10"]
    assert h100.tensor_active_pct == gpm["5"]
    # NVLink keeps the per-link counters (exact, per sample) rather than GPM's totals.
    assert h100.nvlink_tx_bytes_per_s != pytest.approx(gpm["61"] * 2**20)
    h200 = per_tick[3][2]
    assert h200.pcie_rx_bytes_per_s == pytest.approx(57_344.0 * 2**20)
    assert h200.nvlink_tx_bytes_per_s is None  # GPM has no NVLink metrics there either
    # Before the first 100 ms GPM interval there is nothing yet: None, and NVML's utilisation stands in.
    assert per_tick[0][0].dram_bw_util_pct is None
    assert per_tick[0][0].sm_util_pct == trace["devices"][0]["ticks"][0]["util"][0]


def test_gpm_samples_are_at_least_100ms_apart_and_reused_in_between(trace):
    replay = ReplayNvml(trace)
    now = [0.0]
    sampler = NvmlSampler(nvml=replay, clock=lambda: now[0])
    replay.step(3)
    seen = []
    for _ in range(50):  # 100 Hz for 0.5 s
        now[0] += 0.01
        seen.append(sampler.sample()[0].dram_bw_util_pct)
    gpm_gpus = 2
    # One GPM sample per GPU at start, then one per 100 ms: 5 more in 0.5 s.
    assert replay.calls["nvmlGpmSampleGet"] == gpm_gpus * (1 + 5)
    assert all(v == trace["devices"][0]["ticks"][3]["gpm"]["10"] for v in seen[10:])


def test_a_counter_nvml_did_not_refresh_repeats_the_last_rate(trace):
    per_tick, _, _ = run(trace, 5)
    # GPU 1 link 0: tick 3 carries tick 2's timestamp and value.
    rates = [next(l for l in per_tick[k][1].links if l.link == 0).tx_bytes_per_s for k in (2, 3, 4)]
    expected = (field(trace, 1, 2, "138:0") - field(trace, 1, 1, "138:0")) * 1024 / dt_s(trace, 1, 1, 2)
    assert rates[0] == pytest.approx(expected)
    assert rates[1] == pytest.approx(expected)  # not None, not 0
    # Tick 4 spans ticks 2..4, the last refreshed reading.
    spanning = (field(trace, 1, 4, "138:0") - field(trace, 1, 2, "138:0")) * 1024 / dt_s(trace, 1, 2, 4)
    assert rates[2] == pytest.approx(spanning)


def test_gauges_are_converted_to_their_units(trace):
    per_tick, _, _ = run(trace, 2)
    tick = trace["devices"][0]["ticks"][1]
    s = per_tick[1][0]
    assert s.power_w == tick["power_mw"] / 1000
    assert s.memory_used_bytes == tick["memory_used_bytes"]
    assert s.sm_clock_mhz == tick["sm_clock_mhz"] and s.mem_clock_mhz == tick["mem_clock_mhz"]
    assert s.mem_util_pct == tick["util"][1]


def test_the_first_sample_has_no_rates_yet(trace):
    per_tick, _, _ = run(trace, 1)
    first = per_tick[0][0]
    assert first.nvlink_tx_bytes_per_s is None
    assert all(l.tx_bytes_per_s is None for l in first.links)


class _NoDriver:
    class NVMLError(Exception):
        def __init__(self, value):
            self.value = value

    def nvmlInit(self):
        raise self.NVMLError(N.NVML_ERROR_LIBRARY_NOT_FOUND)


def test_no_driver_means_unavailable_with_a_reason():
    sampler = NvmlSampler(nvml=_NoDriver())
    assert not sampler.available()
    assert "no NVIDIA driver" in sampler.reason
    assert sampler.sample() == []


def test_impossible_rates_are_dropped():
    assert counter_rate(CounterValue(0, 0), CounterValue(1_000, 10**12), max_bytes_per_s=1e12) is None
    assert counter_rate(CounterValue(5, 10), CounterValue(5, 20)) is None  # no time passed


def test_wrap_safe_window_matches_line_rate():
    # Gen5 x16 moves ~63 GB/s: 4 GiB takes ~68 ms; with the 10% margin ~61 ms.
    assert 0.055 < pcie_wrap_safe_s(5, 16) < 0.07
    assert pcie_wrap_safe_s(None, None) < pcie_wrap_safe_s(5, 16)


def test_abi_numbers_match_the_installed_nvidia_ml_py():
    pynvml = pytest.importorskip("pynvml")
    assert N.FI_NVLINK_DATA_TX_KIB == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    assert N.FI_NVLINK_DATA_RX_KIB == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    assert N.FI_PCIE_TX_BYTES == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    assert N.FI_PCIE_RX_BYTES == pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    assert N.FI_NVLINK_LINK_COUNT == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT
    assert N.GPM_PCIE_TX_PER_SEC == pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC
    assert N.GPM_PCIE_RX_PER_SEC == pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC
    assert N.GPM_NVLINK_TOTAL_TX_PER_SEC == pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    assert N.GPM_NVLINK_TOTAL_RX_PER_SEC == pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
    assert N.GPM_SM_UTIL == pynvml.NVML_GPM_METRIC_SM_UTIL
    assert N.GPM_DRAM_BW_UTIL == pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
    assert N.GPM_ANY_TENSOR_UTIL == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert (N.CLOCK_SM, N.CLOCK_MEM, N.TEMPERATURE_GPU) == (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_TEMPERATURE_GPU)
    assert N.NVML_ERROR_NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    for link in range(36):
        rx, tx = N.gpm_nvlink_link_metric_ids(link)
        assert rx == getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_L{link}_RX_PER_SEC")
        assert tx == getattr(pynvml, f"NVML_GPM_METRIC_NVLINK_L{link}_TX_PER_SEC")


def test_pcie_counters_read_too_far_apart_give_no_figure(trace):
    """Past the wrap-safe window a second wrap may hide in the delta: no figure rather than a wrong one."""
    replay = ReplayNvml(trace)
    sampler = NvmlSampler(nvml=replay, clock=replay.clock)
    sampler.sample()
    replay.step(3)  # 150 ms: beyond ~122 ms, Gen4 x16's wrap-safe window (GPU 1)
    assert sampler.sample()[1].pcie_tx_bytes_per_s is None
    replay.step(2)  # 100 ms: inside it again
    assert sampler.sample()[1].pcie_tx_bytes_per_s is not None


def test_a_recording_replays_to_the_same_rates(trace):
    """record_trace (run on the GPU box) writes what the replay reads: a recording can be a fixture."""
    from collectors.replay import record_trace

    class Stepping(ReplayNvml):
        def nvmlDeviceGetFieldValues(self, handle, requests):
            out = super().nvmlDeviceGetFieldValues(handle, requests)
            if handle.index == len(self.devices) - 1 and any(r[0] == 197 for r in requests):
                self.step()  # the recorder read every GPU: time moves on
            return out

    source = Stepping(trace)
    recorded = record_trace(source, ticks=5, interval_s=0.0, source="test")
    assert len(recorded["devices"]) == 3 and len(recorded["devices"][0]["ticks"]) == 5
    assert recorded["devices"][2]["unsupported_fields"] == [197, 198]  # the H200 stand-in has no PCIe counters
    original, _, _ = run(trace, 5)
    replayed, _, _ = run(recorded, 5)
    for k in range(1, 4):
        assert replayed[k][0].nvlink_tx_bytes_per_s == pytest.approx(original[k][0].nvlink_tx_bytes_per_s)
        assert [l.rx_bytes_per_s for l in replayed[k][1].links] == pytest.approx([l.rx_bytes_per_s for l in original[k][1].links])


def test_gpm_zero_nvlink_on_a_gpu_without_links_is_unavailable_not_idle(trace):
    # Seen on a one-GPU H200: NVLink fields answer NOT_SUPPORTED while GPM's NVLink totals read 0.
    for tick in trace["devices"][2]["ticks"]:
        if tick.get("gpm"):
            tick["gpm"]["60"] = tick["gpm"]["61"] = 0.0
    per_tick, _, _ = run(trace, 4)
    h200 = per_tick[3][2]
    assert h200.pcie_rx_bytes_per_s == pytest.approx(57_344.0 * 2**20)  # GPM still used for PCIe
    assert h200.nvlink_tx_bytes_per_s is None and h200.nvlink_rx_bytes_per_s is None


def test_a_real_h200_recording_replays_as_the_box_answered():
    # Recorded on the lent one-GPU H200 (bench/gpu_collectors_check.py part 7) during pinned
    # host-to-device copies at ~55 GB/s: NVML answers nothing for NVLink, GPM reads 0 for it.
    recorded = json.loads((TRACE_PATH.parent / "nvml_trace_h200_recorded.json").read_text())
    per_tick, _, sampler = run(recorded, 10)
    gpu = sampler.gpu(0)
    assert gpu.links == [] and not gpu.nvlink_counters
    busy = [per_tick[k][0] for k in range(3, 10)]
    assert all(s.nvlink_tx_bytes_per_s is None and s.nvlink_rx_bytes_per_s is None for s in busy)  # n/a, not 0
    assert all(50e9 < s.pcie_rx_bytes_per_s < 65e9 for s in busy)  # GPM, MiB/s -> B/s
    assert all(s.pcie_tx_bytes_per_s < s.pcie_rx_bytes_per_s / 5 for s in busy)
    # The 32-bit counters read 100 ms apart at 55 GB/s may have wrapped twice (Gen5's window is
    # ~61 ms): forced onto them, the sampler gives no PCIe rate rather than a wrong one.
    forced, _, _ = run(recorded, 10, gpm=False, pcie_counters=True)
    assert all(forced[k][0].pcie_rx_bytes_per_s is None for k in range(1, 10))


def test_pcie_steps_between_samples_keep_slow_samples_exact(trace):
    # The A100 stand-in (GPU 1: Gen4, no GPM) sampled every 150 ms, beyond its ~122 ms wrap-safe
    # window, with pcie_step() at each 50 ms tick in between (what the telemetry thread does):
    # the rate is the sum of the unwrapped steps over NVML's timestamps, TX wrap included.
    replay = ReplayNvml(trace)
    sampler = NvmlSampler(nvml=replay, clock=replay.clock)
    assert sampler.pcie_step_interval_s() == pytest.approx(pcie_wrap_safe_s(4, 16) / 2)  # only GPU 1 needs steps
    sampler.sample()  # tick 0
    reads = replay.calls["nvmlDeviceGetFieldValues"]
    sampler.pcie_step()  # tick 0 still: not due, nothing read
    assert replay.calls["nvmlDeviceGetFieldValues"] == reads
    for _ in range(2):
        replay.step()
        sampler.pcie_step()  # ticks 1 and 2: 50 ms each, not yet due at tick 1 (< 61 ms) ...
    replay.step(2)  # ... tick 4: a sample 200 ms after the first, TX wrapped between 3 and 4
    rate = sampler.sample()[1].pcie_tx_bytes_per_s
    steps = [0, 2, 4]
    expected = sum((field(trace, 1, b, "197:0") - field(trace, 1, a, "197:0")) % 2**32
                   for a, b in zip(steps, steps[1:])) / dt_s(trace, 1, 0, 4)
    assert rate == pytest.approx(expected)
    # The same 200 ms with no step in between: no figure (two wraps may hide in one delta).
    replay = ReplayNvml(trace)
    sampler = NvmlSampler(nvml=replay, clock=replay.clock)
    sampler.sample()
    replay.step(4)
    assert sampler.sample()[1].pcie_tx_bytes_per_s is None


def test_the_telemetry_thread_steps_the_pcie_counters_while_it_waits(trace):
    from collectors.telemetry import Telemetry
    import time

    telemetry = Telemetry(None, interval_s=1.0, record=False, nvml=ReplayNvml(trace))
    calls = []
    telemetry.gpu.pcie_step = lambda: calls.append(1)
    step = telemetry.gpu.pcie_step_interval_s()
    telemetry._wait_until(time.monotonic() + 2.5 * step)  # longer than a step: at least one is due
    assert calls
    telemetry.stop()
