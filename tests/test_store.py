"""The store on a real SQLite file: schema, recovery of interrupted runs, history and leaderboard."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from pkb_tui.errors import PkbError
from pkb_tui.store import Store
from pkb_tui.store.schema import SCHEMA_VERSION


def _run(store: Store, task: str, model: str, status: str, speedup: float | None, correct: bool, **extra) -> int:
    run_id = store.create_run({
        "batch_id": "b", "task_id": task, "model": model, "world_size": 2, "mode": "cpu", "dtype": "float32",
        "size": "small", "trials": 1, "timeout_s": 10, "request": {}, "status": status, **extra,
    })
    store.add_result(run_id, "baseline", {"correct": 1, "median_us": 100.0})
    store.add_result(run_id, "candidate", {"correct": int(correct), "median_us": 100.0 / speedup if speedup else None, "speedup": speedup})
    return run_id


def test_a_new_database_gets_the_current_schema_in_wal_mode(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"hosts", "runs", "results", "trials", "kernels", "samples", "link_samples", "sources", "calibrations"} <= tables


def test_a_version_1_database_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    from pkb_tui.store.schema import MIGRATIONS

    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO samples (ts, gpu, run_id, power_w) VALUES (1.0, 0, NULL, 300.0), (2.0, 0, 5, 310.0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        index_sql = store.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'samples_run'").fetchone()[0]
        assert "WHERE run_id IS NOT NULL" in index_sql
        assert [r["power_w"] for r in store.run_samples(5)] == [310.0]
        assert store.conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 2


def test_a_database_from_a_newer_pkb_tui_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    Store(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(PkbError, match="newer than this pkb-tui knows"):
        Store(db)


def test_runs_left_running_by_a_dead_launcher_become_interrupted(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "runs.db") as store:
        mine = _run(store, "all_reduce", "m", "running", None, False)  # this process: alive
        orphan = _run(store, "all_reduce", "m", "running", None, False, launcher_pid=dead.pid)
    with Store(tmp_path / "runs.db") as store:
        assert store.run(orphan)["status"] == "interrupted"
        assert store.run(mine)["status"] == "running"


def test_sources_are_stored_once_by_hash(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        a = store.add_source("x.py", "def solution(x):\n    return x\n")
        b = store.add_source("y.py", "def solution(x):\n    return x\n")
        assert a == b
        assert store.conn.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 1


def test_leaderboard_figures_match_the_rows(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        _run(store, "t1", "alpha", "passed", 2.0, True)
        _run(store, "t2", "alpha", "passed", 1.2, True)
        _run(store, "t3", "alpha", "failed", None, False)
        _run(store, "t1", "beta", "passed", 0.5, True)
        _run(store, "t1", "beta", "passed", 0.8, True)  # newer run of the same task wins
        board = {e["model"]: e for e in store.leaderboard()}
    assert board["alpha"]["tasks"] == 3 and board["alpha"]["correct"] == 2
    assert board["alpha"]["fast_1"] == 2 and board["alpha"]["fast_1_5"] == 1
    assert board["alpha"]["geomean_speedup"] == pytest.approx(math.sqrt(2.0 * 1.2))
    assert board["beta"]["tasks"] == 1 and board["beta"]["fast_1"] == 0
    assert board["beta"]["geomean_speedup"] == pytest.approx(0.8)


def test_history_filters_and_sorts(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        _run(store, "t1", "alpha", "passed", 2.0, True)
        _run(store, "t2", "alpha", "failed", None, False)
        _run(store, "t1", "beta", "passed", 3.0, True)
        assert [r["model"] for r in store.runs(task="t1", order_by="speedup")] == ["beta", "alpha"]
        assert [r["task_id"] for r in store.runs(status="failed")] == ["t2"]
        with pytest.raises(PkbError, match="Cannot sort runs by"):
            store.runs(order_by="nonsense")


def test_runs_left_queued_by_a_dead_launcher_are_cancelled_not_interrupted(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with Store(tmp_path / "runs.db") as store:
        started = _run(store, "all_reduce", "m", "running", None, False, launcher_pid=dead.pid)
        never = _run(store, "broadcast", "m", "queued", None, False, launcher_pid=dead.pid)
    with Store(tmp_path / "runs.db") as store:
        assert store.run(started)["status"] == "interrupted"
        assert store.run(never)["status"] == "cancelled"
        assert "before the run started" in store.run(never)["status_detail"]
        assert store.runs(status="cancelled")[0]["id"] == never


def test_the_last_result_and_the_leaderboard_skip_runs_that_did_not_finish(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        finished = _run(store, "all_reduce", "m", "passed", 2.0, True)
        _run(store, "all_reduce", "m", "interrupted", None, False)
        _run(store, "all_reduce", "m", "cancelled", None, False)
        assert store.latest_run_per_task()["all_reduce"]["id"] == finished
        board = {e["model"]: e for e in store.leaderboard()}
        assert board["m"]["correct"] == 1 and board["m"]["geomean_speedup"] == pytest.approx(2.0)


def test_deleting_runs_takes_their_results_trials_kernels_and_samples(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        gone = _run(store, "all_reduce", "m", "failed", None, False)
        kept = _run(store, "all_reduce", "m", "passed", 1.5, True)
        for run_id in (gone, kept):
            store.add_trials(run_id, [{"trial": 0, "correct": True}])
            store.add_kernels(run_id, [{"variant": "baseline", "rank": 0, "name": "k", "category": "compute",
                                        "calls": 1, "total_us": 1.0, "mean_us": 1.0}])
            store.conn.execute("INSERT INTO samples (ts, gpu, run_id, power_w) VALUES (1.0, 0, ?, 1.0)", (run_id,))
        store.conn.execute("INSERT INTO samples (ts, gpu, run_id, power_w) VALUES (1.0, 0, NULL, 1.0)")  # monitor
        assert store.delete_runs([gone, 999]) == [gone]
        with pytest.raises(PkbError, match="no run"):
            store.run(gone)
        for table in ("results", "trials", "kernels", "samples"):
            assert store.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (gone,)).fetchone()[0] == 0
            assert store.conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (kept,)).fetchone()[0] >= 1
        assert store.conn.execute("SELECT COUNT(*) FROM samples WHERE run_id IS NULL").fetchone()[0] == 1


def test_a_run_still_going_cannot_be_deleted(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        running = _run(store, "all_reduce", "m", "running", None, False)
        with pytest.raises(PkbError, match="still queued or running"):
            store.delete_runs([running])
        assert store.run(running)["status"] == "running"


def test_a_database_damaged_past_its_header_is_one_sentence(tmp_path: Path) -> None:
    db = _damaged_database(tmp_path)
    with pytest.raises(PkbError, match="is damaged") as caught:
        with Store(db) as store:
            store.runs(limit=None)
    assert caught.value.exit_code == 3


def _damaged_database(tmp_path: Path) -> Path:
    """A database whose header (page 1, the schema) is intact and whose tables' pages are not."""
    db = tmp_path / "runs.db"
    with Store(db) as store:
        for i in range(200):
            _run(store, f"task_{i}", "m", "passed", 1.0, True)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode = DELETE")
    page_bytes = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(db.read_bytes())
    # The schema fills the first pages; the runs' rows come last: damage the second half.
    start = (len(data) // page_bytes // 2) * page_bytes
    data[start:] = bytes((i * 7 + 13) % 251 for i in range(len(data) - start))
    db.write_bytes(bytes(data))
    return db


def test_an_interval_that_holds_the_floor_is_not_widened_again(tmp_path: Path) -> None:
    # Both rows: 1.6x [1.52, ...] on a host whose floor is 5%. The older row's interval is the rounds'
    # alone (the floor still to apply: 1.52 / 1.05 < 1.5); the newer one's holds the floor already.
    timing = {"speedup_low": 1.52, "speedup_high": 1.7, "rounds": 8, "noise_floor_fraction": 0.05}
    with Store(tmp_path / "runs.db") as store:
        rounds_only = _run(store, "t1", "alpha", "passed", 1.6, True)
        store.add_result(rounds_only, "candidate", timing)
        folded = _run(store, "t1", "beta", "passed", 1.6, True)
        store.add_result(folded, "candidate", {**timing, "interval_floor": 0.05})
        board = {e["model"]: e for e in store.leaderboard()}
        rows = {r["model"]: r for r in store.runs(basis="eager")}
    assert board["alpha"]["fast_1_5"] == 0 and board["beta"]["fast_1_5"] == 1
    assert board["alpha"]["fast_1"] == 1 and board["beta"]["fast_1"] == 1
    assert rows["beta"]["interval_floor"] == 0.05 and rows["alpha"]["interval_floor"] is None
