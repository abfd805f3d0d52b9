"""Timing figures in the store: the migration from the pre-timing file, eager/graph figures, the
speedup basis, intervals in the leaderboard, link latency and noise floor calibrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from pkb_tui.errors import PkbError
from pkb_tui.store import Store, schema
from pkb_tui.store.store import result_with_basis


def _pre_timing_file(db: Path) -> None:
    """A runs.db as the last schema before _V_TIMING left it, with a run, results and calibrations."""
    conn = sqlite3.connect(db)
    for migration in schema.MIGRATIONS[: schema.MIGRATIONS.index(schema._V_TIMING)]:
        for statement in migration:
            conn.execute(statement)
    conn.execute("INSERT INTO hosts (id, fingerprint, hostname, first_seen_at, last_seen_at) VALUES (1, 'f', 'box', 1, 1)")
    conn.execute("INSERT INTO calibrations (host_id, measured_at, kind, bandwidth_gbps) VALUES (1, 10.0, 'device_copy', 4300.0)")
    conn.execute(
        "INSERT INTO runs (id, batch_id, task_id, model, world_size, mode, dtype, size, trials, timeout_s, request, "
        "status, created_at, host_id) VALUES (1, 'b', 'all_reduce', 'old', 2, 'nccl', 'float32', 'small', 1, 10, '{}', "
        "'passed', 1.0, 1)"
    )
    conn.execute("INSERT INTO results (run_id, variant, correct, median_us) VALUES (1, 'baseline', 1, 100.0)")
    conn.execute("INSERT INTO results (run_id, variant, correct, median_us, speedup) VALUES (1, 'candidate', 1, 80.0, 1.25)")
    conn.execute(f"PRAGMA user_version = {schema.MIGRATIONS.index(schema._V_TIMING)}")
    conn.commit()
    conn.close()


def test_the_pre_timing_file_migrates_and_old_rows_read_as_before(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    _pre_timing_file(db)
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert store.latest_calibration(1) == {"device_copy": 4300.0}
        run = store.run(1)
        candidate = run["results"]["candidate"]
        assert candidate["speedup"] == 1.25 and candidate["median_us"] == 80.0
        assert candidate["timing_method"] == "eager" and candidate["speedup_low"] is None and candidate["rounds"] is None
        # an old row has no graph figure: asked for graph, it reads with the figure it has and says which
        as_graph = store.run(1, basis="graph")["results"]["candidate"]
        assert (as_graph["speedup"], as_graph["timing_method"]) == (1.25, "eager")
        assert store.runs(basis="graph")[0]["speedup"] == 1.25
        assert store.runs()[0]["speedup"] == 1.25
        # with no interval measured, the old run is judged by its point
        assert store.leaderboard()[0]["fast_1"] == 1
        # the rebuilt calibrations table takes the new kinds of row
        store.add_calibration(1, [{"kind": "link_latency", "latency_us": 2.5, "measured_at": 20.0}])
        assert store.latest_link_latency(1)["latency_us"] == 2.5


def _timed_run(store: Store, task: str, model: str, *, eager: tuple[float, float, float],
               graph: tuple[float, float, float] | None, basis: str = "eager", floor: float | None = None) -> int:
    run_id = store.create_run({
        "batch_id": "b", "task_id": task, "model": model, "world_size": 2, "mode": "nccl", "dtype": "float32",
        "size": "small", "trials": 1, "timeout_s": 10, "request": {"speedup_basis": basis}, "status": "passed",
    })
    figures = {"eager": eager, "graph": graph}
    picked = figures[basis]
    store.add_result(run_id, "baseline", {
        "correct": 1, "median_us": 100.0, "eager_median_us": 100.0, "graph_median_us": 10.0 if graph else None,
        "timing_method": basis, "rounds": 8,
    })
    candidate = {
        "correct": 1, "timing_method": basis, "rounds": 8, "noise_floor_fraction": floor,
        "eager_median_us": 100.0 / eager[0], "speedup_eager": eager[0], "speedup_eager_low": eager[1],
        "speedup_eager_high": eager[2], "roofline_floor_us": 5.0,
    }
    if graph:
        candidate.update(graph_median_us=10.0 / graph[0], speedup_graph=graph[0], speedup_graph_low=graph[1],
                         speedup_graph_high=graph[2])
    else:
        candidate["graph_note"] = "not capturable: the candidate synchronizes the host"
    if picked:
        candidate.update(speedup=picked[0], speedup_low=picked[1], speedup_high=picked[2],
                         median_us=candidate[f"{basis}_median_us"], roofline_fraction=5.0 / candidate[f"{basis}_median_us"])
    store.add_result(run_id, "candidate", candidate)
    return run_id


def test_the_leaderboard_counts_faster_only_when_the_lower_end_clears(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        _timed_run(store, "t1", "m", eager=(1.6, 1.55, 1.65), graph=(1.2, 0.9, 1.4))  # fast both ways in eager
        _timed_run(store, "t2", "m", eager=(1.6, 1.45, 1.8), graph=(2.0, 1.9, 2.1))  # >1.5 point, not the interval
        _timed_run(store, "t3", "m", eager=(1.1, 0.95, 1.3), graph=None)  # point above 1, interval contains 1
        eager = store.leaderboard()[0]
        graph = store.leaderboard(basis="graph")[0]
    assert (eager["fast_1"], eager["fast_1_5"], eager["correct"], eager["basis"]) == (2, 1, 3, "eager")
    # graph: t1's interval contains 1, t2 clears 1.5, t3 has no graph figure (not capturable): read
    # with its eager one, as its run was, whose interval contains 1; and counted as read so
    assert (graph["fast_1"], graph["fast_1_5"], graph["correct"], graph["read_eager"]) == (1, 1, 3, 1)
    assert graph["geomean_speedup"] == pytest.approx((1.2 * 2.0 * 1.1) ** (1 / 3))
    assert eager["read_eager"] == 0


def test_the_leaderboard_widens_the_interval_by_the_host_noise_floor(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        _timed_run(store, "t1", "m", eager=(1.04, 1.02, 1.06), graph=None, floor=0.03)  # within the host's noise
        _timed_run(store, "t2", "m", eager=(1.04, 1.02, 1.06), graph=None, floor=None)  # no floor measured
        _timed_run(store, "t3", "m", eager=(1.7, 1.52, 1.9), graph=None, floor=0.03)  # fast_1, not fast_1.5 once widened
        board = store.leaderboard()[0]
    assert (board["fast_1"], board["fast_1_5"]) == (2, 0)


def test_reading_with_the_other_basis_swaps_every_headline_figure(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        run_id = _timed_run(store, "t1", "m", eager=(1.02, 0.99, 1.05), graph=(2.0, 1.9, 2.1), floor=0.03)
        eager = store.run(run_id)["results"]
        graph = store.run(run_id, basis="graph")["results"]
        rows = {basis: store.runs(basis=basis)[0] for basis in ("eager", "graph")}
        by_speedup = [r["task_id"] for r in store.runs(basis="graph", order_by="speedup")]
        with pytest.raises(PkbError, match="speedup basis"):
            store.runs(basis="wall")
    assert eager["candidate"]["speedup"] == 1.02 and eager["candidate"]["median_us"] == pytest.approx(100 / 1.02)
    assert graph["candidate"]["speedup"] == 2.0 and graph["candidate"]["speedup_low"] == 1.9
    assert graph["candidate"]["median_us"] == 5.0 and graph["baseline"]["median_us"] == 10.0
    assert graph["candidate"]["roofline_fraction"] == pytest.approx(1.0)  # floor 5 us over the graph median 5 us
    assert graph["candidate"]["within_noise"] == 0 and graph["candidate"]["timing_method"] == "graph"
    assert rows["graph"]["speedup"] == 2.0 and rows["graph"]["candidate_median_us"] == 5.0
    assert rows["eager"]["speedup"] == 1.02 and rows["eager"]["speedup_low"] == 0.99
    assert by_speedup == ["t1"]


def test_result_with_basis_recomputes_within_noise_from_the_stored_floor() -> None:
    row = {"timing_method": "eager", "speedup": 1.5, "speedup_graph": 1.04, "speedup_graph_low": 1.02,
           "speedup_graph_high": 1.06, "noise_floor_fraction": 0.03, "graph_median_us": 9.0, "median_us": 10.0}
    assert result_with_basis(row, "graph")["within_noise"] == 1
    assert result_with_basis({**row, "noise_floor_fraction": None}, "graph")["within_noise"] == 0
    assert result_with_basis(row, "eager") is row and result_with_basis(row, None) is row


def test_latency_and_noise_floor_calibrations_are_kept_per_host_and_mode(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        host = store.upsert_host({"hostname": "box"})
        assert store.latest_link_latency(host) is None and store.latest_noise_floor(host, "cpu") is None
        store.add_calibration(host, [
            {"kind": "device_copy", "bandwidth_gbps": 4300.0, "measured_at": 1.0},
            {"kind": "link_latency", "latency_us": 3.0, "measured_at": 1.0, "detail": {"from": "sweep"}},
            {"kind": "link_latency", "latency_us": 2.0, "measured_at": 2.0},
            {"kind": "noise_floor", "noise_floor_fraction": 0.02, "mode": "nccl", "measured_at": 1.0},
            {"kind": "noise_floor", "noise_floor_fraction": 0.4, "mode": "cpu", "measured_at": 1.0,
             "detail": {"tasks": {"all_reduce": 1.4}}},
        ])
        assert store.latest_link_latency(host)["latency_us"] == 2.0
        assert store.latest_noise_floor(host, "nccl")["noise_floor_fraction"] == 0.02
        cpu = store.latest_noise_floor(host, "cpu")
        assert cpu["noise_floor_fraction"] == 0.4 and cpu["detail"] == {"tasks": {"all_reduce": 1.4}}
        assert store.latest_calibration(host) == {"device_copy": 4300.0}  # bandwidths only
        with pytest.raises(PkbError, match="no figure"):
            store.add_calibration(host, [{"kind": "noise_floor", "mode": "cpu"}])


def test_a_file_from_before_network_pairs_migrates_and_keeps_its_host_figures_apart_from_pairs(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    conn = sqlite3.connect(db)
    before = schema.MIGRATIONS.index(schema._V_NETWORK)
    for migration in schema.MIGRATIONS[:before]:
        for statement in migration:
            conn.execute(statement)
    conn.execute("INSERT INTO hosts (id, fingerprint, hostname, first_seen_at, last_seen_at) VALUES (1, 'f', 'box', 1, 1)")
    conn.execute("INSERT INTO calibrations (host_id, measured_at, kind, bandwidth_gbps) VALUES (1, 10.0, 'device_copy', 4300.0)")
    conn.execute(f"PRAGMA user_version = {before}")
    conn.commit()
    conn.close()
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        assert store.latest_calibration(1) == {"device_copy": 4300.0} and store.network_pairs() == {}
        # a pair is stored in order, whichever side is named first, and the newest row of a pair wins
        store.add_calibration(1, [{"kind": "network_busbw", "host_a": "zeta", "host_b": "box", "bandwidth_gbps": 20.0,
                                   "latency_us": 5.0, "measured_at": 20.0}])
        store.add_calibration(1, [{"kind": "network_busbw", "host_a": "box", "host_b": "zeta", "bandwidth_gbps": 22.0,
                                   "measured_at": 30.0}])
        assert list(store.network_pairs()) == [("box", "zeta")]
        assert store.network_pairs()[("box", "zeta")]["bandwidth_gbps"] == 22.0
        assert store.latest_calibration(1) == {"device_copy": 4300.0}, "a pair's figure is not the host's"
        with pytest.raises(PkbError, match="one host of a pair"):
            store.add_calibration(1, [{"kind": "network_busbw", "host_a": "box", "bandwidth_gbps": 1.0}])


def test_a_run_that_could_not_be_captured_reads_as_its_launcher_chose_under_graph(tmp_path: Path) -> None:
    """`run --speedup-basis graph` stores the eager figure where the call has no graph (launcher); the
    same run read back with basis graph shows that figure, not nothing, in every view."""
    with Store(tmp_path / "runs.db") as store:
        run_id = _timed_run(store, "t1", "m", eager=(0.99, 0.94, 1.03), graph=None, basis="eager")
        store.conn.execute("UPDATE runs SET request='{\"speedup_basis\": \"graph\"}' WHERE id=?", (run_id,))
        run = store.run(run_id, basis="graph")["results"]
        row = store.runs(basis="graph")[0]
        by_speedup = store.runs(basis="graph", order_by="speedup")
    assert (run["candidate"]["speedup"], run["candidate"]["speedup_low"]) == (0.99, 0.94)
    assert run["candidate"]["timing_method"] == "eager" and run["baseline"]["median_us"] == 100.0
    assert (row["speedup"], row["speedup_low"], row["timing_method"]) == (0.99, 0.94, "eager")
    assert [r["id"] for r in by_speedup] == [run_id]
