"""Issue 16, per node: Live's node lines during a multi-node batch and the wire bytes per node
against the traffic model.

The Live tests replay a two-node batch through the app's own path: the messages the batch thread
posts (BatchBegan, then EngineEvent for each engine event), with the head's NodeStatus events built
by the launcher's own function (nodes.live_node) from telemetry samples, as the launcher does once
a second. A fixed clock makes the heartbeat ages exact."""

from __future__ import annotations

import asyncio

import pytest

from collectors.sample import GpuSample, LinkSample
from pkb_tui.app import PkbApp
from pkb_tui.app.messages import BatchBegan, EngineEvent
from pkb_tui.engine import events as ev
from pkb_tui.engine.nodes import LATE_AFTER_S, live_node, node_wire, rank_nodes_of
from pkb_tui.engine.request import RunRequest
from pkb_tui.engine.topology import Topology
from pkb_tui.store import Store
from pkb_tui.store.store import node_wire_line, node_wire_lines
from tests.app_fixtures import FIXED_NOW, app_config, screen_text, seed_runs

ITEMS = [("all_reduce", "torch-p2p"), ("all_gather", "torch-p2p")]


def _gpu(gpu: int, tx: float, ts: float = FIXED_NOW - 0.2) -> GpuSample:
    return GpuSample(ts=ts, gpu=gpu, nvlink_tx_bytes_per_s=tx, nvlink_rx_bytes_per_s=tx * 0.5,
                     pcie_tx_bytes_per_s=1e8, pcie_rx_bytes_per_s=1e8, links=[LinkSample(0, tx, tx * 0.5)])


def _host(nic: float | None, ts: float = FIXED_NOW - 0.2) -> GpuSample:
    return GpuSample(ts=ts, gpu=-1, cpu_pct=40.0, nic_tx_bytes_per_s=nic, nic_rx_bytes_per_s=None if nic is None else nic / 2)


def node_status(node1_heard_ago_s: float) -> ev.NodeStatus:
    """What the head says about a batch on two nodes: itself on a CPU box (no GPU, no NIC
    counters), node 1 with two NVLink GPUs and a NIC, last heard ``node1_heard_ago_s`` ago."""
    head = live_node(0, "head-box", FIXED_NOW, {-1: _host(None)})
    other = live_node(1, "gpu-node-b", FIXED_NOW - node1_heard_ago_s,
                      {0: _gpu(0, 150e9), 1: _gpu(1, 50e9), -1: _host(2.5e9)})
    return ev.NodeStatus(ts=FIXED_NOW, node_timeout_s=20.0, nodes=[head, other])


def two_node_events(node1_heard_ago_s: float = 0.4) -> list[tuple[ev.Event, int | None]]:
    return [
        (ev.BatchStarted(world_size=4, mode="cpu", rank_pids=[11, 12, 21, 22], rank_nodes=[0, 0, 1, 1]), None),
        (ev.RunStarted(item=0, task="all_reduce", model="torch-p2p", trials=1), 1),
        (ev.Progress(item=0, phase="timing", variant="candidate"), 1),
        (node_status(node1_heard_ago_s), None),
    ]


@pytest.fixture
def make_app(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "runs.db"
    seed_runs(db)

    def make() -> PkbApp:
        return PkbApp(config=app_config(db))

    return make


async def replay(pilot, events: list[tuple[ev.Event, int | None]], world_size: int = 4) -> None:
    """Post what the batch thread posts while a batch runs, then show Live."""
    app = pilot.app
    await pilot.app.workers.wait_for_complete()
    app.batch.busy = True
    request = RunRequest(tasks=[t for t, _ in ITEMS], models=["torch-p2p"], world_size=world_size, mode="cpu")
    app.post_message(BatchBegan(ITEMS, request))
    for event, run_id in events:
        app.post_message(EngineEvent(event, run_id))
    await pilot.pause(0.1)
    await pilot.press("v")
    await pilot.pause(0.6)


def test_live_shows_each_node_with_its_host_heartbeat_links_and_nics(make_app) -> None:
    app = make_app()

    async def main() -> str:
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot, two_node_events(0.4))
            text = screen_text(app)
        return text

    text = asyncio.run(main())
    (head,) = [line for line in text.splitlines() if "head-box" in line]
    (other,) = [line for line in text.splitlines() if "gpu-node-b" in line]
    assert "head" in head and "n/a: no GPU sampled on this node" in head and "n/a: no NIC counters" in head
    # node 1: two GPUs summed (150 + 50 GB/s out, half that in), its NIC out / in
    assert "0.4 s ago" in other and "200 GB/s / 100 GB/s (2 GPUs)" in other and "2.5 GB/s / 1.25 GB/s" in other
    assert "silent" not in text


def test_a_late_node_reads_silent_for_n_seconds_and_lost_past_the_node_timeout(make_app) -> None:
    app = make_app()

    async def main() -> str:
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot, two_node_events(LATE_AFTER_S + 4))
            late = screen_text(app)
            app.post_message(EngineEvent(node_status(25.0), None))
            await pilot.pause(0.6)
            lost = screen_text(app)
        return late + "\n=====\n" + lost

    late, lost = asyncio.run(main()).split("\n=====\n")
    assert f"silent for {LATE_AFTER_S + 4:.0f} s" in late
    assert "silent 25 s: lost" in lost


def test_a_one_node_batch_shows_no_node_lines(make_app) -> None:
    app = make_app()

    async def main() -> str:
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot, two_node_events()[:3], world_size=2)
            text = screen_text(app)
        return text

    text = asyncio.run(main())
    assert "GPU links out / in" not in text and "all_reduce" in text


def test_live_with_two_nodes(make_app, snap_compare) -> None:
    app = make_app()

    async def running(pilot):
        await replay(pilot, two_node_events(LATE_AFTER_S + 2))

    assert snap_compare(app, run_before=running, terminal_size=(100, 30))


# ------------------------------------------------------------------------------------ wire bytes per node
def test_node_wire_sums_each_nodes_gpus_and_takes_its_nic_against_the_models_on_and_off_node_share() -> None:
    from tasks.base import Traffic

    topology = Topology.of(4, 2)
    # an all-reduce of 1 MB at 4 ranks: each rank sends and receives 2(n-1)/n of it
    wire = 2 * 3 * 10**6 // 4
    traffic = [Traffic(send_bytes=wire, recv_bytes=wire, memory_bytes=0)] * 4
    per_rank = [
        {"nvlink_bytes_per_iter": 600_000.0, "nic_tx_bytes": 2_000_000.0, "nic_rx_bytes": 1_000_000.0, "nic_iterations": 2},
        {"nvlink_bytes_per_iter": 400_000.0},
        {"nvlink_bytes_per_iter": None, "reason": "NVML counts no NVLink traffic on this GPU", "nic_reason": "no NICs"},
        {"nvlink_bytes_per_iter": None, "reason": "NVML counts no NVLink traffic on this GPU"},
    ]
    rows = node_wire(per_rank, rank_nodes_of([0, 0, 1, 1], topology), {0: "a", 1: "b"}, topology, traffic, "nccl")
    first, second = rows
    assert first["ranks"] == [0, 1] and first["link_bytes_per_iter"] == 1_000_000.0
    assert (first["nic_tx_bytes_per_iter"], first["nic_rx_bytes_per_iter"]) == (1_000_000.0, 500_000.0)
    share = topology.cross_node_share()  # 2 of a rank's 3 peers are on the other node
    assert share == pytest.approx(2 / 3)
    assert first["model_on_node_bytes_per_iter"] == pytest.approx(2 * wire / 3)
    assert first["model_off_node_send_bytes_per_iter"] == pytest.approx(2 * wire * 2 / 3)
    # What was not counted is n/a with its reason, never 0.
    assert second["link_bytes_per_iter"] is None and "no NVLink" in second["link_na"]
    assert second["nic_tx_bytes_per_iter"] is None and second["nic_na"] == "no NICs"
    line = node_wire_line("candidate", second)
    assert "GPU links n/a: NVML counts no NVLink" in line and "NIC n/a: no NICs" in line and " 0 B" not in line
    assert "(model 1 MB, 1.00x)" in node_wire_line("baseline", first)
    # Ranks that sent no figures at all (cpu mode): n/a, and no model without a traffic model.
    cpu = node_wire([], rank_nodes_of(None, topology), {0: "a", 1: "a"}, topology, None, "cpu")
    assert all(r["link_na"] == "no GPU: cpu mode" and r["model_na"] and "loopback" in r["note"] for r in cpu)


def test_node_wire_is_stored_with_the_result_and_read_back(tmp_path) -> None:
    topology = Topology.of(4, 2)
    rows = node_wire([{"nvlink_bytes_per_iter": 1.0}] * 4, [0, 0, 1, 1], {0: "a", 1: "b"}, topology, None, "nccl")
    (run_id, *_) = seed_runs(tmp_path / "runs.db")
    with Store(tmp_path / "runs.db") as store:
        store.add_result(run_id, "candidate", {"median_us": 10.0, "node_wire": rows})
        run = store.run(run_id)
    assert run["results"]["candidate"]["node_wire"] == rows
    assert [line.split(":")[0] for line in node_wire_lines(run)] == ["wire per call, node 0 (a) candidate",
                                                                      "wire per call, node 1 (b) candidate"]


def test_the_result_screen_and_show_say_each_nodes_wire_bytes_against_the_model(tmp_path, monkeypatch, cli) -> None:
    from tasks.base import Traffic

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "runs.db"
    ids = seed_runs(db)
    topology = Topology.of(4, 2)
    traffic = [Traffic(send_bytes=3_000_000, recv_bytes=3_000_000, memory_bytes=0)] * 4
    per_rank = [{"nvlink_bytes_per_iter": 1e6, "nic_tx_bytes": 4e6, "nic_rx_bytes": 4e6, "nic_iterations": 2},
                {"nvlink_bytes_per_iter": 1e6}, {"nic_reason": "no physical network interface"}, {}]
    wire = node_wire(per_rank, [0, 0, 1, 1], {0: "head-box", 1: "gpu-node-b"}, topology, traffic, "nccl")
    with Store(db) as store:
        store.add_result(ids[2], "candidate", {"node_wire": wire})
    app = PkbApp(config=app_config(db))

    async def main() -> str:
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.app.workers.wait_for_complete()
            app.open_result(ids[2])
            await pilot.pause(0.5)
            return screen_text(app)

    text = asyncio.run(main())
    assert "wire per call, node 0 (head-box) candidate: GPU links 2 MB/call (model 2 MB, 1.00x); NIC out 2 MB/call (model 4 MB, 0.50x)" in text
    assert "node 1 (gpu-node-b) candidate: GPU links n/a: no link counters" in text
    result = cli("--db", str(db), "show", str(ids[2]))
    assert result.code == 0 and "NIC n/a: no physical network interface" in result.out, result.out


def recorded_batch() -> list[tuple[ev.Event, int | None]]:
    """A real two-node batch's events as its launcher passed them on (all_reduce x torch-p2p, cpu,
    1 rank per node, two "nodes" on one VM), recorded by bench/multinode_gpu_check.py."""
    import dataclasses
    import json
    from pathlib import Path

    kinds = {**ev.EVENT_TYPES, ev.NodeStatus.name: ev.NodeStatus}
    out = []
    for line in (Path(__file__).parent / "fixtures" / "two_node_batch.jsonl").read_text().splitlines():
        data = json.loads(line)
        cls = kinds[data["event"]]
        names = {f.name for f in dataclasses.fields(cls)}
        out.append((cls(**{k: v for k, v in data.items() if k in names}), data["run_id"]))
    return out


def test_a_recorded_two_node_batch_replayed_shows_both_nodes_and_a_late_one(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seed_runs(tmp_path / "runs.db")
    events = recorded_batch()
    finished = next(i for i, (e, _) in enumerate(events) if isinstance(e, ev.RunFinished))
    moment = max(i for i, (e, _) in enumerate(events[:finished]) if isinstance(e, ev.NodeStatus))
    status = events[moment][0]
    assert isinstance(status, ev.NodeStatus) and [n["node"] for n in status.nodes] == [0, 1]
    ago = status.ts - status.nodes[1]["heard_at"]
    texts = []
    for later_s in (0.0, 6.0):
        app = PkbApp(config=app_config(tmp_path / "runs.db", clock=lambda: status.ts + later_s))

        async def main() -> str:
            async with app.run_test(size=(120, 40)) as pilot:
                await replay(pilot, events[:moment + 1], world_size=2)
                return screen_text(app)

        texts.append(asyncio.run(main()))
    now, late = texts
    host = status.nodes[1]["host"]
    rows = [line for line in now.splitlines() if line.startswith(("0 ", "1 ")) and host in line]
    assert len(rows) == 2 and "head" in rows[0] and f"{ago:.1f} s ago" in rows[1], now
    assert "n/a: no GPU sampled on this node" in rows[1] and "B/s /" in rows[1]  # the VM's NIC counted
    assert f"silent for {ago + 6:.0f} s" in late


def test_the_nic_tally_adds_a_variants_blocks_and_says_why_when_it_cannot_count() -> None:
    from collectors.host import NO_NIC_REASON, NicTally, read_nic_bytes

    readings = iter([(100.0, 50.0), (160.0, 80.0), (200.0, 90.0), (260.0, 130.0)])
    tally = NicTally(read=lambda: next(readings))
    for _ in range(2):
        tally.begin()
        tally.end(5)
    assert tally.figures() == {"nic_tx_bytes": 120.0, "nic_rx_bytes": 70.0, "nic_iterations": 10}
    assert NicTally(read=lambda: None).figures() == {"nic_reason": "no timed block was counted"}
    missing = NicTally(read=lambda: None)
    missing.begin()
    missing.end(5)
    assert missing.figures() == {"nic_reason": NO_NIC_REASON}
    reset = iter([(100.0, 50.0), (10.0, 80.0)])
    went_back = NicTally(read=lambda: next(reset))
    went_back.begin()
    went_back.end(5)
    assert "went back" in went_back.figures()["nic_reason"]
    # This machine's own counters: a pair of byte counts, or None where it has no NIC at all.
    assert read_nic_bytes() is None or all(v >= 0 for v in read_nic_bytes())  # type: ignore[union-attr]


def test_live_node_sums_a_nodes_gpus_and_says_why_a_figure_is_missing() -> None:
    figures = live_node(1, "b", FIXED_NOW, {0: _gpu(0, 10e9), 1: _gpu(1, 30e9), -1: _host(None)})
    assert figures["gpus"] == 2 and figures["link_tx_bytes_per_s"] == 40e9 and figures["link_rx_bytes_per_s"] == 20e9
    assert figures["nic_tx_bytes_per_s"] is None and figures["nic_na"] == "no NIC counters on this host"
    no_nvlink = GpuSample(ts=FIXED_NOW, gpu=0, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=5e8)
    figures = live_node(1, "b", None, {0: no_nvlink})
    assert figures["link_tx_bytes_per_s"] is None and figures["link_na"] == "NVML counts no NVLink traffic here"
    assert figures["nic_na"] == "no host sample yet" and figures["pcie_tx_bytes_per_s"] == 1e9
    from pkb_tui.app.screens.live import node_lines

    text = "\n".join(line.plain for line in node_lines([figures, {**figures, "node": 2}], FIXED_NOW, 20.0, 120))
    assert "PCIe 1 GB/s / 500 MB/s (1 GPU)" in text  # no NVLink figure: the GPU's PCIe instead
