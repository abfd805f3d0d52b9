"""Per-problem scores (pass@k, fast_p) over a real runs.db, and the Result screen's two verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkb_tui.store import Store


def _run(store: Store, model: str, task: str, status: str, correct: bool, speedup: float | None) -> int:
    run_id = store.create_run({
        "batch_id": "b", "task_id": task, "model": model, "world_size": 2, "mode": "cpu", "dtype": "bfloat16",
        "size": "small", "trials": 3, "timeout_s": 60.0, "request": {}, "status": status,
    })
    store.add_result(run_id, "candidate", {"correct": int(correct), "speedup": speedup})
    return run_id


def test_pass_at_k_and_fast_p_per_problem_from_the_runs(tmp_path: Path) -> None:
    from pkb_tui.pkb.board import problem_scores

    with Store(tmp_path / "runs.db") as store:
        # problem 1: 4 runs, 1 correct; the latest correct and 2x faster
        for correct, speedup in ((False, None), (False, None), (False, None), (True, 2.0)):
            _run(store, "m", "pkb/1_all_reduce", "passed" if correct else "failed", correct, speedup)
        # problem 2: 2 runs, both correct, the latest 1.2x; a running run does not count
        _run(store, "m", "pkb/2_all_gather", "passed", True, 3.0)
        _run(store, "m", "pkb/2_all_gather", "passed", True, 1.2)
        _run(store, "m", "pkb/2_all_gather", "running", False, None)
        _run(store, "m", "all_reduce", "passed", True, 5.0)  # not a PKB problem
        (model,) = problem_scores(store.conn, prefix="pkb/")
    assert [p.task_id for p in model.problems] == ["pkb/1_all_reduce", "pkb/2_all_gather"]
    first, second = model.problems
    assert first.pass_at(1) == pytest.approx(0.25)
    assert first.pass_at(2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert second.pass_at(2) == 1.0 and second.pass_at(3) is None  # fewer runs than k
    assert model.pass_at(1) == pytest.approx((0.25 + 1.0) / 2)
    assert model.pass_at(3) == pytest.approx(0.75)  # 1 - C(3,3)/C(4,3); problem 2 has too few runs
    assert model.fast(1.0) == 1.0 and model.fast(1.5) == 0.5  # latest runs: 2.0x and 1.2x


def test_fast_p_judges_a_timed_run_by_its_interval_widened_by_the_noise_floor(tmp_path: Path) -> None:
    from pkb_tui.pkb.board import problem_scores

    def timed(task: str, speedup: float, low: float, floor: float | None) -> None:
        run_id = store.create_run({
            "batch_id": "b", "task_id": task, "model": "m", "world_size": 1, "mode": "nccl", "dtype": "bfloat16",
            "size": "small", "trials": 3, "timeout_s": 60.0, "request": {}, "status": "passed",
        })
        store.add_result(run_id, "candidate", {"correct": 1, "speedup": speedup, "speedup_low": low, "rounds": 8,
                                               "noise_floor_fraction": floor})

    with Store(tmp_path / "runs.db") as store:
        timed("pkb/1_all_reduce", 1.6, 1.55, None)   # clears 1 and 1.5
        timed("pkb/2_all_gather", 1.6, 0.98, None)   # point 1.6, interval reaches below 1: neither
        timed("pkb/3_reduce_scatter", 1.04, 1.02, 0.03)  # clears 1 by its interval, not once widened by 3%
        timed("pkb/4_all_to_all", 1.6, 1.52, 0.03)   # clears 1; 1.52 / 1.03 is below 1.5
        (model,) = problem_scores(store.conn, prefix="pkb/")
    assert [p.fast(1.0) for p in model.problems] == [True, False, False, True]
    assert [p.fast(1.5) for p in model.problems] == [True, False, False, False]
    assert model.fast(1.0) == 0.5 and model.fast(1.5) == 0.25


def test_the_result_screen_names_both_verdicts_when_they_differ() -> None:
    from pkb_tui.app.screens.result import verdicts_note

    note = "rank 0: output: dtype torch.float32, expected torch.bfloat16; verdicts differ: PKB's allclose passes"
    run = {"request": {"extra": {"pkb": {"tolerance": "pkb-tui"}}}, "trial_results": [
        {"trial": 0, "correct": False, "message": note}, {"trial": 1, "correct": False, "message": note},
        {"trial": 2, "correct": False, "message": "rank 1: 3 elements outside tolerance"},
        {"trial": -1, "correct": False, "message": None},
    ]}
    text = verdicts_note(run)
    assert text is not None
    assert text.plain == "verdicts differ: pkb-tui's check (judging) 0/3 trials, PKB's allclose(1e-2, 1e-2) 2/3"
    run["trial_results"] = [{"trial": 0, "correct": True, "message": None}]
    assert verdicts_note(run) is None
