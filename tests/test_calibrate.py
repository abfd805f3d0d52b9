"""Calibration on a machine without a GPU, and its bookkeeping with the GPU measurements stood in for."""

from __future__ import annotations

import io
import json

import pytest
import torch

from pkb_tui.engine import calibrate as cal
from pkb_tui.engine import roofline
from pkb_tui.errors import PkbError
from pkb_tui.store.store import Store


def test_calibrate_on_a_machine_without_a_gpu_says_so_and_exits_non_zero(tmp_path):
    assert not torch.cuda.is_available()  # CI and this machine: the CPU build of torch
    db = tmp_path / "runs.db"
    out = io.StringIO()
    code = cal.calibrate_command(str(db), as_json=False, quick=True, out=out)
    assert code != 0
    text = out.getvalue()
    assert "no GPU visible" in text and "nothing was measured" in text
    assert "Traceback" not in text
    assert not db.exists()  # nothing half-written


def test_calibrate_json_on_a_machine_without_a_gpu_is_one_json_error(tmp_path):
    out = io.StringIO()
    code = cal.calibrate_command(str(tmp_path / "runs.db"), as_json=True, quick=False, out=out)
    assert code != 0
    assert "no GPU visible" in json.loads(out.getvalue())["error"]


def test_calibrate_itself_raises_the_same_sentence(tmp_path):
    with Store(tmp_path / "runs.db") as store, pytest.raises(PkbError, match="nothing was measured"):
        cal.calibrate(store, store.upsert_host({"hostname": "h"}))


def test_host_facts_on_a_cpu_machine():
    facts = cal.host_facts()
    assert facts["hostname"] and facts["python_version"] and facts["torch_version"] == torch.__version__
    assert facts["gpu_count"] == 0 and facts["gpu_model"] is None


def test_host_facts_fit_the_hosts_table(tmp_path):
    facts = cal.host_facts()
    with Store(tmp_path / "runs.db") as store:
        assert store.upsert_host(facts) == store.upsert_host(facts)


class FakeNvml:
    """Two GPUs as NVML describes them; links answer per `nvlinks` (None: NOT_SUPPORTED)."""

    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, name: str, nvlinks: int | None, pcie_gen: int = 5) -> None:
        self.name, self.nvlinks, self.pcie_gen = name, nvlinks, pcie_gen
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.name

    def nvmlDeviceGetPciInfo(self, h):
        return type("Pci", (), {"busId": f"00000000:{0x19 + h:02X}:00.0".encode()})()

    def nvmlDeviceGetNvLinkState(self, h, link):
        if self.nvlinks is None:
            raise RuntimeError("Not Supported")
        if link >= self.NVML_NVLINK_MAX_LINKS:
            raise RuntimeError("Invalid Argument")
        return 1 if link < self.nvlinks else 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self.pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"


def test_nvml_topology_feeds_the_roofline_link_choice():
    sxm = cal._nvml_facts(FakeNvml("NVIDIA H200", nvlinks=18))
    assert sxm["gpu_model"] == "NVIDIA H200" and sxm["driver_version"] == "580.159.04"
    assert [g["nvlink_active_links"] for g in sxm["gpus"]] == [18, 18]
    host = {"gpu_model": sxm["gpu_model"], "gpu_count": 2, "topology": {"gpus": sxm["gpus"]}}
    bw = roofline.bandwidths_for(host, {}, "nccl", 2)
    assert bw.link_kind == "nvlink" and bw.link_gbps == 450.0 and "per topology" in bw.link_source

    pcie = cal._nvml_facts(FakeNvml("NVIDIA H100 PCIe", nvlinks=None, pcie_gen=5))
    assert [g["nvlink_active_links"] for g in pcie["gpus"]] == [0, 0]
    host = {"gpu_model": pcie["gpu_model"], "gpu_count": 2, "topology": {"gpus": pcie["gpus"]}}
    bw = roofline.bandwidths_for(host, {}, "nccl", 2)
    assert bw.link_kind == "pcie" and bw.link_gbps == roofline.PCIE_GENERATIONS[5].x16_gbps


def test_no_nvml_means_no_nvml_facts():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    assert cal._nvml_facts(Broken()) is None


@pytest.fixture
def two_fake_gpus(monkeypatch):
    """torch says two GPUs; the measurements (GPU-only) return fixed figures and count their calls."""
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cal, "measure_device_copy_gbps", lambda d, n: calls.append(("copy", d)) or 4300.0 + d)
    monkeypatch.setattr(cal, "measure_peer_copy_engine_gbps", lambda a, b, n: calls.append(("ce", a, b)) or 370.0)
    monkeypatch.setattr(cal, "measure_peer_sm_gbps", lambda a, b, n: calls.append(("sm", a, b)) or 395.0)
    sweep = [
        {"size_bytes": 16 * cal.MiB, "time_us": 150.0, "algbw_gbps": 111.8, "busbw_gbps": 111.8},
        {"size_bytes": 256 * cal.MiB, "time_us": 700.0, "algbw_gbps": 383.5, "busbw_gbps": 383.5},
    ]
    monkeypatch.setattr(cal, "measure_allreduce_sweep", lambda world, sizes, iterations=20: calls.append(("ar", world, sizes)) or sweep)
    return calls


def test_calibration_rows_land_where_the_roofline_reads_them(two_fake_gpus, tmp_path):
    with Store(tmp_path / "runs.db") as store:
        host = {"hostname": "box", "gpu_model": "NVIDIA H200", "gpu_count": 2, "topology": None}
        host_id = store.upsert_host(host)
        rows = cal.calibrate(store, host_id, quick=False)
        latest = store.latest_calibration(host_id)
    kinds = {r["kind"] for r in rows if r["bandwidth_gbps"] is not None}
    assert {"device_copy", "host_copy", "peer_copy_engine", "allreduce_busbw"} <= kinds
    assert latest["device_copy"] == 4301.0  # the best GPU's figure; each GPU's is in detail
    assert latest["peer_copy_engine:0-1"] == latest["peer_copy_engine:1-0"] == 370.0
    assert latest["allreduce_busbw"] == 383.5
    assert ("ar", 2, cal.DEFAULT_ALLREDUCE_SIZES) in two_fake_gpus
    assert latest["host_copy"] > 0  # really measured, on this CPU
    bw = roofline.bandwidths_for(host, latest, "nccl", 2)
    assert bw.memory_gbps == 4301.0 and "calibrated" in bw.memory_source
    assert bw.link_gbps == max(v for k, v in latest.items() if k.split(":")[0] in ("allreduce_busbw", "peer_sm", "peer_copy_engine"))


def test_quick_calibration_measures_less(two_fake_gpus, tmp_path):
    with Store(tmp_path / "runs.db") as store:
        cal.calibrate(store, store.upsert_host({"hostname": "box"}), quick=True)
    assert [c for c in two_fake_gpus if c[0] == "copy"] == [("copy", 0)]
    assert [c for c in two_fake_gpus if c[0] == "ce"] == [("ce", 0, 1)]
    assert ("ar", 2, cal.QUICK_ALLREDUCE_SIZES) in two_fake_gpus


def test_one_gpu_skips_the_pairs_and_the_sweep_with_reasons(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cal, "measure_device_copy_gbps", lambda d, n: 4310.0)
    monkeypatch.setattr(cal, "measure_allreduce_sweep", lambda *a, **k: pytest.fail("no sweep on one GPU"))
    with Store(tmp_path / "runs.db") as store:
        host_id = store.upsert_host({"hostname": "box"})
        rows = cal.calibrate(store, host_id, quick=True)
        stored = store.latest_calibration(host_id)
    skipped = {r["kind"]: r["skipped"] for r in rows if r["bandwidth_gbps"] is None}
    assert set(skipped) == {"peer_copy_engine", "peer_sm", "allreduce_busbw", "link_latency"}
    assert "one GPU" in skipped["allreduce_busbw"]
    assert set(stored) == {"device_copy", "host_copy"}  # skipped rows are not stored
    table = cal.format_table({"gpu_count": 1, "gpu_model": "NVIDIA H200"}, rows, cal.datasheet_for({"gpu_model": "NVIDIA H200", "gpu_count": 1}))
    assert "skipped" in table and "4310.0" in table and "4800.0" in table and "90%" in table
    assert "datasheet for device_copy: datasheet: NVIDIA H200" in table


def test_calibrate_refuses_a_timeout_that_only_the_network_measurement_reads(cli, tmp_path):
    db = tmp_path / "runs.db"
    result = cli("--db", str(db), "calibrate", "--noise-only", "--timeout", "5")
    assert result.code == 2
    assert "--timeout bounds the --network measurement" in result.err + result.out
    assert not db.exists()  # refused before anything was measured or written
    bad = cli("--db", str(db), "calibrate", "--network", "--nnodes", "2", "--timeout", "0")
    assert bad.code == 2 and "--timeout must be positive" in bad.err + bad.out


def test_the_noise_floor_self_check_tasks_are_picked_and_checked_before_anything_runs(cli, tmp_path):
    assert cal.noise_tasks_for("nccl") == ("all",)  # on a GPU every task
    assert cal.noise_tasks_for("cpu") == cal.NOISE_TASKS
    assert cal.noise_tasks_for("cpu", "all") == ("all",)
    assert cal.noise_tasks_for("nccl", "collectives") == cal.NOISE_TASKS
    assert cal.noise_tasks_for("cpu", " all_reduce, gather ,all_reduce") == ("all_reduce", "gather")
    db = tmp_path / "runs.db"
    bad = cli("--db", str(db), "calibrate", "--noise-only", "--noise-tasks", "all_reduce,no_such_task")
    assert bad.code == 2 and "Unknown task 'no_such_task'" in bad.err + bad.out
    assert not db.exists()  # refused before anything was measured or written
    empty = cli("--db", str(db), "calibrate", "--noise-only", "--noise-tasks", " , ")
    assert empty.code == 2 and "--noise-tasks takes all, collectives or task ids" in empty.err + empty.out
    pointless = cli("--db", str(db), "calibrate", "--no-noise", "--noise-tasks", "all")
    assert pointless.code == 2 and "leave it out with --no-noise" in pointless.err + pointless.out
    assert not db.exists()


def test_a_gpu_floor_from_fewer_than_every_task_says_it_may_under_read() -> None:
    assert cal.partial_floor_note("cpu", cal.NOISE_TASKS) is None  # cpu mode's default set
    assert cal.partial_floor_note("nccl", ("all",)) is None
    note = cal.partial_floor_note("nccl", cal.noise_tasks_for("nccl", "collectives"))
    assert note is not None and "from 8 task(s)" in note and "leave --noise-tasks out" in note
    assert "from 1 task(s)" in (cal.partial_floor_note("nccl", ("all_reduce",)) or "")
