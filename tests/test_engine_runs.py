"""The engine end to end on CPU: real torchrun launches, real gloo ranks, a real SQLite file."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pkb_tui.store import Store
from tests.conftest import fixture_model

COLLECTIVES = "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,reduce,gather,scatter"
FAST = ("--trials", "2", "--iterations", "5", "--warmup", "1")


@pytest.mark.timeout(1800)  # 8 items x (a judge, a baseline and a candidate runner per rank) on 2 cores
@pytest.mark.parametrize("world_size", [2, 4])
def test_every_collective_baseline_against_torch_p2p_in_one_launch(cli, tmp_db: Path, world_size: int) -> None:
    result = cli("run", "--task", COLLECTIVES, "--model", "torch-p2p", "--world-size", str(world_size), "--oversubscribe",
                 "--mode", "cpu", "--no-profile", *FAST, "--json")
    doc = result.json()
    assert result.code == 0, result.err + result.out
    assert [r["task"] for r in doc["runs"]] == COLLECTIVES.split(",")
    for run in doc["runs"]:
        assert run["status"] == "passed", run
        assert run["correct"] is True
        assert run["baseline"]["median_us"] > 0 and run["candidate"]["median_us"] > 0
        # The speedup is the paired estimate over rounds (engine.stats), inside its own interval.
        assert run["speedup_low"] <= run["speedup"] <= run["speedup_high"]
    with Store(tmp_db) as store:
        runs = store.runs(limit=None)
        assert len(runs) == 8 and len({r["batch_id"] for r in runs}) == 1  # one batch
        launches = list(Path(runs[0]["log_path"]).parent.glob("spec.*.json"))
        assert len(launches) == 1  # ranks stayed up for the whole batch
        for run in runs:
            full = store.run(run["id"])
            assert len([t for t in full["trial_results"] if t["trial"] >= 0]) == 2
            assert store.source(full["candidate_source_hash"])["text"].strip()
            assert full["baseline_source_hash"] != full["candidate_source_hash"]


def test_wrong_caching_aliasing_and_clock_patching_candidates(cli, tmp_db: Path) -> None:
    models = ",".join(fixture_model(m) for m in ("wrong", "cache", "alias", "clock-cheat"))
    result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--mode", "cpu",
                 "--trials", "3", "--iterations", "20", "--warmup", "2", "--json")
    assert result.code == 1, result.err
    by_model = {r["model"]: r for r in result.json()["runs"]}
    wrong = by_model["wrong"]
    assert wrong["status"] == "failed" and not wrong["correct"]
    assert wrong["candidate"]["max_abs_error"] > 0.1  # the missing rank's contribution, as a figure
    cache = by_model["cache"]
    assert cache["status"] == "failed"
    with Store(tmp_db) as store:
        trials = store.run(cache["id"])["trial_results"]
    assert trials[0]["correct"] and not trials[1]["correct"]  # right once, wrong on fresh inputs
    alias = by_model["alias"]
    assert alias["status"] == "failed"
    with Store(tmp_db) as store:
        messages = [t["message"] or "" for t in store.run(alias["id"])["trial_results"]]
    assert any("shares memory with an input" in m for m in messages)
    cheat = by_model["clock-cheat"]
    assert cheat["status"] == "passed"
    # The patched clocks return constants: had they reached the harness, times would read 0.
    assert cheat["candidate"]["median_us"] > 0 and cheat["baseline"]["median_us"] > 0
    assert 0.1 < cheat["speedup"] < 10  # same algorithm as the baseline: a ratio near 1, not infinity


@pytest.mark.timeout(1200)
def test_hung_and_crashing_candidates_end_their_runs_and_the_batch_goes_on(cli, tmp_db: Path) -> None:
    models = f"{fixture_model('crash')},{fixture_model('hang')}"
    result = cli("run", "--task", "all_reduce,broadcast", "--model", models, "--world-size", "2",
                 "--mode", "cpu", "--timeout", "60", "--no-profile", *FAST, "--json")  # the hang waits it out
    assert result.code == 1
    doc = result.json()
    statuses = {(r["task"], r["model"]): r["status"] for r in doc["runs"]}
    assert statuses == {("all_reduce", "crash"): "error", ("all_reduce", "hang"): "timeout", ("broadcast", "hang"): "passed"}
    assert any("crash has no solution for task broadcast" in s for s in doc["skipped"])
    crash = next(r for r in doc["runs"] if r["model"] == "crash")
    assert "exited with code 13" in crash["status_detail"]
    with Store(tmp_db) as store:
        batch = {r["batch_id"] for r in store.runs(limit=None)}
        assert len(batch) == 1
        hang = store.run(next(r["id"] for r in doc["runs"] if r["model"] == "hang" and r["task"] == "all_reduce"))
    assert "timeout" in hang["status_detail"]
    # Where the time went, so the user can tell a short --timeout from slow code.
    assert re.search(r"time spent on rank \d: start-up [\d.]+ s, trials [\d.]+ s", hang["status_detail"]), hang["status_detail"]
    assert Path(hang["log_path"]).exists()


@pytest.mark.timeout(600)
def test_a_crashing_candidate_is_an_error_at_one_rank_too(cli, tmp_db: Path) -> None:
    # The crash fixtures die on the last rank: at one rank that is rank 0 (the GPU soak runs at one
    # rank on a one-GPU box, and read them as passed while they died on rank 1 only).
    result = cli("run", "--task", "all_reduce", "--model", fixture_model("crash"), "--world-size", "1",
                 "--mode", "cpu", "--timeout", "60", "--no-timing", "--no-profile", "--trials", "1", "--json")
    assert result.code == 1, result.err
    [run] = result.json()["runs"]
    assert run["status"] == "error" and "exited with code 13" in run["status_detail"], run


def _worker_pids(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "pkb_tui.engine.worker" in cmdline and marker in cmdline:
                pids.append(int(entry))
    return pids


@pytest.mark.parametrize(("sig", "detail"), [
    (signal.SIGKILL, "the launcher stopped before the run finished"),  # found by the next Store open
    (signal.SIGTERM, "cancelled by the user"),  # the launcher cleans up itself
])
def test_a_killed_launcher_leaves_an_interrupted_run_and_no_orphan_ranks(tmp_path: Path, sig, detail: str) -> None:
    db = tmp_path / "runs.db"
    runs_dir = tmp_path / "pkb-runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "run", "--task", "all_reduce", "--model",
         fixture_model("hang"), "--world-size", "2", "--mode", "cpu", "--timeout", "600", "--no-profile"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:
            if db.exists():
                try:
                    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                    row = conn.execute("SELECT status FROM runs").fetchone()
                    conn.close()
                    status = row[0] if row else None
                except sqlite3.Error:
                    status = None
            if status == "running":
                break
            time.sleep(0.2)
        assert status == "running"
        time.sleep(1.0)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    with Store(db) as store:
        (run,) = store.runs(limit=None)
        assert run["status"] == "interrupted"
        assert run["status_detail"] == detail
    # The ranks notice their launcher is gone (heartbeat watchdog) and exit.
    deadline = time.monotonic() + 30
    while _worker_pids(str(runs_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _worker_pids(str(runs_dir)) == []


def test_baseline_and_candidate_are_timed_in_alternating_blocks(cli, tmp_db: Path) -> None:
    # Blocks alternate B C | C B | B C ..., so drift over the timing falls on both variants alike.
    # The rank-0 event file shows the order.
    import json

    result = cli("run", "--task", "all_reduce", "--model", "torch-p2p", "--world-size", "2", "--mode", "cpu",
                 "--trials", "1", "--iterations", "10", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 0, result.err
    run = result.json()["runs"][0]
    # Every block is one per-call figure; both variants have as many, at least 6 rounds' worth.
    assert run["baseline"]["iterations"] == run["candidate"]["iterations"] >= 6
    with Store(tmp_db) as store:
        batch_dir = Path(store.run(run["id"])["log_path"]).parent
    events = [json.loads(line.partition(" ")[2]) for path in sorted(batch_dir.glob("events.*.jsonl"))
              for line in path.read_text().splitlines()]
    order = "".join(e["variant"][0].upper() for e in events if e["event"] == "progress" and e["phase"] == "timing")
    pairs = [order[i:i + 2] for i in range(0, len(order), 2)]
    assert set(pairs) <= {"BC", "CB"} and len(pairs) >= 6, order
    assert all(a != b for a, b in zip(pairs, pairs[1:])), order  # B C, C B, B C, ...


def test_a_candidate_that_raises_while_timed_fails_and_the_baseline_timing_survives(cli, tmp_db: Path) -> None:
    # Trials 1-2 pass; the timing's warm-up block makes calls 3 and 4, the first timed block call 5:
    # it raises there, on both ranks. The run is failed with the candidate's message; the baseline
    # is timed on alone and keeps its figures.
    result = cli("run", "--task", "all_reduce", "--model", fixture_model("raise-in-timing"), "--world-size", "2",
                 "--mode", "cpu", "--trials", "2", "--iterations", "10", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 1, result.err
    run = result.json()["runs"][0]
    assert run["status"] == "failed" and run["correct"] is False  # it raised: not a correct candidate
    assert run["candidate"]["trials_passed"] == 2  # though every checked trial was right
    assert run["baseline"]["iterations"] >= 6 and run["baseline"]["median_us"] > 0
    assert not run.get("candidate", {}).get("median_us")
    with Store(tmp_db) as store:
        detail = store.run(run["id"])["status_detail"] or ""
    assert "the candidate raised during timing" in detail and "out of scratch buffers" in detail


def test_each_ranks_cpu_use_is_recorded_with_the_run(cli, tmp_db: Path) -> None:
    # The ranks report their pids at start; the launcher's host sampler follows them in rank order
    # and the sink stores one row per rank and sample, stamped with the current run.
    result = cli("run", "--task", "all_reduce", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
                 "--trials", "1", "--iterations", "300", "--warmup", "1", "--no-profile", "--json")
    assert result.code == 0, result.err
    run_id = result.json()["runs"][0]["id"]
    shown = cli("show", str(run_id), "--json").json()
    ranks = shown["rank_cpu"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == 2 and os.getpid() not in {r["pid"] for r in ranks}
    assert all(r["samples"] > 0 and r["mean_pct"] > 0 for r in ranks)  # busy in the timed loop
    assert "CPU per rank" in cli("show", str(run_id)).out


def test_a_candidate_cannot_write_outside_the_runs_folders(cli, tmp_db: Path, monkeypatch) -> None:
    # Landlock (where the kernel has it): the rank may write beneath the batch folder, temp and caches;
    # a file in the home folder (or the project, or the database) is refused, and the run goes on.
    from pkb_tui.engine.sandbox import landlock_abi

    if landlock_abi() <= 0:
        pytest.skip("this kernel has no Landlock: the run says 'no write sandbox' instead")
    import uuid

    target = Path.home() / f".pkb-sandbox-probe-{uuid.uuid4().hex}"
    monkeypatch.setenv("PKB_TEST_FORBIDDEN_PATH", str(target))
    try:
        result = cli("run", "--task", "all_reduce", "--model", fixture_model("write-outside"), "--world-size", "2",
                     "--mode", "cpu", "--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile", "--json")
        assert result.code == 0, result.err
        assert not target.exists()
        run = result.json()["runs"][0]
        assert run["status"] == "passed"
        assert not any("no write sandbox" in note for note in run["notes"])
        log = Path(run["log_path"]).read_text()
        assert "write refused: PermissionError" in log and "write allowed" not in log
        assert "scratch read back: scratch is fine" in log  # its own working folder stays writable
        # ... and goes with the batch, as torchrun's temporary folders do (TMPDIR pointed there).
        assert not (Path(run["log_path"]).parent / "scratch").exists()
    finally:
        target.unlink(missing_ok=True)


def test_the_candidates_profiler_trace_reaches_the_batch_folder(cli, tmp_db: Path) -> None:
    # The runner may write only in its scratch folder: it writes the trace there, the judge copies
    # it out (a regular file, not through a link) before the scratch folder goes.
    result = cli("run", "--task", "all_reduce", "--model", "torch-p2p", "--world-size", "2", "--mode", "cpu",
                 "--trials", "1", "--iterations", "4", "--warmup", "1", "--json")
    assert result.code == 0, result.err
    run = result.json()["runs"][0]
    trace = Path(run["trace_path"])
    assert trace.is_file() and trace.parent.parent == tmp_db.parent / "pkb-runs", trace
    assert "traceEvents" in json.loads(trace.read_text())
    log = "\n".join(p.read_text(errors="replace") for p in trace.parent.glob("item000.rank0.candidate.log"))
    assert "Permission denied" not in log, log
