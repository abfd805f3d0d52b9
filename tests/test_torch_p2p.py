"""The torch-p2p solution set: every algorithm, built from sends and receives alone, gives what the
task's reference maths says, on every rank, on real gloo processes.

One spawn per world size runs all eight solutions over two fresh trials each (process start-up is
the cost here). World size 3 is in the list for the rings and trees: n that divides nothing and is
no power of two. Each solution must also leave its input untouched and return new memory.
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache

import pytest
import torch
import torch.distributed as dist

import tasks
from pkb_tui.engine.compare import compare_outputs, find_aliasing, float64_copies, judge_outputs
from pkb_tui.engine.solutions import find_model
from tests._dist import run_distributed

MODEL = "torch-p2p"
BASIC_COLLECTIVES = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
)
WORLD_SIZES = (2, 3, 4)
TRIAL_SEEDS = (21, 22)
# Beyond the small size (10,007 elements: no world size divides it), a tensor shorter than the
# world: some ring chunks are empty and must be skipped by both ends alike.
EXTRA_CASES = {"all_reduce": {"numel": 3}, "broadcast": {"numel": 1}, "reduce": {"numel": 1}}


def _load_solution(task_id: str):
    path = find_model(MODEL).solution_file(task_id)
    spec = importlib.util.spec_from_file_location(f"torch_p2p_{task_id}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.solution


def _one_call(task, solution, rank: int, world_size: int, seed: int, params: dict) -> dict:
    ctx = task.context(rank=rank, world_size=world_size, dtype="float32", size="small", seed=seed)
    ctx.params = params
    inputs = task.make_inputs(ctx)
    untouched = [t.clone() for t in inputs]
    got = solution(*inputs)
    expected = task.reference([task.make_inputs(ctx.for_rank(r)) for r in range(world_size)], ctx)[rank]
    cmp = compare_outputs(got, expected, task.spec.tolerance("float32"))
    # The judge's way too: against the baseline's own error, its truth from float64 copies.
    baseline_out = task.baseline(*[t.clone() for t in untouched])
    truth = task.baseline(*float64_copies(untouched))
    cmp = cmp.merge(judge_outputs(got, baseline_out, truth, task.spec.output_tolerance))
    problems = [cmp.message] if not cmp.correct else []
    if (aliasing := find_aliasing(got, inputs)) is not None:
        problems.append(aliasing)
    if any(not torch.equal(before, after) for before, after in zip(untouched, inputs)):
        problems.append("the solution modified its input")
    dist.barrier()
    return {"seed": seed, "params": params, "problems": problems, "input_sum": float(inputs[0].double().sum())}


def _run_every_solution(rank: int, world_size: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {}
    for task_id in BASIC_COLLECTIVES:
        task = tasks.load_task(task_id)
        solution = _load_solution(task_id)
        cases = [(seed, dict(task.spec.sizes["small"])) for seed in TRIAL_SEEDS]
        if task_id in EXTRA_CASES:
            cases.append((TRIAL_SEEDS[0], EXTRA_CASES[task_id]))
        results[task_id] = [_one_call(task, solution, rank, world_size, seed, params) for seed, params in cases]
    return results


@lru_cache(maxsize=None)
def _outcomes(world_size: int) -> list[dict[str, list[dict]]] | str:
    """Every rank's results, or why the spawn failed (kept too: a hang must cost one wait, not 8)."""
    try:
        # Healthy: ~10 s per world size on 2 cores; a solution that deadlocks ends here instead.
        return run_distributed(world_size, _run_every_solution, timeout_s=120)
    except AssertionError as exc:
        return str(exc)


def test_the_set_covers_the_eight_basic_collectives_and_says_what_it_is() -> None:
    model = find_model(MODEL)
    assert model.covers(list(BASIC_COLLECTIVES)) == list(BASIC_COLLECTIVES)
    manifest = json.loads((model.path / "manifest.json").read_text())
    assert manifest["model"] == MODEL and manifest["backend"] == "torch.distributed p2p"
    assert manifest["provider"] and manifest["notes"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("task_id", BASIC_COLLECTIVES)
def test_solution_matches_the_reference_on_every_rank_over_fresh_trials(task_id: str, world_size: int) -> None:
    outcomes = _outcomes(world_size)
    assert not isinstance(outcomes, str), f"the ranks failed at world size {world_size}:\n{outcomes}"
    per_rank = [rank_results[task_id] for rank_results in outcomes]
    for rank, calls in enumerate(per_rank):
        for call in calls:
            assert not call["problems"], f"rank {rank}, seed {call['seed']}, {call['params']}: {call['problems']}"
    # The two trials really drew fresh inputs (a solution caching its first answer would fail).
    trial_sums = {call["input_sum"] for call in per_rank[0][: len(TRIAL_SEEDS)]}
    assert len(trial_sums) == len(TRIAL_SEEDS)
