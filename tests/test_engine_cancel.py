"""Cancelling a batch: the run in progress is interrupted, the runs it never reached are cancelled
(they have no partial result to call interrupted). Real torchrun, two gloo ranks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from pkb_tui.engine.launcher import Launcher
from pkb_tui.engine.request import RunRequest
from pkb_tui.store import Store
from tests.conftest import fixture_model


def test_cancel_interrupts_the_run_going_and_cancels_the_ones_not_started(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    request = RunRequest(tasks=["all_reduce", "broadcast"], models=[fixture_model("hang")], world_size=2, mode="cpu",
                         trials=1, iterations=2, warmup=1, profile=False, timeout_s=600)
    cancel = threading.Event()
    outcome: dict = {}
    batch = threading.Thread(target=lambda: outcome.update(result=Launcher(db, runs_dir=tmp_path / "runs").run(
        request, cancel=cancel)))
    batch.start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if db.exists():
            with Store(db, recover=False) as store:
                if any(r["status"] == "running" for r in store.runs(limit=None)):
                    break
        time.sleep(0.2)
    else:
        raise AssertionError("the hung run never started")
    cancel.set()
    batch.join(timeout=120)
    assert not batch.is_alive()
    with Store(db) as store:
        statuses = {r["task_id"]: (r["status"], r["status_detail"]) for r in store.runs(limit=None)}
        latest = store.latest_run_per_task()
    assert statuses["all_reduce"] == ("interrupted", "cancelled by the user")
    assert statuses["broadcast"] == ("cancelled", "cancelled by the user before this run started")
    assert latest == {}  # neither finished: no "last result" comes from them
    assert sorted(outcome["result"].statuses.values()) == ["cancelled", "interrupted"]
