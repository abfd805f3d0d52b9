"""What the CLI says about timing: speedup intervals, the speedup basis, results within the noise
floor, cpu mode labelled for what it is; and calibrate's link latency and noise floor."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from pkb_tui.engine import calibrate as cal
from pkb_tui.engine import roofline
from pkb_tui.store import Store

CPU_LABEL = "cpu: for development, not a measurement"


def _stored_run(db: Path, *, mode: str = "nccl") -> int:
    """A finished run as the new engine stores it: eager and graph figures, intervals, noise."""
    with Store(db) as store:
        run_id = store.create_run({
            "batch_id": "b", "task_id": "all_reduce", "model": "m", "world_size": 2, "mode": mode,
            "dtype": "float32", "size": "small", "trials": 1, "timeout_s": 10, "request": {}, "status": "passed",
            "timings_representative": int(mode == "nccl"),
        })
        store.add_result(run_id, "baseline", {
            "correct": 1, "median_us": 40.0, "eager_median_us": 40.0, "graph_median_us": 2.0, "rounds": 9,
            "timing_method": "eager",
        })
        store.add_result(run_id, "candidate", {
            "correct": 1, "trials_passed": 1, "trials_total": 1, "median_us": 39.0, "eager_median_us": 39.0,
            "graph_median_us": 1.0, "rounds": 9, "timing_method": "eager",
            "speedup": 1.03, "speedup_low": 1.01, "speedup_high": 1.05, "within_noise": 1, "noise_floor_fraction": 0.04,
            "speedup_eager": 1.03, "speedup_eager_low": 1.01, "speedup_eager_high": 1.05,
            "speedup_graph": 2.0, "speedup_graph_low": 1.9, "speedup_graph_high": 2.1,
        })
    return run_id


def test_show_prints_the_interval_and_says_when_it_is_within_noise(cli, tmp_db):
    run_id = _stored_run(tmp_db)
    text = cli("show", str(run_id))
    assert "1.03x [1.01, 1.05] ~noise" in text.out
    assert "self-check spread" in text.out
    graph = cli("show", str(run_id), "--speedup-basis", "graph")
    assert "2.00x [1.90, 2.10]" in graph.out and "~noise" not in graph.out
    doc = cli("show", str(run_id), "--json", "--speedup-basis", "graph").json()
    assert doc["speedup"] == 2.0 and doc["speedup_low"] == 1.9 and doc["within_noise"] is False
    assert doc["speedup_basis"] == "graph" and doc["candidate"]["median_us"] == 1.0
    assert doc["speedup_eager"] == 1.03 and doc["measurement_note"] is None
    listing = cli("runs", "--json").json()
    assert listing[0]["speedup_low"] == 1.01 and listing[0]["within_noise"] == 1
    assert listing[0]["speedup_basis"] == "eager"
    listing = cli("runs", "--json", "--speedup-basis", "graph").json()  # each row says which figure "speedup" is
    assert listing[0]["speedup"] == 2.0 and listing[0]["speedup_basis"] == "graph"
    assert "1.03x [1.01, 1.05] ~noise" in cli("runs").out
    assert cli("runs", "--speedup-basis", "wall").code == 2


def test_cpu_runs_are_labelled_in_the_table_and_the_json(cli, tmp_db):
    run_id = _stored_run(tmp_db, mode="cpu")
    text = cli("show", str(run_id)).out
    assert CPU_LABEL in text and "cpu: n/a" in text
    doc = cli("show", str(run_id), "--json").json()
    assert doc["measurement_note"] == CPU_LABEL and doc["timings_representative"] is False
    assert CPU_LABEL in cli("runs").out
    assert cli("runs", "--json").json()[0]["measurement_note"] == CPU_LABEL


def test_a_real_cpu_run_claims_no_roofline_and_no_bus_bandwidth(cli, tmp_db):
    result = cli("run", "--task", "all_reduce", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
                 "--trials", "1", "--iterations", "4", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 0, result.err
    run = result.json()["runs"][0]
    assert run["measurement_note"] == CPU_LABEL and run["timings_representative"] is False
    for variant in ("baseline", "candidate"):
        figures = run[variant]
        assert figures["median_us"] > 0
        assert figures["roofline_fraction"] is None and figures["bus_bandwidth_gbps"] is None
        assert figures["bandwidth_source"].startswith(CPU_LABEL)
    assert run["speedup_basis"] == "eager"


def test_link_latency_comes_from_the_sweeps_smallest_message():
    sweep = [{"size_bytes": 8, "time_us": 14.0}, {"size_bytes": 1024, "time_us": 15.0},
             {"size_bytes": 16 * cal.MiB, "time_us": 150.0}]
    alpha, detail = cal.link_latency_from_sweep(sweep, 8)
    assert alpha == pytest.approx(1.0) and detail["steps"] == 14 and detail["allreduce_time_us"] == 14.0
    assert cal.link_latency_from_sweep(sweep[2:], 8) is None  # no small message: no latency
    assert cal.link_latency_from_sweep(sweep, 1) is None


def test_calibration_stores_the_latency_where_the_roofline_reads_it(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cal, "measure_device_copy_gbps", lambda d, n: 4300.0)
    monkeypatch.setattr(cal, "measure_peer_copy_engine_gbps", lambda a, b, n: 370.0)
    monkeypatch.setattr(cal, "measure_peer_sm_gbps", lambda a, b, n: 395.0)
    sweep = [{"size_bytes": 8, "time_us": 7.0, "algbw_gbps": 0.0, "busbw_gbps": 0.0},
             {"size_bytes": 256 * cal.MiB, "time_us": 700.0, "algbw_gbps": 383.5, "busbw_gbps": 383.5}]
    monkeypatch.setattr(cal, "measure_allreduce_sweep", lambda world, sizes, iterations=20: sweep)
    with Store(tmp_path / "runs.db") as store:
        host = {"hostname": "box", "gpu_model": "NVIDIA H200", "gpu_count": 2, "topology": None}
        host_id = store.upsert_host(host)
        rows = cal.calibrate(store, host_id, quick=True)
        latency = store.latest_link_latency(host_id)
    assert latency["latency_us"] == pytest.approx(3.5)  # 7 us over 2(n-1) = 2 ring steps
    assert any(r["kind"] == "link_latency" for r in rows)
    bw = roofline.bandwidths_for(host, {}, "nccl", 2, latency=latency)
    assert bw.latency_us == pytest.approx(3.5) and "calibrated" in bw.latency_source
    table = cal.format_table(host, rows, cal.datasheet_for(host))
    assert "link_latency" in table and "3.50 us" in table


def test_the_noise_floor_on_a_cpu_box_is_measured_through_the_launcher(monkeypatch, tmp_path):
    # the real thing: the baseline against itself on gloo ranks, two of the eight collectives
    monkeypatch.setattr(cal, "NOISE_TASKS", ("all_reduce", "broadcast"))
    db = tmp_path / "runs.db"
    out = io.StringIO()
    code = cal.calibrate_command(str(db), as_json=True, quick=True, out=out, noise_only=True)
    assert code == 0
    doc = json.loads(out.getvalue())
    (row,) = doc["rows"]
    assert row["kind"] == "noise_floor" and row["mode"] == "cpu", row
    assert row["noise_floor_fraction"] >= 0.0
    assert set(row["detail"]["tasks"]) == {"all_reduce", "broadcast"}
    with Store(db) as store:
        run = store.run(row["detail"]["tasks"]["all_reduce"]["run_id"])
        stored = store.latest_noise_floor(run["host_id"], "cpu")
    assert run["model"] == "baseline" and stored["noise_floor_fraction"] == row["noise_floor_fraction"]
    table = cal.format_table({"gpu_count": 0}, [row], {})
    assert "noise_floor" in table and "(cpu mode)" in table
    # A later run on this database holds the latest floor in its interval (stats.widened), says so,
    # and its verdicts do not apply it again. (This box's floor may be 0, every self-check holding
    # 1.0: a floor of 30% is stored over it, as a noisier box would have measured.)
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.request import RunRequest

    floor = 0.3
    with Store(db) as store:
        store.add_calibration(run["host_id"], [{"kind": "noise_floor", "noise_floor_fraction": floor, "mode": "cpu",
                                                "detail": {"graph_noise_floor_fraction": None}}])
    request = RunRequest(tasks=["all_reduce"], models=["baseline"], world_size=2, mode="cpu", size="small",
                         trials=1, iterations=2, warmup=1, profile=False)
    (run_id,) = Launcher(db, runs_dir=tmp_path / "runs").run(request).run_ids
    # calibrate again on this database: its self-check runs fold in no floor, the stored one
    # included (their intervals are what the next floor is made of: Launcher(noise_floor=False))
    again = cal.measure_noise_floor(str(db), "cpu", 2, tasks=("all_reduce",))
    with Store(db) as store:
        later, alone = store.run(run_id), store.run(again["detail"]["tasks"]["all_reduce"]["run_id"])
    candidate = later["results"]["candidate"]
    assert later["status"] == "passed", later["status_detail"]
    assert candidate["noise_floor_fraction"] == pytest.approx(floor)
    assert candidate["speedup_low"] is not None
    assert candidate["interval_floor"] == pytest.approx(floor)
    assert "widened by this host's spread" in candidate["speedup_note"]
    assert candidate["speedup_high"] / candidate["speedup_low"] >= (1 + floor) ** 2 * 0.999  # at least the floor each side
    assert candidate["within_noise"] == int(candidate["speedup_low"] <= 1.0 <= candidate["speedup_high"])
    # the self-check run with the floor left out: the rounds' interval alone
    assert alone["status"] == "passed", alone["status_detail"]
    assert alone["results"]["candidate"]["interval_floor"] is None
    assert alone["results"]["candidate"]["noise_floor_fraction"] is None
    assert "widened" not in (alone["results"]["candidate"]["speedup_note"] or "")


def test_the_result_and_history_screens_show_intervals_noise_and_the_basis(tmp_path):
    import asyncio

    from pkb_tui.app import PkbApp
    from pkb_tui.app.screens.history import HistoryScreen
    from tests.app_fixtures import app_config, screen_text

    db = tmp_path / "runs.db"
    nccl_run = _stored_run(db)
    cpu_run = _stored_run(db, mode="cpu")
    app = PkbApp(config=app_config(db))

    async def main() -> None:
        async with app.run_test(size=(110, 40)) as pilot:
            await pilot.pause()
            app.open_result(nccl_run)
            await pilot.pause()
            text = screen_text(app)
            assert "1.03× ▲ [1.01, 1.05]" in text and "within this host's noise (±4.0%)" in text
            assert "eager med" in text and "graph med" in text and "1.0 µs" in text
            await pilot.press("escape")
            app.open_result(cpu_run)
            await pilot.pause()
            assert CPU_LABEL in screen_text(app)
            await pilot.press("escape")
            await pilot.press("h")
            await pilot.pause()
            assert isinstance(app.screen, HistoryScreen)
            await pilot.press("e")  # the speedup basis: graph
            await pilot.pause()
            assert app.config.speedup_basis == "graph"
            assert "2.00× ▲" in screen_text(app)
            await pilot.press("b")
            await pilot.pause()
            assert "(latest run per task, graph)" in screen_text(app)

    asyncio.run(main())


def test_the_noise_floor_is_kept_per_timing_method_and_a_run_is_judged_by_its_own():
    from pkb_tui.engine import stats

    def run(run_id, task, status, **candidate):
        return {"id": run_id, "task_id": task, "status": status, "host_id": 1, "results": {"candidate": candidate}}

    runs = [
        run(1, "all_reduce", "passed", speedup=1.10, speedup_eager=1.10, speedup_eager_low=1.0, speedup_eager_high=1.2,
            speedup_graph=1.01, speedup_graph_low=1.01, speedup_graph_high=1.02, rounds=8),
        run(2, "broadcast", "passed", speedup=0.8, speedup_eager=0.8, speedup_eager_low=0.7, speedup_eager_high=0.8,
            rounds=8),  # not capturable: no graph figure
        run(3, "gather", "timeout"),
    ]
    per_task, floors = cal.noise_floors_from_runs(runs)
    # all_reduce's eager interval holds 1.0 (asks for nothing); broadcast's reaches up to its point
    # only, so the whole of 0.8x (1/0.8 - 1) is the floor; graph: 1.01 with nothing below it
    assert floors["eager"] == pytest.approx(0.25)
    assert floors["graph"] == pytest.approx(0.01)
    assert per_task["all_reduce"]["graph_speedup"] == 1.01 and "graph_speedup" not in per_task["broadcast"]
    assert per_task["gather"] == {"run_id": 3, "status": "timeout"}
    row = {"noise_floor_fraction": floors["eager"], "detail": {"graph_noise_floor_fraction": floors["graph"]}}
    assert stats.noise_floor_for(row, "eager") == pytest.approx(0.25)
    assert stats.noise_floor_for(row, "graph") == pytest.approx(0.01)
    # a row from before the graph floor was kept: the graph basis takes the eager floor
    assert stats.noise_floor_for({"noise_floor_fraction": 0.2, "detail": {}}, "graph") == 0.2
    assert stats.noise_floor_for(None, "graph") is None
    assert cal._figure_text({**row, "kind": "noise_floor"}) == "+-25.0% (graph +-1.0%)"
    # nothing passed: no floor
    assert cal.noise_floors_from_runs([runs[2]])[1] == {"eager": None, "graph": None}


def test_a_speedup_capped_at_the_speed_alone_says_so_in_show_and_on_the_result_screen(cli, tmp_db):
    from pkb_tui.app.screens.result import speedup_cell
    from pkb_tui.engine import stats, timing

    run_id = _stored_run(tmp_db)
    alone = stats.SpeedupEstimate(1.1, 0.8, 1.6, "median of 6 per-round ratios", 6, 0.95)
    with Store(tmp_db) as store:
        stored = store.run(run_id)["results"]["candidate"]
        capped = timing.cap_at_alone({**stored, "speedup": 4.4, "speedup_eager": 4.4, "speedup_eager_low": 1.75,
                                      "speedup_eager_high": 6.1}, alone, "eager", 139)
        store.add_result(run_id, "candidate", {k: capped[k] for k in ("speedup", "speedup_low", "speedup_high",
                                                                       "speedup_eager", "speedup_note")})
    text = cli("show", str(run_id)).out
    assert "speedup: the speedup of calls one at a time (1.10x [0.80, 1.60])" in text
    assert "in blocks of 139 calls it read eager 4.40x [1.75, 6.10]" in text
    with Store(tmp_db) as store:
        cell = speedup_cell(store.run(run_id)["results"]["candidate"], "candidate").plain
    assert "1.10" in cell and "calls one at a time" in cell
    plain = _stored_run(tmp_db)
    assert "speedup:" not in cli("show", str(plain)).out
    with Store(tmp_db) as store:
        assert "calls one at a time" not in speedup_cell(store.run(plain)["results"]["candidate"], "candidate").plain
