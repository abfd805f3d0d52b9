"""The tensor, sequence, context, expert and data task families, beyond the shared check.

tests/test_task_reference.py proves every baseline right in float32 at world sizes 2 and 4. Here:
the same proof in bfloat16 (the tolerances must hold the real rounding, not only float32's), at
world size 1 (no peers) and at world size 3 for the tasks that allow it; plausible bugs (a bias
added on every rank, a missing causal mask, experts swapped...) fail against the same references,
so the tolerances are tight enough to catch them; DDP's multi-bucket path is right; and the traffic
models of the realistic sizes are well formed on an 8-GPU box.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import tasks
from pkb_tui.engine.compare import compare_outputs
from tests._dist import rank_failures as _failures, run_distributed

FAMILIES = ("tensor", "sequence", "context", "expert", "data")
SEEDS = (31, 32)


def _suite() -> dict[str, tasks.Task]:
    return {tid: t for tid, t in tasks.all_tasks().items() if t.spec.family in FAMILIES}


def _compare(task: tasks.Task, fn, rank: int, world_size: int, dtype: str, seed: int):
    ctx = task.context(rank=rank, world_size=world_size, dtype=dtype, size="small", seed=seed)
    expected = task.reference([task.make_inputs(ctx.for_rank(r)) for r in range(world_size)], ctx)[rank]
    got = fn(*task.make_inputs(ctx))
    dist.barrier()
    return compare_outputs(got, expected, task.spec.tolerance(dtype))


def _check_baselines(rank: int, world_size: int, dtypes: tuple[str, ...]) -> dict[str, dict]:
    """On one rank: each suite task's baseline against its reference, per dtype."""
    out: dict[str, dict] = {}
    for task_id, task in _suite().items():
        for dtype in dtypes:
            key = f"{task_id}/{dtype}"
            try:
                task.check_request(world_size=world_size, mode="cpu", dtype=dtype, size="small")
            except Exception as exc:
                out[key] = {"skipped": str(exc)}
                continue
            results = [_compare(task, task.baseline, rank, world_size, dtype, seed) for seed in SEEDS]
            failed = [r for r in results if not r.correct]
            out[key] = {"correct": not failed, "message": failed[0].message if failed else None}
    return out


def test_the_suite_has_at_least_two_tasks_in_each_of_its_families() -> None:
    by_family = {f: [t for t in _suite().values() if t.spec.family == f] for f in FAMILIES}
    assert all(len(found) >= 2 for found in by_family.values()), {f: len(v) for f, v in by_family.items()}
    assert len(_suite()) >= 13
    for task in _suite().values():
        assert task.spec.source and task.spec.why, task.id
        assert set(task.spec.sizes) == {"small", "default", "large"}, task.id


def test_bfloat16_baselines_equal_the_maths_at_world_size_four() -> None:
    per_rank = run_distributed(4, _check_baselines, ("bfloat16",), timeout_s=600)
    assert not [k for k, v in per_rank[0].items() if v.get("skipped")]
    assert not _failures(per_rank)


def test_baselines_equal_the_maths_on_one_rank_and_on_three() -> None:
    alone = run_distributed(1, _check_baselines, ("float32", "bfloat16"), timeout_s=600)
    assert not [k for k, v in alone[0].items() if v.get("skipped")], "every task runs on one rank"
    assert not _failures(alone)
    three = run_distributed(3, _check_baselines, ("float32", "bfloat16"), timeout_s=600)
    ran = [k for k, v in three[0].items() if not v.get("skipped")]
    # The tasks that need no even split (ring attention, the router loss, the data family) run at 3.
    assert {"cp_ring_attention/float32", "ep_load_balance_loss/float32", "dp_int8_allreduce/bfloat16"} <= set(ran)
    assert not _failures(three)


# ---------------------------------------------------------------- plausible bugs must fail
# Each mutant is the baseline with one realistic mistake; it must fail against the reference.

def _row_linear_bias_on_every_rank(x_shard, weight_shard, bias):
    partial = F.linear(x_shard, weight_shard, bias)  # bias before the reduction: added n times
    dist.all_reduce(partial)
    return partial


def _ring_attention_without_diagonal_mask(q, k, v):
    from tasks.context import cp_ring_attention as task

    real_fill = torch.Tensor.masked_fill_
    torch.Tensor.masked_fill_ = lambda self, mask, value: self  # the diagonal block unmasked
    try:
        return task.baseline(q, k, v)
    finally:
        torch.Tensor.masked_fill_ = real_fill


def _moe_with_local_experts_reversed(x, topk_idx, topk_weight, expert_weight):
    from tasks.expert import ep_moe_dispatch_combine as task

    return task.baseline(x, topk_idx, topk_weight, expert_weight.flip(0))


def _contrastive_labels_without_rank_offset(image_features, text_features, logit_scale):
    from tasks.data import dp_contrastive_loss as task

    real_rank = dist.get_rank
    dist.get_rank = lambda group=None: 0
    try:
        return task.baseline(image_features, text_features, logit_scale)
    finally:
        dist.get_rank = real_rank


def _layernorm_weight_grads_not_reduced(x_shard, grad_out_shard, gamma):
    from tasks.sequence import sp_layernorm_backward as task

    real = task._comm.all_reduce
    task._comm.all_reduce = lambda tensor, *args, **kwargs: tensor
    try:
        return task.baseline(x_shard, grad_out_shard, gamma)
    finally:
        task._comm.all_reduce = real


def _router_counts_local_only(router_logits, topk_idx):
    from tasks.expert import ep_load_balance_loss as task

    out = task.baseline(router_logits, topk_idx)
    out["tokens_per_expert"] = torch.bincount(topk_idx.reshape(-1), minlength=router_logits.shape[1])
    return out


def _bucketed_sum_instead_of_mean_for_one_bucket(*grads):
    from tasks.data import dp_bucketed_allreduce as task

    out = list(task.baseline(*grads))
    out[-1] = out[-1] * dist.get_world_size()  # the first bucket (last parameter) not divided
    return tuple(out)


MUTANTS = {
    "tp_row_linear_allreduce": _row_linear_bias_on_every_rank,
    "cp_ring_attention": _ring_attention_without_diagonal_mask,
    "ep_moe_dispatch_combine": _moe_with_local_experts_reversed,
    "dp_contrastive_loss": _contrastive_labels_without_rank_offset,
    "sp_layernorm_backward": _layernorm_weight_grads_not_reduced,
    "ep_load_balance_loss": _router_counts_local_only,
    "dp_bucketed_allreduce": _bucketed_sum_instead_of_mean_for_one_bucket,
}


def _check_mutants(rank: int, world_size: int) -> dict[str, bool]:
    return {
        task_id: _compare(tasks.load_task(task_id), mutant, rank, world_size, "bfloat16", SEEDS[0]).correct
        for task_id, mutant in MUTANTS.items()
    }


def _check_many_buckets(rank: int, world_size: int) -> dict:
    from tasks.data import dp_bucketed_allreduce as module

    module.FIRST_BUCKET_CAP_BYTES, module.BUCKET_CAP_BYTES = 64, 512  # small caps: many buckets
    task = tasks.load_task("dp_bucketed_allreduce")
    ctx = task.context(rank=rank, world_size=world_size, dtype="float32", size="small", seed=SEEDS[0])
    buckets = module.bucket_assignment(task.make_inputs(ctx))
    cmp = _compare(task, task.baseline, rank, world_size, "float32", SEEDS[0])
    return {"buckets": buckets, "correct": cmp.correct, "message": cmp.message}


def test_plausible_bugs_fail_against_the_references_in_bfloat16() -> None:
    per_rank = run_distributed(4, _check_mutants, timeout_s=600)
    # A mistake must show on some rank (labels without the rank offset are right on rank 0).
    passed_everywhere = [t for t in MUTANTS if all(results[t] for results in per_rank)]
    assert not passed_everywhere


def test_ddp_buckets_close_at_their_caps_and_stay_right() -> None:
    per_rank = run_distributed(2, _check_many_buckets, timeout_s=600)
    for result in per_rank:
        assert result["correct"], result["message"]
        # Reverse order; a bucket closes once it reaches its cap (64 bytes first, then 512): the
        # 4-byte logit scale and two 48-byte norm gradients, then [fc2 bias, fc2 weight]...
        assert result["buckets"] == [[12, 11, 10], [9, 8], [7, 6], [5, 4, 3, 2], [1, 0]]


# ---------------------------------------------------------------- single-process checks

def test_int8_codes_are_the_nearest_multiples_of_each_blocks_scale() -> None:
    from tasks.data.dp_int8_allreduce import BLOCK, quantise

    grad = torch.randn(3 * BLOCK + 17) * torch.linspace(0.1, 10, 3 * BLOCK + 17)
    grad[BLOCK:2 * BLOCK] = 0.0  # an all-zero block decodes to zeros, not NaN
    codes, scale = quantise(grad)
    assert codes.shape == (4, BLOCK) and codes.dtype == torch.int8
    assert torch.equal(scale[1], torch.tensor(1.0)) and not codes[1].any()
    decoded = (codes.float() * scale.unsqueeze(1)).view(-1)[: grad.numel()]
    assert float((decoded - grad).abs().max()) <= float(scale.max()) / 2 * 1.0001
    assert int(codes.abs().amax(dim=1)[0]) == 127  # the block maximum uses the whole range
    assert not codes[3, 17:].any()  # the short last block's padding stays zero


def test_realistic_sizes_have_a_traffic_model_on_an_eight_gpu_box() -> None:
    for task in _suite().values():
        dtype = task.spec.dtypes[-1]
        for size in ("default", "large"):
            for world_size in (1, 2, 4, 8):
                task.check_request(world_size=world_size, mode="nccl", dtype=dtype, size=size)
                models = [task.traffic(task.context(rank=r, world_size=world_size, dtype=dtype, size=size))
                          for r in range(world_size)]
                for model in models:
                    assert min(model.send_bytes, model.recv_bytes, model.flops) >= 0, task.id
                    assert model.memory_bytes > 0 and model.payload_bytes > 0, task.id
                if world_size == 1:
                    assert all(m.wire_bytes == 0 for m in models), f"{task.id}: one rank has no peer"
                    continue
                assert min(m.wire_bytes for m in models) > 0, f"{task.id}: a rank exchanges nothing"
                # Every byte sent is received by someone: the ranks' totals must agree (within the
                # rounding of per-rank integer division).
                sent, received = sum(m.send_bytes for m in models), sum(m.recv_bytes for m in models)
                assert abs(sent - received) <= world_size, f"{task.id} {size} n={world_size}: {sent} != {received}"
