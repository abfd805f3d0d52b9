"""The fsdp, vocab, pipeline, graph, scientific and other task families, beyond the shared check.

tests/test_task_reference.py proves every baseline right in float32 at world sizes 2 and 4. Here:
the same proof in every dtype a task lists (the tolerances must hold the real rounding of bf16,
not only float32's), at world size 3 (nothing may assume a power of two) and at world size 1 (no
peers at all); and the traffic models of the realistic sizes are well formed for the world sizes
of an 8-GPU box. Baselines must also leave their inputs as they found them (timed iterations
reuse the same inputs).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tasks
from pkb_tui.engine.compare import compare_outputs
from tests._dist import rank_failures as _failures, run_distributed

FAMILIES = ("fsdp", "vocab", "pipeline", "graph", "scientific", "other")
SEEDS = (21, 22)


def _suite() -> dict[str, tasks.Task]:
    return {tid: t for tid, t in tasks.all_tasks().items() if t.spec.family in FAMILIES}


def _check(rank: int, world_size: int) -> dict[str, dict]:
    """On one rank: each suite task's baseline against its reference, in each of its dtypes."""
    out: dict[str, dict] = {}
    for task_id, task in _suite().items():
        for dtype in task.spec.dtypes:
            key = f"{task_id}/{dtype}"
            try:
                task.check_request(world_size=world_size, mode="cpu", dtype=dtype, size="small")
            except Exception as exc:
                out[key] = {"skipped": str(exc)}
                continue
            worst = None
            for seed in SEEDS:
                ctx = task.context(rank=rank, world_size=world_size, dtype=dtype, size="small", seed=seed)
                expected = task.reference([task.make_inputs(ctx.for_rank(r)) for r in range(world_size)], ctx)[rank]
                inputs = task.make_inputs(ctx)
                untouched = tuple(t.clone() for t in inputs)
                got = task.baseline(*inputs)
                cmp = compare_outputs(got, expected, task.spec.tolerance(dtype))
                if not all(torch.equal(a, b) for a, b in zip(inputs, untouched)):
                    # timed iterations reuse their inputs: a baseline must not change them
                    cmp = dataclasses.replace(cmp, correct=False, message="the baseline changed its inputs")
                if worst is None or not cmp.correct:
                    worst = cmp
                torch.distributed.barrier()
            out[key] = {"correct": worst.correct, "message": worst.message}
    return out


def test_the_suite_has_at_least_two_tasks_in_each_of_its_families() -> None:
    by_family = {f: [t for t in _suite().values() if t.spec.family == f] for f in FAMILIES}
    assert all(len(found) >= 2 for found in by_family.values()), {f: len(v) for f, v in by_family.items()}


@pytest.mark.parametrize("world_size", [1, 3])
def test_baselines_equal_the_maths_in_every_dtype(world_size: int) -> None:
    per_rank = run_distributed(world_size, _check, timeout_s=600)
    skipped = {k: v["skipped"] for k, v in per_rank[0].items() if v.get("skipped")}
    assert not skipped, skipped  # every suite task runs on one rank and on three
    assert any(k.endswith("bfloat16") for k in per_rank[0])
    assert not _failures(per_rank)


@pytest.mark.parametrize("size", ["default", "large"])
def test_realistic_sizes_have_a_traffic_model_on_an_eight_gpu_box(size: str) -> None:
    for task in _suite().values():
        dtype = task.spec.dtypes[0]
        for world_size in (1, 2, 4, 8):
            task.check_request(world_size=world_size, mode="nccl", dtype=dtype, size=size)
            for rank in range(world_size):
                ctx = task.context(rank=rank, world_size=world_size, dtype=dtype, size=size)
                model = task.traffic(ctx)
                assert min(model.send_bytes, model.recv_bytes, model.memory_bytes, model.flops) >= 0, task.id
                if world_size > 1:
                    assert model.memory_bytes > 0, task.id  # (alone, a halo exchange has nothing to do)
                else:
                    assert model.wire_bytes == 0, f"{task.id}: a single rank has no peer to talk to"
        busiest = max(task.traffic(task.context(rank=r, world_size=8, dtype=dtype, size=size)).wire_bytes
                      for r in range(8))
        assert busiest > 0, f"{task.id}: eight ranks exchange nothing"
