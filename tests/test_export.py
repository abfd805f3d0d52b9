"""runs.db as a data set: the documented views, `pkb-tui export` to CSV / JSON lines / Parquet read
back with the csv module, json and pyarrow, `pkb-tui query` on a read-only connection, and where a
run's profiler traces are. A real SQLite file written through the Store, the CLI called in-process."""

from __future__ import annotations

import csv
import json

import pytest

from collectors.sample import GpuSample, LinkSample
from collectors.sink import write_samples
from pkb_tui.store import Store
from pkb_tui.store.schema import SCHEMA_VERSION
from tests.app_fixtures import KNOWN_RUNS, seed_runs


@pytest.fixture
def seeded(tmp_db):
    ids = seed_runs(tmp_db)
    with Store(tmp_db) as store:
        # Telemetry of the second run: two GPUs, three ticks; one figure n/a (NULL, never 0).
        write_samples(store.conn, [
            GpuSample(ts=1000.0 + t, gpu=g, run_id=ids[1], nvlink_tx_bytes_per_s=1e9 * (t + 1), sm_util_pct=None if g else 50.0,
                      links=[LinkSample(0, 1e8, 2e8)])
            for t in range(3) for g in range(2)
        ])
    return tmp_db, ids


def test_the_views_give_a_run_per_row_and_a_kernel_per_row(seeded):
    db, ids = seeded
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        rows = [dict(r) for r in store.conn.execute("SELECT * FROM run_results ORDER BY run_id")]
        kernels = store.conn.execute("SELECT COUNT(*) FROM kernel_rows").fetchone()[0]
        raw_kernels = store.conn.execute("SELECT COUNT(*) FROM kernels").fetchone()[0]
    assert [r["run_id"] for r in rows] == ids
    for row, known in zip(rows, KNOWN_RUNS):
        assert (row["task_id"], row["model"], row["status"]) == (known.task, known.model, known.status)
        assert row["baseline_median_us"] == known.baseline_us and row["candidate_median_us"] == known.candidate_us
        assert row["speedup"] == (pytest.approx(known.speedup) if known.speedup else None)
        assert row["duration_s"] == pytest.approx(19.0)
    assert rows[0]["hostname"] == "h200-box"
    assert kernels == raw_kernels > 0


def test_export_round_trips_through_csv_jsonl_and_parquet(seeded, cli, tmp_path):
    db, ids = seeded
    import pyarrow.parquet as pq

    back = {}
    for fmt in ("csv", "jsonl", "parquet"):
        out = tmp_path / fmt
        result = cli("export", "--out", str(out), "--format", fmt, "--model", "torch-p2p", "--json")
        assert result.code == 0, result.err
        written = {w["table"]: w for w in result.json()}
        assert set(written) == {"runs", "results", "trials", "kernels", "samples"}
        if fmt == "csv":
            with open(out / "runs.csv") as f:
                runs = list(csv.DictReader(f))
            with open(out / "samples.csv") as f:
                samples = list(csv.DictReader(f))
            back[fmt] = ([int(r["run_id"]) for r in runs], [float(r["candidate_median_us"] or "nan") for r in runs],
                         [s["sm_util_pct"] for s in samples])
        elif fmt == "jsonl":
            runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
            samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
            back[fmt] = ([r["run_id"] for r in runs], [r["candidate_median_us"] for r in runs],
                         [s["sm_util_pct"] for s in samples])
        else:
            runs = pq.read_table(out / "runs.parquet").to_pylist()
            samples = pq.read_table(out / "samples.parquet").to_pylist()
            assert pq.read_table(out / "kernels.parquet").num_rows == written["kernels"]["rows"]
            back[fmt] = ([r["run_id"] for r in runs], [r["candidate_median_us"] for r in runs],
                         [s["sm_util_pct"] for s in samples])
        assert written["runs"]["rows"] == 4 and written["samples"]["rows"] == 6
    expected_ids = [ids[i] for i, k in enumerate(KNOWN_RUNS) if k.model == "torch-p2p"]
    medians = [k.candidate_us for k in KNOWN_RUNS if k.model == "torch-p2p"]
    assert back["jsonl"][0] == back["parquet"][0] == back["csv"][0] == expected_ids
    assert back["jsonl"][1] == back["parquet"][1] == back["csv"][1] == medians
    # GPU 1's SM figure was n/a: empty in CSV, null in JSON and Parquet, never 0
    assert back["jsonl"][2] == back["parquet"][2] == [50.0, None] * 3
    assert back["csv"][2] == ["50.0", ""] * 3


def test_export_filters_and_refuses_what_it_does_not_know(seeded, cli, tmp_path):
    db, ids = seeded
    result = cli("export", "--out", str(tmp_path / "one"), "--run", str(ids[2]), "--tables", "runs,kernels", "--json")
    assert result.code == 0
    kernels = list(csv.DictReader(open(tmp_path / "one" / "kernels.csv")))
    assert {int(k["run_id"]) for k in kernels} == {ids[2]} and kernels[0]["task_id"] == "all_gather"
    assert cli("export", "--out", str(tmp_path / "x"), "--tables", "runs,passwords").code == 2
    bad = cli("export", "--out", str(tmp_path / "x"), "--since", "yesterday")
    assert bad.code == 2 and "--since takes a date" in bad.err


def test_query_prints_a_table_or_json(seeded, cli):
    db, ids = seeded
    result = cli("query", "SELECT task_id, model, speedup FROM run_results WHERE model = 'gpt-x-kernels' ORDER BY run_id", "--json")
    assert result.code == 0
    assert [r["task_id"] for r in result.json()] == ["all_reduce", "all_gather", "reduce_scatter"]
    table = cli("query", "SELECT run_id, status FROM run_results ORDER BY run_id LIMIT 2")
    assert table.out.splitlines()[0].split() == ["run_id", "status"] and "failed" in table.out.splitlines()[1]
    schema = cli("query", "--schema")
    assert "view run_results:" in schema.out and "view kernel_rows:" in schema.out and "table samples:" in schema.out


def test_query_refuses_to_write_with_a_sentence(seeded, cli):
    db, ids = seeded
    for sql in ("DELETE FROM runs", "UPDATE runs SET status = 'passed'", "DROP VIEW run_results",
                "CREATE TABLE x (a)"):
        result = cli("query", sql)
        assert result.code == 2, sql
        assert "only reads the database" in result.err, (sql, result.err)
    with Store(db) as store:
        assert store.conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == len(KNOWN_RUNS)
    two = cli("query", "SELECT 1; DELETE FROM runs")
    assert two.code == 2 and "one statement at a time" in two.err


def test_show_names_both_traces_with_the_command_to_open_them(seeded, cli, tmp_path):
    db, ids = seeded
    for variant in ("baseline", "candidate"):
        (tmp_path / f"item000.{variant}.rank0.trace.json").write_text("[]")
    with Store(db) as store:
        store.update_run(ids[1], trace_path=str(tmp_path / "item000.candidate.rank0.trace.json"))
    result = cli("show", str(ids[1]))
    assert f"baseline trace: {tmp_path / 'item000.baseline.rank0.trace.json'}" in result.out
    assert f"candidate trace: {tmp_path / 'item000.candidate.rank0.trace.json'}" in result.out
    assert "https://ui.perfetto.dev" in result.out


def test_the_result_screen_names_the_traces_too(seeded, tmp_path):
    import asyncio

    from pkb_tui.app import PkbApp
    from tests.app_fixtures import app_config, screen_text

    db, ids = seeded
    for variant in ("baseline", "candidate"):
        (tmp_path / f"item000.{variant}.rank0.trace.json").write_text("[]")
    with Store(db) as store:
        store.update_run(ids[1], trace_path=str(tmp_path / "item000.candidate.rank0.trace.json"))
    app = PkbApp(config=app_config(db))
    seen = {}

    async def main():
        async with app.run_test(size=(200, 50)) as pilot:
            await app.workers.wait_for_complete()
            app.open_result(ids[1])
            await pilot.pause(0.5)
            seen["text"] = screen_text(app)

    asyncio.run(main())
    assert "baseline trace: " in seen["text"] and "item000.baseline.rank0.trace.json" in seen["text"]
    assert "https://ui.perfetto.dev" in seen["text"]
