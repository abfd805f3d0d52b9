"""Every task's baseline, run on real gloo ranks, equals plain single-process maths on all inputs.

The baseline must be right, not only agree with itself: each rank runs the baseline on its own
inputs; the reference recomputes every rank's expected output from the inputs of all ranks (made in
one process), with no communication. Runs every registered task at world sizes 2 and 4, size small.
"""

from __future__ import annotations

import pytest
import torch

import tasks
from pkb_tui.engine.compare import compare_outputs
from tests._dist import run_distributed

WORLD_SIZES = (2, 4)
TRIAL_SEEDS = (11, 12)  # two trials: fresh inputs each


def _runnable(task, world_size: int, dtype: str) -> bool:
    try:
        task.check_request(world_size=world_size, mode="cpu", dtype=dtype, size="small")
    except Exception:
        return False
    return True


def _check_all_tasks(rank: int, world_size: int) -> dict[str, dict]:
    """On one rank: run every task's baseline and compare with its reference."""
    out: dict[str, dict] = {}
    for task_id, task in tasks.all_tasks().items():
        dtype = "float32" if "float32" in task.spec.dtypes else task.spec.dtypes[0]
        if not _runnable(task, world_size, dtype):
            out[task_id] = {"skipped": True}
            continue
        worst = None
        for seed in TRIAL_SEEDS:
            ctx = task.context(rank=rank, world_size=world_size, dtype=dtype, size="small", seed=seed)
            inputs_all = [task.make_inputs(ctx.for_rank(r)) for r in range(world_size)]
            inputs = task.make_inputs(ctx)
            got = task.baseline(*inputs)
            expected = task.reference(inputs_all, ctx)[rank]
            cmp = compare_outputs(got, expected, task.spec.tolerance(dtype))
            if worst is None or not cmp.correct:
                worst = cmp
            torch.distributed.barrier()
        out[task_id] = {"correct": worst.correct, "message": worst.message, "max_abs_error": worst.max_abs_error}
    return out


@pytest.fixture(scope="module")
def outcomes() -> dict[int, list[dict[str, dict]]]:
    return {n: run_distributed(n, _check_all_tasks, timeout_s=900) for n in WORLD_SIZES}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("task_id", sorted(tasks.all_tasks()))
def test_baseline_equals_single_process_maths(outcomes, task_id: str, world_size: int) -> None:
    per_rank = [rank_results[task_id] for rank_results in outcomes[world_size]]
    if per_rank[0].get("skipped"):
        pytest.skip(f"{task_id} does not run in cpu mode at world size {world_size}")
    for rank, result in enumerate(per_rank):
        assert result["correct"], f"rank {rank}: {result['message']}"


def test_every_task_runs_in_cpu_mode_at_world_size_two() -> None:
    for task in tasks.all_tasks().values():
        dtype = "float32" if "float32" in task.spec.dtypes else task.spec.dtypes[0]
        assert _runnable(task, 2, dtype) or "cpu" not in task.spec.modes, task.id
