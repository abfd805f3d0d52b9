"""Roofline maths, the datasheet table and the nccl-tests bus-bandwidth convention."""

from __future__ import annotations

import math

import pytest

from pkb_tui.engine import roofline
from pkb_tui.engine.roofline import Bandwidths, bandwidths_for, evaluate, lookup_gpu, nccl_tests_bus_factor
from tasks.base import Traffic, load_task

H200_HOST = {"gpu_model": "NVIDIA H200", "gpu_count": 8, "topology": None}


@pytest.mark.parametrize(
    "reported, key",
    [
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ],
)
def test_gpu_names_as_nvml_reports_them_find_their_datasheet_entry(reported, key):
    assert lookup_gpu(reported) is roofline.DATASHEET[key]


def test_an_unknown_gpu_has_no_entry():
    assert lookup_gpu("NVIDIA GeForce RTX 4090") is None
    assert lookup_gpu(None) is None


def test_every_datasheet_figure_names_its_source_and_is_plausible():
    for spec in roofline.DATASHEET.values():
        assert spec.source.startswith("datasheet: NVIDIA")
        assert 1000 <= spec.hbm_gbps <= 10000
        assert spec.tflops["bfloat16"] > spec.tflops["float32"] > spec.tflops["float64"]
        assert spec.pcie_generation in roofline.PCIE_GENERATIONS
    # NVLink figures are one direction: half the datasheet's bidirectional 900 GB/s on Hopper SXM.
    assert roofline.DATASHEET["H200 SXM"].nvlink_gbps == 450.0
    assert roofline.DATASHEET["B200"].nvlink_gbps == 900.0
    gens = roofline.PCIE_GENERATIONS
    assert gens[3].x16_gbps < gens[4].x16_gbps < gens[5].x16_gbps < gens[6].x16_gbps
    assert gens[5].x16_gbps == pytest.approx(2 * gens[4].x16_gbps)


def test_datasheet_used_when_nothing_is_calibrated_and_says_so():
    bw = bandwidths_for(H200_HOST, {}, "nccl", 8)
    assert bw.link_kind == "nvlink"
    assert bw.link_gbps == 450.0 and bw.memory_gbps == 4800.0
    assert "datasheet: NVIDIA H200" in bw.link_source and "assumed from the GPU model" in bw.link_source
    assert bw.memory_source.startswith("datasheet: NVIDIA H200")
    assert bw.peak_tflops["bfloat16"] == pytest.approx(989.5)


def test_calibrated_figures_win_and_the_source_says_when():
    calibration = {
        "device_copy": 4310.0, "peer_copy_engine:0-1": 371.0, "peer_sm:0-1": 402.5,
        "allreduce_busbw": 388.0,
    }
    bw = bandwidths_for(H200_HOST, calibration, "nccl", 8, calibrated_at=1_800_000_000)
    assert bw.memory_gbps == 4310.0
    assert bw.link_gbps == 402.5  # the best one-direction figure this host showed
    assert bw.memory_source.startswith("calibrated 20") and "device_copy" in bw.memory_source
    assert "peer_sm:0-1" in bw.link_source


def test_topology_without_nvlink_gives_the_pcie_generation():
    host = {
        "gpu_model": "NVIDIA H100 PCIe", "gpu_count": 2,
        "topology": {"gpus": [
            {"index": 0, "nvlink_active_links": 0, "pcie_max_generation": 4},
            {"index": 1, "nvlink_active_links": 0, "pcie_max_generation": 5},
        ]},
    }
    bw = bandwidths_for(host, {}, "nccl", 2)
    assert bw.link_kind == "pcie"
    assert bw.link_gbps == roofline.PCIE_GENERATIONS[4].x16_gbps  # the slower end limits the pair
    assert "PCIe Gen4" in bw.link_source


def test_shared_gpu_mode_uses_the_gpus_own_memory_as_the_link():
    bw = bandwidths_for({"gpu_model": "NVIDIA H200", "gpu_count": 1, "topology": None}, {"device_copy": 4300.0}, "shared-gpu", 4)
    assert bw.link_kind == "shared-device-memory"
    assert bw.link_gbps == bw.memory_gbps == 4300.0
    assert "share one GPU" in bw.link_source


def test_cpu_mode_claims_no_roofline_and_no_bus_bandwidth_and_says_what_it_is():
    bw = bandwidths_for({"gpu_model": None, "gpu_count": 0, "topology": None}, {"host_copy": 11.0}, "cpu", 2)
    assert bw.link_kind == "host-shared-memory"
    assert bw.memory_gbps is None and bw.link_gbps is None and bw.peak_tflops == {}
    result = evaluate(Traffic(4_000, 4_000, 8_000, flops=10**6, payload_bytes=4_000, bus_factor=1.0), 50.0, bw, "float32")
    assert result.floor_us is None and result.fraction is None and result.bus_bandwidth_gbps is None
    assert result.bandwidth_source.startswith("cpu: for development, not a measurement")


def test_unknown_gpu_without_calibration_has_no_figure_and_says_how_to_get_one():
    bw = bandwidths_for({"gpu_model": "Mystery GPU", "gpu_count": 2, "topology": None}, {}, "nccl", 2)
    assert bw.link_gbps is None and bw.memory_gbps is None
    assert "pkb-tui calibrate" in bw.memory_source
    result = evaluate(Traffic(100, 100, 100), 10.0, bw, "float32")
    assert result.floor_us is None and result.fraction is None and result.bound is None


def _bw(link: float | None, memory: float | None, tflops: float | None = None) -> Bandwidths:
    return Bandwidths(
        link_gbps=link, memory_gbps=memory, peak_tflops={"bfloat16": tflops} if tflops else {},
        link_source="L", memory_source="M", link_kind="nvlink", compute_source="C",
    )


def test_floor_is_the_largest_of_the_three_times():
    traffic = Traffic(send_bytes=450_000_000, recv_bytes=300_000_000, memory_bytes=960_000_000, flops=0)
    result = evaluate(traffic, 2000.0, _bw(450.0, 4800.0), "float32")
    # wire: 450e6 B / 450 GB/s = 1000 us; memory: 960e6 / 4800 GB/s = 200 us.
    assert result.bound == "wire"
    assert result.floor_us == pytest.approx(1000.0)
    assert result.fraction == pytest.approx(0.5)
    assert result.bandwidth_source == "L"
    assert result.terms_us["memory"] == pytest.approx(200.0)

    memory_bound = evaluate(Traffic(1000, 1000, 48_000_000_000), 20_000.0, _bw(450.0, 4800.0), "float32")
    assert memory_bound.bound == "memory" and memory_bound.floor_us == pytest.approx(10_000.0)
    assert memory_bound.bandwidth_source == "M"

    gemm = evaluate(Traffic(0, 0, 10**6, flops=2 * 8192**3), 1500.0, _bw(450.0, 4800.0, 989.5), "bfloat16")
    assert gemm.bound == "compute"
    assert gemm.floor_us == pytest.approx(2 * 8192**3 / 989.5e6)
    assert "bfloat16 peak" in gemm.bandwidth_source


def test_a_time_faster_than_the_floor_reads_above_one():
    result = evaluate(Traffic(4_500_000, 4_500_000, 0), 5.0, _bw(450.0, 4800.0), "float32")
    assert result.fraction == pytest.approx(2.0)


def test_no_time_gives_no_fraction():
    result = evaluate(Traffic(4_500, 4_500, 0, payload_bytes=4_500, bus_factor=1.0), float("nan"), _bw(450.0, 4800.0), "float32")
    assert result.floor_us is not None and result.fraction is None and result.bus_bandwidth_gbps is None


@pytest.mark.parametrize(
    "collective, n, factor",
    [
        ("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 2, 1.0), ("all_gather", 8, 7 / 8),
        ("reduce_scatter", 4, 3 / 4), ("all_to_all", 8, 7 / 8), ("broadcast", 8, 1.0), ("reduce", 4, 1.0),
        ("gather", 4, 3 / 4), ("scatter", 8, 7 / 8), ("all_reduce", 1, 0.0), ("broadcast", 1, 0.0), ("sendrecv", 1, 0.0),
    ],
)
def test_bus_factors_follow_nccl_tests(collective, n, factor):
    assert nccl_tests_bus_factor(collective, n) == pytest.approx(factor)


def test_unknown_collective_has_no_bus_factor():
    with pytest.raises(KeyError):
        nccl_tests_bus_factor("ring_attention", 4)


def test_all_reduce_bus_bandwidth_matches_nccl_tests_arithmetic():
    # nccl-tests: 1 GiB fp32 all-reduce at 8 ranks in 5000 us -> algbw 214.7 GB/s, busbw 375.8 GB/s.
    task = load_task("all_reduce")
    ctx = task.context(rank=0, world_size=8, dtype="float32", size="small")
    ctx.params["numel"] = 256 * 1024 * 1024
    traffic = task.traffic(ctx)
    result = evaluate(traffic, 5000.0, _bw(450.0, 4800.0), "float32")
    algbw = 2**30 / 5000e-6 / 1e9
    assert result.algo_bandwidth_gbps == pytest.approx(algbw)
    assert result.bus_bandwidth_gbps == pytest.approx(algbw * 2 * 7 / 8)
    # For all-reduce the bus bandwidth *is* the wire rate, so fraction = busbw / link.
    assert result.bound == "wire"
    assert result.fraction == pytest.approx(result.bus_bandwidth_gbps / 450.0, rel=1e-6)
    assert math.isclose(result.result_fields()["roofline_fraction"], result.fraction)


def test_float32_convolution_flops_count_at_the_tf32_rate_and_matmul_flops_do_not():
    bw = Bandwidths(link_gbps=450.0, memory_gbps=4800.0, peak_tflops={"float32": 67.0, "tf32": 494.7, "bfloat16": 989.5},
                    link_source="L", memory_source="M", link_kind="nvlink", compute_source="C")
    conv = evaluate(Traffic(0, 0, 0, flops=10**12, tf32_flops=10**12), 5000.0, bw, "float32")
    assert conv.terms_us["compute"] == pytest.approx(1e12 / 494.7e6)
    assert "TF32 convolutions" in conv.bandwidth_source
    mixed = evaluate(Traffic(0, 0, 0, flops=3 * 10**12, tf32_flops=10**12), 5000.0, bw, "float32")
    assert mixed.terms_us["compute"] == pytest.approx(2e12 / 67e6 + 1e12 / 494.7e6)
    # In bfloat16 the same FLOPs are bfloat16 tensor-core FLOPs: tf32_flops does not apply.
    bf16 = evaluate(Traffic(0, 0, 0, flops=10**12, tf32_flops=10**12), 5000.0, bw, "bfloat16")
    assert bf16.terms_us["compute"] == pytest.approx(1e12 / 989.5e6)


def test_pipeline_first_stage_does_no_input_gradient_gemm():
    task = load_task("pp_1f1b_exchange")
    first = task.traffic(task.context(rank=0, world_size=4, dtype="float32", size="default"))
    inner = task.traffic(task.context(rank=1, world_size=4, dtype="float32", size="default"))
    m, t, h = 16, 2048, 4096
    assert first.flops == 4 * m * t * h * h + 20 * m * t * h
    assert inner.flops == 6 * m * t * h * h + 20 * m * t * h


def test_a_runs_stored_traffic_keeps_the_tf32_share(cli, tmp_db):
    # The launcher folds the ranks' models into one; the TF32 share of the FLOPs must survive it.
    result = cli("run", "--task", "stencil_halo_exchange", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
                 "--size", "small", "--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 0, result.err
    traffic = result.json()["runs"][0]["baseline"]["traffic"]
    assert traffic["flops"] > 0 and traffic["tf32_flops"] == traffic["flops"]


def _nvlink_bw(alpha: float | None = 2.0) -> Bandwidths:
    return Bandwidths(link_gbps=450.0, memory_gbps=4800.0, peak_tflops={}, link_source="L", memory_source="M",
                      link_kind="nvlink", latency_us=alpha, latency_source="A")


def test_a_small_message_has_a_latency_floor_not_zero_percent():
    # 40 kB all-reduce share: 40e3 B / 450 GB/s = 0.089 us of bytes, 2 us of latency
    result = evaluate(Traffic(40_000, 40_000, 0), 10.0, _nvlink_bw(), "float32")
    assert result.bound == "latency"
    assert result.floor_us == pytest.approx(2.0 + 40_000 / 450e3)
    assert result.latency_us == 2.0 and result.result_fields()["roofline_latency_us"] == 2.0
    assert result.fraction == pytest.approx(result.floor_us / 10.0)
    assert "latency 2 us x 1 message(s): A" in result.bandwidth_source


def test_declared_messages_multiply_the_latency_and_big_messages_stay_wire_bound():
    chain = evaluate(Traffic(1_000, 1_000, 0, messages=3), 100.0, _nvlink_bw(), "float32")
    assert chain.latency_us == 6.0 and chain.floor_us == pytest.approx(6.0 + 1_000 / 450e3)
    big = evaluate(Traffic(450_000_000, 450_000_000, 0), 2000.0, _nvlink_bw(), "float32")
    assert big.bound == "wire" and big.floor_us == pytest.approx(1002.0)


def test_latency_is_calibrated_when_measured_else_a_default_said_to_be_one():
    default = bandwidths_for(H200_HOST, {}, "nccl", 8)
    assert default.latency_us == roofline.DEFAULT_LINK_LATENCY_US
    assert "no datasheet" in default.latency_source and "pkb-tui calibrate" in default.latency_source
    measured = bandwidths_for(H200_HOST, {}, "nccl", 8, latency={"latency_us": 3.5, "measured_at": 1_800_000_000})
    assert measured.latency_us == 3.5 and measured.latency_source.startswith("calibrated 20")
    one_rank = bandwidths_for(H200_HOST, {}, "nccl", 1)
    assert one_rank.latency_us is None  # nothing crosses a link


def test_every_task_takes_its_bus_factor_from_the_one_function_and_it_is_zero_at_one_rank():
    from tasks.base import BUS_FACTOR_KINDS, all_tasks, bus_factor

    at_one = []
    for task in all_tasks().values():
        for n in (1, 2, 4, 8):
            try:
                task.check_request(world_size=n, mode="nccl", dtype=task.spec.dtypes[0], size="small")
            except Exception:
                continue
            traffic = task.traffic(task.context(rank=0, world_size=n, dtype=task.spec.dtypes[0], size="small"))
            assert traffic.bus_factor in {bus_factor(k, n) for k in BUS_FACTOR_KINDS}, (task.id, n)
            if n == 1:
                at_one.append(task.id)
                assert traffic.bus_factor == 0.0, task.id
                result = evaluate(traffic, 10.0, _nvlink_bw(), task.spec.dtypes[0])
                assert result.bus_bandwidth_gbps is None, task.id
    assert "all_reduce" in at_one and "broadcast" in at_one


def test_pipelines_declare_their_chain_of_dependent_messages():
    forward = load_task("pp_send_recv_microbatches")
    one_f_one_b = load_task("pp_1f1b_exchange")
    assert forward.traffic(forward.context(rank=0, world_size=4, dtype="float32", size="small")).messages == 3
    assert one_f_one_b.traffic(one_f_one_b.context(rank=0, world_size=4, dtype="float32", size="small")).messages == 6
    assert load_task("all_reduce").traffic(load_task("all_reduce").context(rank=0, world_size=4, dtype="float32",
                                                                           size="small")).messages == 1
