"""Bad input gets one clear sentence and a usage exit code, never a traceback, and loses nothing.

(A bad candidate file is not bad input: it is that model's failed run, tests/test_invalid_candidates.py.)"""

from __future__ import annotations

import os
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
    result = cli("run", "--task", task.id, "--model", "baseline", "--world-size", str(bad), "--mode", "cpu")
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
