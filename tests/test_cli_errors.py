"""Bad input gets one clear sentence and a usage exit code, never a traceback, and loses nothing.

(A bad candidate file is not bad input: it is that model's failed run, tests/test_invalid_candidates.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pkb_tui.store import Store
from tests.conftest import fixture_model


def _one_sentence(result) -> str:
    assert "Traceback" not in result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result.err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--task", "no_such_task", "--model", "baseline"), "Unknown task 'no_such_task'"),
        (("--task", "all_reduce", "--model", "no-such-model"), "Unknown model 'no-such-model'"),
        (("--task", "all_reduce", "--model", "baseline", "--mode", "nccl", "--world-size", "64"), "nccl mode needs one GPU per rank"),
        (("--task", "all_reduce", "--model", "baseline", "--dtype", "int8"), "does not support dtype int8"),
        (("--task", "all_reduce", "--model", "baseline", "--size", "huge"), "Unknown size 'huge'"),
        (("--task", "all_reduce", "--model", "baseline", "--trials", "0"), "--trials must be at least 1"),
        (("--task", "all_reduce", "--model", "baseline", "--iterations", "0"), "--iterations must be at least 1"),
        (("--task", "all_reduce", "--model", "baseline", "--iterations", "-5"), "--iterations must be at least 1"),
        (("--task", "all_reduce", "--model", "baseline", "--warmup", "-1"), "--warmup must be 0 or more"),
        (("--task", "all_reduce", "--model", "baseline", "--mode", "cpu", "--world-size", "999"),
         "more than cpu mode holds here"),
        (("--task", "all_reduce", "--model", fixture_model("hang"), "--mode", "warp"), "invalid choice"),
    ],
)
def test_bad_run_input_is_one_sentence_and_exit_2(cli, tmp_db: Path, args: tuple[str, ...], expected: str) -> None:
    result = cli("run", *args)
    assert result.code == 2
    assert expected in _one_sentence(result)


def test_verbose_shows_the_traceback(cli, tmp_db: Path) -> None:
    result = cli("--verbose", "run", "--task", "no_such_task", "--model", "baseline")
    assert result.code == 2 and "Traceback" in result.err


def test_a_task_that_does_not_support_the_world_size_says_so(cli, tmp_db: Path) -> None:
    import tasks

    restricted = [t for t in tasks.all_tasks().values() if t.spec.world_sizes or t.spec.min_world_size > 1]
    if not restricted:
        pytest.skip("no task restricts its world sizes")
    task = restricted[0]
    bad = 3 if task.spec.world_sizes and 3 not in task.spec.world_sizes else 1
    result = cli("run", "--task", task.id, "--model", "baseline", "--world-size", str(bad), "--mode", "cpu",
                 "--oversubscribe")
    assert result.code == 2 and f"does not run at world size {bad}" in _one_sentence(result)


def test_a_corrupt_database_is_refused_and_left_as_it_was(cli, tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    db.write_bytes(b"this is not sqlite at all" * 100)
    before = db.read_bytes()
    result = cli("--db", str(db), "runs")
    assert result.code == 2
    assert "not a pkb-tui database or is corrupt" in _one_sentence(result)
    assert db.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere; the folder check below covers it")
def test_an_unwritable_database_is_refused(cli, tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    Store(db).close()
    db.chmod(0o444)
    result = cli("--db", str(db), "runs")
    assert result.code == 2 and "not writable" in _one_sentence(result)


def test_a_database_in_a_missing_folder_is_refused(cli, tmp_path: Path) -> None:
    result = cli("--db", str(tmp_path / "nope" / "runs.db"), "run", "--task", "all_reduce", "--model", "baseline")
    assert result.code == 2 and "does not exist" in _one_sentence(result)


def test_listings(cli, tmp_db: Path) -> None:
    tasks_out = cli("tasks", "--json").json()
    assert {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter"} <= {t["id"] for t in tasks_out}
    models = {m["name"]: m for m in cli("models", "--json").json()}
    assert models["baseline"]["path"] is None
    assert len(models["torch-p2p"]["tasks"]) >= 8
    assert cli("runs").code == 0
    assert "There is no run 5" in _one_sentence(cli("show", "5"))


def test_a_broken_task_module_is_left_out_and_named_while_the_others_load(cli, tmp_db: Path, tmp_path: Path, monkeypatch) -> None:
    # A task module with a syntax error and one that raises on import: each is reported in one
    # line, and every other task still lists, plans and runs.
    import tasks
    import tasks.base as base

    extra = tmp_path / "extra_tasks"
    (extra / "bad").mkdir(parents=True)
    (extra / "bad" / "__init__.py").write_text("")
    (extra / "bad" / "typo_task.py").write_text("TASK = (\n")
    (extra / "bad" / "raising_task.py").write_text("raise RuntimeError('needs a GPU library that is missing')\n")
    monkeypatch.setattr(tasks, "__path__", list(tasks.__path__) + [str(extra)])
    monkeypatch.setattr(base, "_registry", None)
    monkeypatch.setattr(base, "_broken", {})
    listed = cli("tasks", "--json")
    assert listed.code == 0 and len(listed.json()) >= 35
    assert "tasks.bad.typo_task did not load" in listed.err and "SyntaxError" in listed.err
    assert "tasks.bad.raising_task did not load" in listed.err and "needs a GPU library" in listed.err
    unknown = cli("run", "--task", "typo_task", "--model", "baseline", "--world-size", "2", "--mode", "cpu")
    assert unknown.code == 2 and "tasks.bad.typo_task failed to load (SyntaxError" in unknown.err
    ran = cli("run", "--task", "all_reduce", "--model", "baseline", "--world-size", "2", "--mode", "cpu",
              "--size", "small", "--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile")
    assert ran.code == 0, ran.err


def test_more_ranks_than_the_mode_holds_are_refused_unless_oversubscribed() -> None:
    from pkb_tui.engine.launcher import Launcher
    from pkb_tui.engine.modes import SHARED_GPU_MAX_RANKS, check_world_size
    from pkb_tui.engine.request import RunRequest
    from pkb_tui.errors import PkbError

    with pytest.raises(PkbError, match="this box has 2 CPU core"):
        check_world_size(3, "cpu", cpu_count=2)
    check_world_size(3, "cpu", cpu_count=2, oversubscribe=True)
    with pytest.raises(PkbError, match="one GPU per rank and 4 GPU"):
        check_world_size(5, "nccl", gpu_count=4)
    with pytest.raises(PkbError, match="--oversubscribe"):
        check_world_size(SHARED_GPU_MAX_RANKS + 1, "shared-gpu", gpu_count=1)
    check_world_size(SHARED_GPU_MAX_RANKS, "shared-gpu", gpu_count=1)
    cores = len(os.sched_getaffinity(0))
    request = RunRequest(tasks=["all_reduce"], models=["baseline"], world_size=cores + 1, mode="cpu")
    with pytest.raises(PkbError, match="more than cpu mode holds"):
        Launcher("unused.db").plan(request)
    request.oversubscribe = True
    assert [i.task for i in Launcher("unused.db").plan(request)] == ["all_reduce"]


def test_a_database_damaged_mid_file_is_one_sentence_not_an_internal_error(cli, tmp_path: Path) -> None:
    from tests.test_store import _damaged_database

    db = _damaged_database(tmp_path)
    for args in (("runs",), ("runs", "--json"), ("show", "150")):
        result = cli("--db", str(db), *args)
        assert result.code == 3
        sentence = _one_sentence(result)
        assert "is damaged" in sentence and "internal error" not in sentence


def test_json_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    # Enough output to fill the pipe after head has gone: the write then fails with EPIPE.
    db = tmp_path / "runs.db"
    with Store(db) as store:
        with store.transaction() as conn:
            conn.executemany(
                "INSERT INTO runs (batch_id, task_id, model, world_size, mode, dtype, size, trials, timeout_s, request, "
                "status, created_at) VALUES ('b', ?, 'm', 2, 'cpu', 'float32', 'small', 1, 10, '{}', 'passed', 0)",
                [(f"task_{i}",) for i in range(3000)],
            )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        f"{sys.executable} -m pkb_tui.cli --db {db} runs --json --limit 3000 | head -n 3",
        shell=True, capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0
    assert proc.stdout.startswith("[")
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_rm_deletes_runs_and_names_the_missing(cli, tmp_db: Path) -> None:
    from tests.test_store import _run

    with Store(tmp_db) as store:
        first = _run(store, "all_reduce", "m", "passed", 1.0, True)
        second = _run(store, "all_reduce", "m", "failed", None, False)
    result = cli("rm", str(first))
    assert result.code == 0 and f"deleted run(s) {first}" in result.out
    assert [r["id"] for r in cli("runs", "--json").json()] == [second]
    missing = cli("rm", str(first))
    assert missing.code == 2 and f"There is no run {first}" in _one_sentence(missing)


def test_show_lists_kernels_of_both_variants_on_every_rank(cli, tmp_db: Path) -> None:
    from collectors.profiler import PROFILE_CALLS
    from tests.test_store import _run

    with Store(tmp_db) as store:
        run_id = _run(store, "all_reduce", "m", "passed", 1.2, True)
        store.add_kernels(run_id, [
            {"variant": variant, "rank": rank, "name": f"{variant}_kernel_{i:02d}", "category": "compute",
             "calls": PROFILE_CALLS, "total_us": 100.0 - i, "mean_us": 1.0}
            for variant in ("baseline", "candidate") for rank in (0, 1) for i in range(12)
        ])
    top = cli("show", str(run_id), "--kernels", "3").out
    assert f"over {PROFILE_CALLS} calls of each variant" in top and "on each of 2 rank(s)" in top
    for variant in ("baseline", "candidate"):
        rows = [line.split() for line in top.splitlines() if line.startswith(variant)]
        assert {(r[1], r[3]) for r in rows} == {(rank, f"{variant}_kernel_{i:02d}") for rank in "01" for i in range(3)}
        assert f"9 more {variant} kernel(s)" in top
    every = cli("show", str(run_id), "--kernels", "all").out
    assert sum(line.startswith(("baseline", "candidate")) for line in every.splitlines()) == 2 * 2 * 12
    assert "more" not in every
    assert cli("show", str(run_id), "--kernels", "0").code == 2


def test_modes_dtypes_and_statuses_have_one_source() -> None:
    import tasks.base
    from pkb_tui.app.format import STATUS_STYLES
    from pkb_tui.cli import build_parser
    from pkb_tui.engine.modes import DTYPES, MODE_CHOICES
    from pkb_tui.store.schema import RUN_STATUSES
    from pkb_tui.store.statuses import STATUS_MARKS, STATUSES

    assert DTYPES == tuple(tasks.base.DTYPES)
    assert RUN_STATUSES is STATUSES and set(STATUS_MARKS) == set(STATUSES) == set(STATUS_STYLES)
    assert len(set(STATUS_MARKS.values())) == len(STATUSES)  # every status its own mark
    run = next(a for a in build_parser()._subparsers._group_actions[0].choices["run"]._actions if a.dest == "mode")
    assert tuple(run.choices) == MODE_CHOICES


def test_monitor_records_only_when_asked_as_the_dashboard(cli, tmp_db: Path, capsys) -> None:
    import sqlite3

    from pkb_tui.cli import build_parser

    monitor = build_parser()._subparsers._group_actions[0].choices["monitor"]
    assert "not recorded, as the dashboard's Monitor" in " ".join(monitor.format_help().split())

    def samples() -> int:
        if not tmp_db.exists():
            return 0
        with sqlite3.connect(tmp_db) as conn:
            return conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]

    assert cli("monitor", "--duration", "0.6", "--interval", "0.1", "--json").code == 0
    assert samples() == 0
    assert cli("monitor", "--duration", "0.6", "--interval", "0.1", "--json", "--record").code == 0
    assert samples() > 0
