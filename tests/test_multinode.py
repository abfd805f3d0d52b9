"""Two "nodes" on this machine: two pkb-tui processes on 127.0.0.1 with --nnodes 2, each in a folder of
its own (nothing shared but the rendezvous), real torchrun c10d rendezvous, real sockets, real gloo
ranks. The head (node 0) owns the database and receives every event; node 1 keeps none. A node's
agent killed mid-run ends that run as error, and nothing is left running on either node."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkb_tui.engine.nodes import free_port
from pkb_tui.store import Store
from tests.conftest import fixture_model

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter"
FAKE_SLURM = ROOT / "tests" / "fixtures" / "fake-slurm"
SMALL = ("--mode", "cpu", "--size", "small", "--trials", "1", "--no-profile")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PKB_JOIN_KEY": "6b" * 32, "PKB_LOG_RETENTION_DAYS": "0"}
    env.pop("PKB_DB", None)
    env.update(extra)
    return env


def _pkb(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pkb_tui.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _nodes(tmp_path: Path) -> tuple[Path, Path]:
    head, other = tmp_path / "node0", tmp_path / "node1"
    head.mkdir()
    other.mkdir()
    return head, other


def _processes_in(folder: Path) -> dict[int, str]:
    """Every process whose command line or working folder is inside ``folder`` (a scan of /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(") ", 1)[1][:1]
        except OSError:
            continue
        if state not in ("Z", "X") and (str(folder) in cmd or cwd.startswith(str(folder))):
            found[int(entry)] = cmd[:200]
    return found


def _none_left(folder: Path, wait_s: float = 60.0) -> dict[int, str]:
    deadline = time.monotonic() + wait_s
    while (left := _processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _wait_for_status(db: Path, run_index: int, status: str, proc: subprocess.Popen[str], wait_s: float = 300) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            rows = conn.execute("SELECT status FROM runs ORDER BY id").fetchall()
            conn.close()
        except sqlite3.Error:
            rows = []
        if len(rows) > run_index and rows[run_index][0] == status:
            return
        time.sleep(0.2)
    raise AssertionError(f"run {run_index} never became {status}: {proc.poll()=}")


def _finish(proc: subprocess.Popen[str], timeout_s: float = 900) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


@pytest.mark.timeout(1800)
def test_eight_collectives_at_two_nodes_of_two_ranks_are_judged_into_the_heads_database_only(tmp_path: Path) -> None:
    head, other = _nodes(tmp_path)
    port = free_port()
    nodes = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--world-size", "4"]
    run = ["run", "--task", COLLECTIVES, "--model", "torch-p2p", *SMALL, *nodes]
    env = _env()
    # The same `run` on both nodes, as torchrun is used: node 1 joins node 0's batch.
    joiner = _pkb([*run, "--node-rank", "1"], other, env)
    leader = _pkb(["--db", str(head / "runs.db"), *run, "--node-rank", "0", "--json"], head, env)
    code, out, err = _finish(leader)
    joined_code, _, joined_err = _finish(joiner, 120)
    assert code == 0, err + out
    assert joined_code == 0, joined_err
    assert not list(other.rglob("*.db")), "node 1 keeps no database"
    assert list((other / "pkb-runs").glob("*.node1/item000.rank*.log")), "node 1's ranks logged there"
    with Store(head / "runs.db") as store:
        runs = store.runs(limit=None)
        assert sorted(r["task_id"] for r in runs) == sorted(COLLECTIVES.split(","))
        assert {r["status"] for r in runs} == {"passed"}
        assert all(r["world_size"] == 4 for r in runs)
        full = store.run(runs[0]["id"])
        # Judge 0 may sit on either node (c10d numbers the nodes as they arrive); the events came anyway.
        assert len([t for t in full["trial_results"] if t["trial"] >= 0]) == 1
        assert full["results"]["baseline"]["median_us"] > 0 and full["results"]["candidate"]["median_us"] > 0
        assert any("node 1 (" in note and "clock offset" in note for note in full["notes"])
        # Per node, both variants' wire bytes against the traffic model: no GPU link counters in
        # cpu mode (n/a, never 0), the NIC counted over the timed blocks, the nodes on one host.
        for variant in ("baseline", "candidate"):
            wire = full["results"][variant]["node_wire"]
            # (judge 0, rank 0, may sit on node 1: c10d numbers the nodes as they arrive)
            assert [n["node"] for n in wire] == [0, 1] and sorted(r for n in wire for r in n["ranks"]) == [0, 1, 2, 3]
            assert all(n["link_bytes_per_iter"] is None and n["link_na"] == "no GPU: cpu mode" for n in wire), wire
            assert all((n["nic_tx_bytes_per_iter"] is None) == bool(n["nic_na"]) for n in wire), wire
            assert all(n["model_off_node_send_bytes_per_iter"] + n["model_off_node_recv_bytes_per_iter"] > 0
                       and "loopback" in n["note"] for n in wire), wire
    document = json.loads(out)
    assert all(len(r["candidate"]["node_wire"]) == 2 for r in document["runs"]), "run --json carries node_wire"
    conn = sqlite3.connect(head / "runs.db")
    nodes_sampled = {row[0] for row in conn.execute("SELECT DISTINCT node FROM samples WHERE run_id IS NOT NULL")}
    conn.close()
    assert nodes_sampled == {0, 1}, "each node's host was sampled into the head's database"
    shown = _pkb(["--db", str(head / "runs.db"), "show", str(runs[-1]["id"])], head, env)
    code, out, err = _finish(shown, 60)
    assert code == 0 and "node 0 (" in out and "node 1 (" in out, err + out
    assert "wire per call, node 0 (" in out and "wire per call, node 1 (" in out and "GPU links n/a: no GPU" in out, out
    assert _none_left(tmp_path) == {}


def _hung_batch_on_two_nodes(tmp_path: Path) -> tuple[Path, Path, subprocess.Popen, subprocess.Popen]:
    """A head and an agent on 127.0.0.1 running a candidate that hangs on both nodes at 2 x 2
    ranks (node timeout 5 s): the head's database, node 1's folder, the agent and the head."""
    head, other = _nodes(tmp_path)
    port = free_port()
    env = _env()
    agent = _pkb(["agent", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}"], other, env)
    db = head / "runs.db"
    leader = _pkb(["--db", str(db), "run", "--task", "all_reduce", "--model", fixture_model("hang"), *SMALL,
                   "--no-timing", "--timeout", "600", "--nnodes", "2", "--world-size", "4",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--node-timeout", "5"], head, env)
    return db, other, agent, leader


@pytest.mark.timeout(900)
def test_a_node_agent_killed_mid_run_ends_the_run_as_error_and_leaves_nothing_running(tmp_path: Path) -> None:
    db, other, agent, leader = _hung_batch_on_two_nodes(tmp_path)
    try:
        _wait_for_status(db, 0, "running", leader)
        time.sleep(2.0)  # the candidates are spinning on both nodes
        assert _processes_in(other), "node 1's ranks were running"
        agent.send_signal(signal.SIGKILL)
        code, out, err = _finish(leader, 300)
    finally:
        for proc in (agent, leader):
            if proc.poll() is None:
                proc.kill()
    assert code == 1, err
    with Store(db) as store:
        (run,) = store.runs(limit=None)
    assert run["status"] == "error"
    assert "node 1 (" in run["status_detail"] and "was lost" in run["status_detail"], run["status_detail"]
    assert _none_left(tmp_path) == {}


@pytest.mark.timeout(1200)
def test_under_slurm_the_head_starts_the_agents_with_srun_and_a_killed_one_ends_its_run(tmp_path: Path) -> None:
    head = tmp_path / "node0"
    head.mkdir()
    env = _env(PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ['PATH']}", FAKE_SRUN_ROOT=str(tmp_path),
               SLURM_JOB_ID="4242", SLURM_NNODES="2", SLURM_NODEID="0", SLURM_JOB_NODELIST="127.0.0.1")
    env.pop("PKB_JOIN_KEY")  # the head makes one and gives it to srun's tasks only
    db = head / "runs.db"
    # A correct candidate first (one that looks for the launcher's keys on its way), then a hanging
    # one whose node-1 agent is killed while it runs.
    leader = _pkb(["--db", str(db), "run", "--slurm", "--task", "all_reduce", "--model",
                   f"{fixture_model('key-probe')},{fixture_model('hang')}", *SMALL, "--no-timing", "--timeout", "600",
                   "--world-size", "4", "--node-timeout", "5"], head, env)
    try:
        _wait_for_status(db, 1, "running", leader, wait_s=600)
        time.sleep(2.0)
        agent_pid = int((tmp_path / "agent1.pid").read_text())
        assert "agent --slurm" in Path(f"/proc/{agent_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert Path(os.readlink(f"/proc/{agent_pid}/cwd")) == tmp_path / "node1"
        os.kill(agent_pid, signal.SIGKILL)
        code, out, err = _finish(leader, 300)
    finally:
        if leader.poll() is None:
            leader.kill()
    assert code == 1, err
    with Store(db) as store:
        first, second = store.runs(limit=None)[::-1]
        notes = store.run(first["id"])["notes"]
    # The run's log on the head covers every node's ranks: node 1's logs are mirrored to the head.
    merged = [line for line in Path(first["log_path"]).read_text().splitlines() if "keys in reach:" in line]
    assert sorted(line.split("]")[0] for line in merged) == ["[rank 0", "[rank 1", "[rank 2", "[rank 3"], merged
    assert first["status"] == "passed", first["status_detail"]
    assert second["status"] == "error" and "node 1 (" in second["status_detail"], second["status_detail"]
    assert any(str(tmp_path / "node1" / "pkb-runs") in note for note in notes), notes
    assert not list((tmp_path / "node1").rglob("*.db"))
    # Node 1's agent held the join key and its judges the event key: no candidate could reach either.
    probes = {node: [line for log in (tmp_path / node).rglob("*.candidate.log")
                     for line in log.read_text().splitlines() if "keys in reach:" in line]
              for node in ("node0", "node1")}
    assert len(probes["node1"]) == 2 and len(probes["node0"]) == 4, probes  # the head: its own two and node 1's
    assert all(line.endswith("keys in reach: none") for lines in probes.values() for line in lines), probes
    assert _none_left(tmp_path) == {}


@pytest.mark.timeout(900)
def test_a_node_that_stops_answering_is_lost_after_the_node_timeout_and_its_ranks_end_when_it_wakes(
        tmp_path: Path) -> None:
    db, other, agent, leader = _hung_batch_on_two_nodes(tmp_path)
    try:
        _wait_for_status(db, 0, "running", leader)
        agent.send_signal(signal.SIGSTOP)  # alive but silent: only the heartbeat deadline can tell
        code, out, err = _finish(leader, 300)
        with Store(db) as store:
            (run,) = store.runs(limit=None)
        assert code == 1, err
        assert run["status"] == "error"
        assert "not heard from for 5 s" in run["status_detail"], run["status_detail"]
        assert _none_left(db.parent, 30) == {}
    finally:
        agent.send_signal(signal.SIGCONT)
        agent_code, _, agent_err = _finish(agent, 120)
    # Woken, the agent finds the head gone, ends its node's ranks and says so.
    assert agent_code == 3 and "the launcher is gone" in agent_err, agent_err
    assert _none_left(tmp_path) == {}


# ---------------------------------------------------------------------------------------- no processes
def test_the_topology_says_which_pairs_cross_nodes_and_the_roofline_puts_their_bytes_on_the_network() -> None:
    from pkb_tui.engine import roofline
    from pkb_tui.engine.topology import Topology
    from pkb_tui.errors import PkbError
    from tasks.base import Traffic, bus_factor

    topology = Topology.of(16, 2)
    assert topology.ranks_per_node == 8 and topology.node_of(7) == 0 and topology.node_of(8) == 1
    assert topology.same_node(0, 7) and not topology.same_node(7, 8)
    assert len(topology.cross_node_pairs()) == 8 * 8 and len(topology.pairs()) == 16 * 15 // 2
    with pytest.raises(PkbError, match="spread evenly"):
        Topology.of(6, 4)
    size = 10**9  # an all-reduce of 1 GB: each rank sends 2(n-1)/n of it
    traffic = Traffic(send_bytes=2 * 15 * size // 16, recv_bytes=2 * 15 * size // 16, memory_bytes=2 * size,
                      payload_bytes=size, bus_factor=bus_factor("all_reduce", 16))
    host = {"gpu_model": "NVIDIA H100 80GB HBM3"}
    one_node = roofline.bandwidths_for(host, {}, "nccl", 16)
    two_nodes = roofline.with_topology(one_node, topology)
    assert roofline.with_topology(one_node, Topology.of(16, 1)) == one_node
    inside = roofline.evaluate(traffic, 10_000.0, one_node, "float32")
    across = roofline.evaluate(traffic, 10_000.0, two_nodes, "float32")
    assert inside.bound == "wire" and across.bound == "network"
    # 8 of a rank's 15 peers are off-node; the node's 8 NICs at 50 GB/s carry what crosses.
    cross_us = traffic.wire_bytes * 8 / 15 / (8 * roofline.DEFAULT_NETWORK_GBPS * 1e3)
    assert across.floor_us == pytest.approx(cross_us + (across.latency_us or 0.0))
    assert "NIC" in across.bandwidth_source
    pairs = {("a", "b"): {"bandwidth_gbps": 25.0, "measured_at": 1.7e9, "mode": "nccl"}}
    calibrated = roofline.with_topology(one_node, topology, roofline.network_ceiling(["a", "b"], pairs))
    assert calibrated.network_gbps == 25.0 and calibrated.network_source.startswith("calibrated")
    assert "hosts a <-> b" in calibrated.network_source
    slower = roofline.evaluate(traffic, 10_000.0, calibrated, "float32")
    assert slower.bound == "network" and slower.floor_us == pytest.approx(2 * cross_us + (slower.latency_us or 0.0))


def test_slurm_host_lists_and_the_allocation_come_from_slurms_environment() -> None:
    from pkb_tui.engine import slurm
    from pkb_tui.errors import PkbError

    assert slurm.expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert slurm.expand_nodelist("a[8-10]") == ["a8", "a9", "a10"]
    alloc = slurm.allocation({"SLURM_JOB_ID": "77", "SLURM_NNODES": "4", "SLURM_NODEID": "2",
                              "SLURM_JOB_NODELIST": "n[1-4]", slurm.NODE_OFFSET_ENV: "1"})
    assert (alloc.job_id, alloc.nnodes, alloc.node_rank, alloc.head_host) == ("77", 4, 3, "n1")
    with pytest.raises(PkbError, match="SLURM allocation"):
        slurm.allocation({})
    cmd = slurm.agents_command(alloc, "n1:5000", None)
    assert cmd[:8] == ["srun", "--nodes", "3", "--ntasks", "3", "--ntasks-per-node", "1", "--relative"]
    assert cmd[-4:] == ["agent", "--slurm", "--channel", "n1:5000"]


def test_a_multi_node_run_without_an_endpoint_or_with_uneven_ranks_is_a_usage_error(cli, tmp_db: Path) -> None:
    result = cli("run", "--task", "all_reduce", "--model", "baseline", "--mode", "cpu", "--nnodes", "2", "--world-size", "4")
    assert result.code == 2 and "--rdzv-endpoint" in result.err
    result = cli("run", "--task", "all_reduce", "--model", "baseline", "--mode", "cpu", "--nnodes", "2",
                 "--world-size", "3", "--rdzv-endpoint", "127.0.0.1:29999")
    assert result.code == 2 and "spread evenly" in result.err
    result = cli("agent", "--rdzv-endpoint", "127.0.0.1:29999")
    assert result.code == 2 and "--node-rank" in result.err


def test_the_agents_clock_offset_is_measured_from_the_quickest_ping() -> None:
    from pkb_tui.engine.launcher import _Node
    from pkb_tui.engine.uplink import Peer

    node = _Node(rank=1, peer=Peer(1, "agent", {}, "x", 0.0, 0.0), host="h", pid=1)
    assert node.clock_offset_s == 0.0 and node.round_trip_s is None
    node.pings = sorted([(0.010, 0.5), (0.001, 0.25), (0.004, 0.3)])
    assert node.clock_offset_s == 0.25 and node.round_trip_s == 0.001


@pytest.mark.timeout(600)
def test_when_the_head_is_killed_every_node_ends_its_ranks(tmp_path: Path) -> None:
    db, other, agent, leader = _hung_batch_on_two_nodes(tmp_path)
    try:
        _wait_for_status(db, 0, "running", leader)
        time.sleep(1.0)
        leader.send_signal(signal.SIGKILL)
        agent_code, _, agent_err = _finish(agent, 120)
    finally:
        for proc in (agent, leader):
            if proc.poll() is None:
                proc.kill()
    assert agent_code == 3 and "the launcher is gone" in agent_err, agent_err
    assert _none_left(tmp_path) == {}
    with Store(db) as store:  # found by the next open: the launcher that held it is gone
        (run,) = store.runs(limit=None)
    assert run["status"] == "interrupted"


# ---------------------------------------------------------------------------------------- the network between nodes
def _run_on_two_nodes(head: Path, other: Path, port: int, env: dict[str, str]) -> dict:
    """all_reduce's baseline at 2 x 1 ranks (correctness only) on two "nodes"; the head's run row."""
    nodes = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--world-size", "2"]
    run = ["run", "--task", "all_reduce", "--model", "baseline", *SMALL, "--no-timing", *nodes]
    joiner = _pkb([*run, "--node-rank", "1"], other, env)
    leader = _pkb(["--db", str(head / "runs.db"), *run, "--json"], head, env)
    code, out, err = _finish(leader, 600)
    joined_code, _, joined_err = _finish(joiner, 120)
    assert code == 0 and joined_code == 0, err + joined_err
    with Store(head / "runs.db") as store:
        return store.run(json.loads(out)["runs"][0]["id"])


def _network_note(run: dict) -> str:
    (note,) = [n for n in run["notes"] if n.startswith("network between the nodes:")]
    return note


@pytest.mark.timeout(1800)
def test_the_network_between_two_nodes_is_calibrated_into_the_heads_database_per_host_pair_and_runs_name_it(
        tmp_path: Path) -> None:
    import socket

    from pkb_tui.engine import netcal, roofline
    from pkb_tui.engine.topology import Topology

    head, other = _nodes(tmp_path)
    host = socket.gethostname()  # both "nodes" are this host: the pair (host, host), over loopback
    env = _env()
    # Before any calibration: the run says which pair was not calibrated and takes the datasheet.
    first = _run_on_two_nodes(head, other, free_port(), env)
    note = _network_note(first)
    assert f"not calibrated: {host} <-> {host}" in note and "50 GB/s per GPU" in note, note

    port = free_port()
    # The other node joins as for a run: the same command with its node rank (which runs `pkb-tui agent`).
    agent = _pkb(["calibrate", "--network", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}"],
                 other, env)
    leader = _pkb(["--db", str(head / "runs.db"), "calibrate", "--network", "--nnodes", "2", "--mode", "cpu",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--quick", "--json"], head, env)
    code, out, err = _finish(leader, 600)
    agent_code, _, agent_err = _finish(agent, 120)
    assert code == 0, err + out
    assert agent_code == 0, agent_err
    (pair,) = json.loads(out)["pairs"]
    assert (pair["host_a"], pair["host_b"]) == (host, host) and pair["mode"] == "cpu"
    assert pair["bandwidth_gbps"] > 0 and pair["latency_us"] > 0
    directions = pair["detail"]["directions"]
    assert sorted(directions) == ["0->1", "1->0"], directions
    for way in directions.values():  # every size measured each way, REPEATS windows each
        assert [p["size_bytes"] for p in way["sweep"]] == list(netcal.CPU_QUICK_SIZES)
        assert all(len(p["seconds"]) == netcal.REPEATS and all(t > 0 for t in p["seconds"]) for p in way["sweep"])
    # the pair's figure is its slower direction's best size
    assert pair["bandwidth_gbps"] == pytest.approx(min(w["peak_gbps"] for w in directions.values()))
    assert not list(other.rglob("*.db")), "node 1 keeps no database"
    with Store(head / "runs.db") as store:
        pairs = store.network_pairs()
        assert list(pairs) == [(host, host)] and pairs[(host, host)]["bandwidth_gbps"] == pair["bandwidth_gbps"]
        rows = store.conn.execute("SELECT host_id, host_a, host_b FROM calibrations").fetchall()
        assert [(r["host_a"], r["host_b"]) for r in rows] == [(host, host)]
        assert store.latest_calibration(rows[0]["host_id"]) == {}, "a pair's figure is not one host's"

    # The next run across these hosts names the calibrated pair, and so does its roofline's network term.
    second = _run_on_two_nodes(head, other, free_port(), env)
    note = _network_note(second)
    assert f"hosts {host} <-> {host}, cpu mode" in note and note.split(": ")[1].startswith(
        f"{pair['bandwidth_gbps']:g} GB/s"), note
    topology = Topology.of(16, 2)
    gpu_box = roofline.bandwidths_for({"gpu_model": "NVIDIA H100 80GB HBM3"}, {}, "nccl", 16)
    network = roofline.network_ceiling([host, host], pairs)
    across = roofline.with_topology(gpu_box, topology, network)
    assert across.network_gbps == pair["bandwidth_gbps"] and f"{host} <-> {host}" in across.network_source
    assert _none_left(tmp_path) == {}


@pytest.mark.timeout(600)
def test_under_slurm_the_network_calibration_starts_the_agents_with_srun_and_measures_every_pair_of_nodes(
        tmp_path: Path) -> None:
    import socket

    head = tmp_path / "node0"
    head.mkdir()
    env = _env(PATH=f"{FAKE_SLURM}{os.pathsep}{os.environ['PATH']}", FAKE_SRUN_ROOT=str(tmp_path),
               SLURM_JOB_ID="4343", SLURM_NNODES="3", SLURM_NODEID="0", SLURM_JOB_NODELIST="127.0.0.1")
    env.pop("PKB_JOIN_KEY")
    leader = _pkb(["--db", str(head / "runs.db"), "calibrate", "--network", "--slurm", "--mode", "cpu", "--quick"],
                  head, env)
    code, out, err = _finish(leader, 500)
    assert code == 0, err + out
    assert "measuring network between node 0 and node 1" in err and "node 1 and node 2" in err, err
    host = socket.gethostname()
    # Three nodes on one host: three node pairs, one pair of hosts, which keeps the slowest.
    assert f"{host} <-> {host}" in out and "loopback" in out, out
    with Store(head / "runs.db") as store:
        ((pair, row),) = store.network_pairs().items()
    assert pair == (host, host) and row["detail"]["nodes"] in ([0, 1], [0, 2], [1, 2])
    assert not list((tmp_path / "node1").rglob("*.db")) and not list((tmp_path / "node2").rglob("*.db"))
    assert _none_left(tmp_path) == {}


def test_the_slowest_calibrated_pair_of_a_runs_hosts_bounds_its_network_and_a_missing_pair_falls_back() -> None:
    from pkb_tui.engine import roofline

    pairs = {("a", "b"): {"bandwidth_gbps": 40.0, "measured_at": 1.7e9, "mode": "nccl"},
             ("a", "c"): {"bandwidth_gbps": 12.5, "measured_at": 1.7e9, "mode": "nccl"}}
    missing = roofline.network_ceiling(["c", "a", "b"], pairs)
    assert missing.gbps == roofline.DEFAULT_NETWORK_GBPS and missing.pair is None
    assert "not calibrated: b <-> c" in missing.source and "a <-> b" not in missing.source, missing.source
    pairs[("b", "c")] = {"bandwidth_gbps": 30.0, "measured_at": 1.7e9}
    slowest = roofline.network_ceiling(["c", "a", "b"], pairs)
    assert slowest.gbps == 12.5 and slowest.pair == ("a", "c")
    assert "hosts a <-> c" in slowest.source and "slowest of 3 pairs" in slowest.source
    assert roofline.network_ceiling(["a", "b"], pairs).gbps == 40.0


def test_network_calibration_without_several_nodes_is_a_usage_error(cli, tmp_db: Path) -> None:
    result = cli("calibrate", "--network")
    assert result.code == 2 and "--nnodes 2 or more" in result.err, result.err
    result = cli("calibrate", "--network", "--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:29999")
    assert result.code == 2 and "--nnodes 2 or more" in result.err, result.err
    result = cli("calibrate", "--network", "--nnodes", "2", "--mode", "cpu")
    assert result.code == 2 and "--rdzv-endpoint" in result.err, result.err
    result = cli("calibrate", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999")
    assert result.code == 2 and "are for --network" in result.err, result.err
    if tmp_db.exists():
        with Store(tmp_db) as store:
            assert store.conn.execute("SELECT COUNT(*) FROM calibrations").fetchone()[0] == 0


def test_a_nodes_ranks_run_only_the_judges_or_the_network_calibration(tmp_path: Path) -> None:
    from pkb_tui.engine.nodes import start_node_ranks

    with pytest.raises(ValueError, match="not a module"):
        start_node_ranks(tmp_path, 1, {"mode": "cpu"}, b"k" * 32, nproc=1, node_rank=0, rendezvous=None,
                         module="os")
    assert not (tmp_path / "spec.1.json").exists()
