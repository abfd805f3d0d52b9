"""Two "nodes" on this machine: two pkb-tui processes on 127.0.0.1 with --nnodes 2, each in a folder of
its own (nothing shared but the rendezvous), real torchrun c10d rendezvous, real sockets, real gloo
ranks. The head (node 0) owns the database and receives every event; node 1 keeps none. A node's
agent killed mid-run ends that run as error, and nothing is left running on either node."""

from __future__ import annotations

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
        assert any("node 1 (" in note and "clock offset" in note for note in full["notes"])
    conn = sqlite3.connect(head / "runs.db")
    nodes_sampled = {row[0] for row in conn.execute("SELECT DISTINCT node FROM samples WHERE run_id IS NOT NULL")}
    conn.close()
    assert nodes_sampled == {0, 1}, "each node's host was sampled into the head's database"
    assert _none_left(tmp_path) == {}


@pytest.mark.timeout(900)
def test_a_node_agent_killed_mid_run_ends_the_run_as_error_and_leaves_nothing_running(tmp_path: Path) -> None:
    head, other = _nodes(tmp_path)
    port = free_port()
    env = _env()
    agent = _pkb(["agent", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}"], other, env)
    db = head / "runs.db"
    leader = _pkb(["--db", str(db), "run", "--task", "all_reduce", "--model", fixture_model("hang"), *SMALL,
                   "--no-timing", "--timeout", "600", "--nnodes", "2", "--world-size", "4",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--node-timeout", "5"], head, env)
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
    # A correct candidate first, then a hanging one whose node-1 agent is killed while it runs.
    leader = _pkb(["--db", str(db), "run", "--slurm", "--task", "all_reduce", "--model",
                   f"torch-p2p,{fixture_model('hang')}", *SMALL, "--no-timing", "--timeout", "600",
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
    assert first["status"] == "passed", first["status_detail"]
    assert second["status"] == "error" and "node 1 (" in second["status_detail"], second["status_detail"]
    assert any(str(tmp_path / "node1" / "pkb-runs") in note for note in notes), notes
    assert not list((tmp_path / "node1").rglob("*.db"))
    assert _none_left(tmp_path) == {}
