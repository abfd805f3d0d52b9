"""Per-output tolerances catch the cheats that the old per-dtype tolerances let through.

For every task, dtype and world size 2, 4 and 8, in ONE process (no torchrun: it is maths): every
rank's inputs are made with ctx.for_rank, as tests/test_task_reference.py does; the truth is the
task's reference maths on float64 copies of them; the baseline's outputs in the run dtype are
stood in for by the reference's own (a correct solution's) outputs. The judge
(compare.judge_outputs with the task's output tolerances) must pass those honest outputs and fail
every cheat: int8 transport of the communicated values (one scale per tensor and per 32 elements),
each output alone scaled by 0.9 or offset by a few ulps, the real part alone of complex outputs,
and each task family's skipped steps (ZeRO-1 without the update, the second moment, the bias
correction or the weight decay...).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import tasks
from pkb_tui.engine.compare import compare_outputs, float64_copies, judge_outputs
from tasks.base import OutputTolerance, Tolerance

WORLD_SIZES = (2, 4, 8)
SEED = 7


def _runnable(task: tasks.Task, world_size: int, dtype: str) -> bool:
    try:
        task.check_request(world_size=world_size, mode="cpu", dtype=dtype, size="small")
    except Exception:
        return False
    return True


def _cases() -> list[tuple[str, str, int]]:
    return [
        (task_id, dtype, n)
        for task_id, task in sorted(tasks.all_tasks().items())
        for dtype in task.spec.dtypes
        for n in WORLD_SIZES if _runnable(task, n, dtype)
    ]


# ---------------------------------------------------------------- structure helpers

def _paths(value: Any, path: str = "") -> list[str]:
    """Paths of the floating (or complex) tensors in an output, as judge_outputs names them."""
    if isinstance(value, torch.Tensor):
        return [path] if (value.is_floating_point() or value.is_complex()) else []
    if isinstance(value, (tuple, list)):
        return [p for i, v in enumerate(value) for p in _paths(v, f"{path}/{i}" if path else str(i))]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, f"{path}/{k}" if path else str(k))]
    return []


def _map(value: Any, fn: Callable[[torch.Tensor, str], torch.Tensor], path: str = "") -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value, path) if (value.is_floating_point() or value.is_complex()) else value
    if isinstance(value, tuple):
        return tuple(_map(v, fn, f"{path}/{i}" if path else str(i)) for i, v in enumerate(value))
    if isinstance(value, list):
        return [_map(v, fn, f"{path}/{i}" if path else str(i)) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _map(v, fn, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
    return value


def _at(value: Any, path: str) -> torch.Tensor:
    for key in [k for k in path.split("/") if k]:
        value = value[key] if isinstance(value, dict) else value[int(key)]
    return value


def int8(t: torch.Tensor, block: int | None) -> torch.Tensor:
    """What a candidate sending int8 codes delivers: round(x / scale) * scale, scale = max|x| / 127
    per tensor (block None) or per block of elements, back in the tensor's dtype."""
    if t.is_complex():
        return torch.view_as_complex(int8(torch.view_as_real(t).contiguous(), block))
    flat = t.detach().reshape(-1).to(torch.float32)
    if flat.numel() == 0:
        return t.clone()
    size = flat.numel() if block is None else block
    pad = (-flat.numel()) % size
    blocks = torch.cat([flat, flat.new_zeros(pad)]).view(-1, size)
    scale = blocks.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127
    decoded = (torch.round(blocks / scale) * scale).reshape(-1)[: flat.numel()]
    return decoded.view(t.shape).to(t.dtype)


# ---------------------------------------------------------------- the cheats

class Case:
    """One (task, dtype, world size): every rank's inputs, the truth and the honest outputs."""

    def __init__(self, task_id: str, dtype: str, world_size: int) -> None:
        self.task = tasks.load_task(task_id)
        self.dtype = dtype
        self.ctx = self.task.context(rank=0, world_size=world_size, dtype=dtype, size="small", seed=SEED)
        self.ctx64 = self.task.context(rank=0, world_size=world_size, dtype="float64", size="small", seed=SEED)
        self.inputs = [self.task.make_inputs(self.ctx.for_rank(r)) for r in range(world_size)]
        self.truth = self.reference64(self.inputs)
        self.honest = self.task.reference(self.inputs, self.ctx)

    def reference64(self, inputs: list[tuple]) -> list:
        return self.task.reference([float64_copies(i) for i in inputs], self.ctx64)

    def judge(self, outputs: list) -> list[str | None]:
        """Per rank: None when the judge passes it, else its message."""
        results = []
        for rank, (got, expected, truth) in enumerate(zip(outputs, self.honest, self.truth)):
            cmp = judge_outputs(got, expected, truth, self.task.spec.output_tolerance)
            results.append(None if cmp.correct else f"rank {rank}: {cmp.message}")
        return results


# Tasks whose inputs are what goes over the wire (collectives, halos, gathered features...): int8
# transport of them is the maths on int8-decoded inputs. Elsewhere (weights of a GEMM whose
# partial results are exchanged) the exchanged values are intermediates: FAMILY_CHEATS.
COMMUNICATED_INPUTS = {
    "all_reduce", "reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "gather", "scatter",
    "dp_bucketed_allreduce", "dp_contrastive_loss", "gnn_halo_exchange", "stencil_halo_exchange",
    "cp_ulysses_attention", "cp_ring_attention", "pp_send_recv_microbatches", "tp_allgather_gemm",
    "ep_moe_dispatch_combine", "sample_sort", "distributed_topk",
}


def _differs(outputs: list, honest: list) -> bool:
    """A "cheat" that changes nothing (int8 of a scalar is exact) is no cheat."""
    def flat(value: Any) -> list[torch.Tensor]:
        return [_at(value, p) for p in _paths(value)]
    return any(not torch.equal(a, b) for out, ref in zip(outputs, honest) for a, b in zip(flat(out), flat(ref)))


def _generic_cheats(case: Case) -> dict[str, list]:
    cheats: dict[str, list] = {}
    for block in (None, 32):
        label = "per tensor" if block is None else f"per {block}"
        # The result quantised in transit (the all-gather / all-reduce of the outputs in int8).
        cheats[f"int8 outputs {label}"] = [_map(out, lambda t, p: int8(t, block)) for out in case.honest]
        if case.task.id in COMMUNICATED_INPUTS:
            quantised = [tuple(_map(list(inp), lambda t, p: int8(t, block))) for inp in case.inputs]
            cheats[f"int8 inputs {label}"] = case.task.reference(quantised, case.ctx)
    for path in _paths(case.honest[0]):
        if _at(case.truth[0], path).numel() == 0 or float(_at(case.truth[0], path).abs().max()) == 0:
            continue  # an output that is zero everywhere cannot be scaled wrong
        only = lambda fn: [_map(out, lambda t, p: fn(t) if p == path else t) for out in case.honest]  # noqa: E731
        cheats[f"{path or 'output'} x 0.9"] = only(lambda t: t * 0.9)
        cheats[f"{path or 'output'} sign flipped"] = only(lambda t: -t)
        # 1e-3 relative, or 4 ulps where the dtype cannot even hold 1e-3 (bf16: 2^-7 = 7.8e-3).
        offset = max(1e-3, 4 * torch.finfo(_at(case.honest[0], path).dtype).eps)
        cheats[f"{path or 'output'} + {offset:.3g} relative"] = only(lambda t: t + offset * t.abs().mean())
        if _at(case.honest[0], path).is_complex():
            cheats[f"{path or 'output'} real part only"] = only(lambda t: torch.complex(t.real, torch.zeros_like(t.real)))
    return cheats


def _zero1_cheats(case: Case) -> dict[str, list]:
    """AdamW with one step left out (the outputs the reported cheats gave)."""
    from tasks.fsdp import zero1_adam_step as zero1

    honest_adamw = zero1._adamw

    def without_update(param, grad, exp_avg, exp_avg_sq):
        _, avg, avg_sq = honest_adamw(param, grad, exp_avg, exp_avg_sq)
        return param.clone(), avg, avg_sq

    def without_second_moment(param, grad, exp_avg, exp_avg_sq):
        new_param, avg, _ = honest_adamw(param, grad, exp_avg, exp_avg_sq)
        return new_param, avg, exp_avg_sq.clone()

    def without_bias_correction(param, grad, exp_avg, exp_avg_sq):
        avg = exp_avg.mul(zero1.BETA1).add_(grad, alpha=1 - zero1.BETA1)
        avg_sq = exp_avg_sq.mul(zero1.BETA2).addcmul_(grad, grad, value=1 - zero1.BETA2)
        new_param = param.mul(1 - zero1.LR * zero1.WEIGHT_DECAY).addcdiv_(avg, avg_sq.sqrt().add_(zero1.EPS), value=-zero1.LR)
        return new_param, avg, avg_sq

    def without_weight_decay(param, grad, exp_avg, exp_avg_sq):
        new_param, avg, avg_sq = honest_adamw(param, grad, exp_avg, exp_avg_sq)
        return new_param + param * zero1.LR * zero1.WEIGHT_DECAY, avg, avg_sq

    cheats = {}
    for name, adamw in (("no parameter update", without_update), ("no second-moment update", without_second_moment),
                        ("no bias correction", without_bias_correction), ("no weight decay", without_weight_decay)):
        zero1._adamw = adamw
        try:
            cheats[name] = case.task.reference(case.inputs, case.ctx)
        finally:
            zero1._adamw = honest_adamw
    return cheats


def _fft_cheats(case: Case) -> dict[str, list]:
    """The spectrum's real part alone (what comparing .double() of a complex tensor checked)."""
    return {"real part only": [(real, torch.zeros_like(imag)) for real, imag in case.honest]}


FAMILY_CHEATS: dict[str, Callable[[Case], dict[str, list]]] = {
    "zero1_adam_step": _zero1_cheats,
    "fft2d_alltoall": _fft_cheats,
}


def test_complex_outputs_compare_both_parts() -> None:
    """A complex output right in its real part only fails both comparison functions."""
    truth = torch.randn(257, dtype=torch.complex128)
    expected = truth.to(torch.complex64)
    real_only = torch.complex(expected.real, torch.zeros_like(expected.real))
    assert judge_outputs(expected, expected, truth, {}).correct
    assert not judge_outputs(real_only, expected, truth, {}).correct
    assert compare_outputs(expected, expected, Tolerance(1e-5, 1e-5)).correct
    assert not compare_outputs(real_only, expected, Tolerance(1e-5, 1e-5)).correct


def test_each_output_has_its_own_tolerance_by_path() -> None:
    """A loose tolerance on one output does not loosen another (paths: positions, keys, nested)."""
    truth = {"loss": torch.tensor(2.0, dtype=torch.float64), "grads": [torch.randn(100, dtype=torch.float64)] * 2}
    expected = {"loss": truth["loss"].float(), "grads": [g.to(torch.bfloat16) for g in truth["grads"]]}
    off = {"loss": expected["loss"] * 1.01, "grads": [expected["grads"][0], expected["grads"][1] * 1.05]}
    loose = {"loss": OutputTolerance(k=3, floor_ulps=1e6), "grads/1": OutputTolerance(k=3, floor_ulps=100)}
    assert judge_outputs(off, expected, truth, loose).correct
    strict_loss = judge_outputs(off, expected, truth, {"grads/1": loose["grads/1"]})
    assert not strict_loss.correct and "['loss']" in strict_loss.message
    strict_grad = judge_outputs(off, expected, truth, {"loss": loose["loss"]})
    assert not strict_grad.correct and "['grads'][1]" in strict_grad.message


def _cheats(case: Case) -> dict[str, list]:
    cheats = _generic_cheats(case)
    extra = FAMILY_CHEATS.get(case.task.id)
    if extra is not None:
        cheats.update(extra(case))
    return {name: outputs for name, outputs in cheats.items() if _differs(outputs, case.honest)}


@pytest.mark.parametrize("task_id,dtype,world_size", _cases())
def test_honest_outputs_pass_and_every_cheat_fails(task_id: str, dtype: str, world_size: int) -> None:
    case = Case(task_id, dtype, world_size)
    honest = [m for m in case.judge(case.honest) if m]
    assert not honest, f"the honest outputs fail: {honest[0]}"
    passed = [name for name, outputs in _cheats(case).items() if not any(case.judge(outputs))]
    assert not passed, f"cheats that pass: {passed}"


if __name__ == "__main__":  # a matrix of what passes, for tuning
    import sys

    only = sys.argv[1:]
    for task_id, dtype, n in _cases():
        if only and task_id not in only:
            continue
        case = Case(task_id, dtype, n)
        honest = [m for m in case.judge(case.honest) if m]
        passed = [name for name, outputs in _cheats(case).items() if not any(case.judge(outputs))]
        if honest or passed:
            print(task_id, dtype, n, "HONEST FAILS:" if honest else "", honest[:1], "PASSING CHEATS:", passed)


# ---------------------------------------------------------------- the judge's own path, on real ranks
# What the judge will do per rank: the baseline in the run dtype (expected) and on float64 copies
# of the same inputs (the truth). On real gloo ranks: the float64 baseline must equal the float64
# maths (no hidden float32 cut), a correct solution (the reference's outputs) must pass against
# the real baseline's error, and the plain cheats must still fail against it.

def _typical_error(value: torch.Tensor, truth: torch.Tensor) -> float:
    """Median relative error, as the judge measures it (tasks.base.OutputTolerance)."""
    value, truth = value.detach().to(torch.complex128 if value.is_complex() else torch.float64), truth.detach()
    if value.is_complex():
        value, truth = torch.view_as_real(value), torch.view_as_real(truth.to(torch.complex128))
    truth = truth.to(torch.float64)
    tau = max(1e-3 * float(truth.square().mean().sqrt()), 1e-300)
    return float(((value - truth).abs() / (truth.abs() + tau)).median())


# Outputs that are the communicated values themselves (or sums of them): int8 transport of them
# must fail against the real baseline too. Local results (clipped gradients, weight gradients of
# a pipeline stage) are not sent, so the check is the x0.9 one there.
SENT_OUTPUTS = {"all_reduce", "reduce", "reduce_scatter", "dp_bucketed_allreduce", "ep_moe_dispatch_combine",
                "zero1_adam_step", "tp_row_linear_allreduce", "tp_gemm_reducescatter", "sp_rmsnorm_reducescatter"}
MIN_ELEMENTS = 64  # the median of fewer elements says little (the judge runs default sizes)


def _judge_with_real_baselines(rank: int, world_size: int) -> dict[str, dict]:


    out: dict[str, dict] = {}
    for task_id, task in tasks.all_tasks().items():
        for dtype in task.spec.dtypes:
            key = f"{task_id}/{dtype}"
            if not _runnable(task, world_size, dtype):
                out[key] = {"skipped": True}
                continue
            try:
                out[key] = {"problems": _judge_one_with_real_baseline(task, rank, world_size, dtype)}
            except Exception as exc:  # every rank raises alike (the same maths): report, go on
                out[key] = {"problems": [f"raised {type(exc).__name__}: {exc}"]}
    return out


def _judge_one_with_real_baseline(task: tasks.Task, rank: int, world_size: int, dtype: str) -> list[str]:
    import torch.distributed as dist

    from pkb_tui.engine.compare import compare_outputs as compare
    from tasks.base import DEFAULT_TOLERANCES

    if True:
        if True:
            ctx = task.context(rank=rank, world_size=world_size, dtype=dtype, size="small", seed=SEED)
            ctx64 = task.context(rank=rank, world_size=world_size, dtype="float64", size="small", seed=SEED)
            inputs = task.make_inputs(ctx)
            expected = task.baseline(*[t.clone() for t in inputs])
            dist.barrier()
            truth = task.baseline(*float64_copies(inputs))
            dist.barrier()
            every = [task.make_inputs(ctx.for_rank(r)) for r in range(world_size)]
            maths64 = task.reference([float64_copies(i) for i in every], ctx64)[rank]
            correct = task.reference(every, ctx)[rank]
            problems = []
            truth_check = compare(_map(truth, lambda t, p: t.to(torch.complex128 if t.is_complex() else torch.float64)),
                                  _map(maths64, lambda t, p: t.to(torch.complex128 if t.is_complex() else torch.float64)),
                                  DEFAULT_TOLERANCES["float64"])
            if not truth_check.correct:
                problems.append(f"the float64 baseline is not the float64 maths: {truth_check.message}")
            verdict = judge_outputs(correct, expected, truth, task.spec.output_tolerance)
            if not verdict.correct:
                problems.append(f"a correct solution fails: {verdict.message}")
            for path in _paths(expected):
                if _at(truth, path).numel() == 0 or float(_at(truth, path).abs().max()) == 0:
                    continue
                # x 0.9 must fail wherever a 10% error is visible at all: not on an output whose
                # baseline is itself that far off (one element summed with cancellation in bf16).
                checks = [("x 0.9", lambda t: t * 0.9)] if _typical_error(_at(expected, path), _at(truth, path)) < 0.03 else []
                if task.id in SENT_OUTPUTS and _at(expected, path).numel() >= MIN_ELEMENTS:
                    checks.append(("int8 per 32", lambda t: int8(t, 32)))
                for name, fn in checks:
                    cheat = _map(correct, lambda t, p: fn(t) if p == path else t)
                    if _differs([cheat], [correct]) and judge_outputs(cheat, expected, truth, task.spec.output_tolerance).correct:
                        problems.append(f"{path or 'output'} {name} passes")
            return problems


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_judges_path_on_real_ranks_truth_from_float64_baselines(world_size: int) -> None:
    from tests._dist import run_distributed

    per_rank = run_distributed(world_size, _judge_with_real_baselines, timeout_s=600)
    failures = [f"rank {r} {key}: {p}" for r, results in enumerate(per_rank)
                for key, result in results.items() for p in result.get("problems", [])]
    assert not failures, "\n".join(failures[:20])
