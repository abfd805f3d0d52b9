"""The one comparison function: is a candidate's output the reference's, within the task's tolerance?

Outputs are a tensor, a tuple/list or a dict of tensors (nested allowed). Shapes and dtypes must
match exactly; NaN or Inf where the reference is finite never passes; integer and bool tensors must
be equal. Also here: the checks around the call (poisoning freed memory, aliasing of outputs).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from tasks.base import DEFAULT_OUTPUT_TOLERANCE, DEFAULT_TOLERANCES, OutputTolerance, Tolerance


@dataclass
class Comparison:
    correct: bool
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    message: str | None = None  # first reason it failed, in words

    def merge(self, other: "Comparison") -> "Comparison":
        return Comparison(
            correct=self.correct and other.correct,
            max_abs_error=_max(self.max_abs_error, other.max_abs_error),
            max_rel_error=_max(self.max_rel_error, other.max_rel_error),
            message=self.message or other.message,
        )


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def compare_outputs(candidate: Any, reference: Any, tol: Tolerance, where: str = "output") -> Comparison:
    if tol.pkb_style or tol.second is not None:  # ParallelKernelBench problems (pkb_tui/pkb)
        return _pkb_verdicts(candidate, reference, tol, where)
    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor):
            return Comparison(False, message=f"{where}: expected a tensor, got {type(candidate).__name__}")
        return _compare_tensors(candidate, reference, tol, where)
    if isinstance(reference, (tuple, list)):
        if not isinstance(candidate, (tuple, list)) or len(candidate) != len(reference):
            got = f"{type(candidate).__name__} of {len(candidate)}" if isinstance(candidate, (tuple, list)) else type(candidate).__name__
            return Comparison(False, message=f"{where}: expected a sequence of {len(reference)}, got {got}")
        result = Comparison(True, 0.0, 0.0)
        for index, (c, r) in enumerate(zip(candidate, reference)):
            result = result.merge(compare_outputs(c, r, tol, f"{where}[{index}]"))
        return result
    if isinstance(reference, dict):
        if not isinstance(candidate, dict) or set(candidate) != set(reference):
            keys = sorted(candidate) if isinstance(candidate, dict) else type(candidate).__name__
            return Comparison(False, message=f"{where}: expected keys {sorted(reference)}, got {keys}")
        result = Comparison(True, 0.0, 0.0)
        for key in reference:
            result = result.merge(compare_outputs(candidate[key], reference[key], tol, f"{where}[{key!r}]"))
        return result
    if reference is None:
        ok = candidate is None
        return Comparison(ok, message=None if ok else f"{where}: expected None")
    ok = candidate == reference
    return Comparison(bool(ok), message=None if ok else f"{where}: expected {reference!r}, got {candidate!r}")


def _compare_tensors(candidate: torch.Tensor, reference: torch.Tensor, tol: Tolerance, where: str) -> Comparison:
    if candidate.shape != reference.shape:
        return Comparison(False, message=f"{where}: shape {tuple(candidate.shape)}, expected {tuple(reference.shape)}")
    if candidate.dtype != reference.dtype:
        return Comparison(False, message=f"{where}: dtype {candidate.dtype}, expected {reference.dtype}")
    if candidate.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    cand = candidate.detach()
    ref = reference.detach().to(cand.device)
    if not (ref.is_floating_point() or ref.is_complex()):
        wrong = int((cand != ref).sum().item())
        abs_err = float((cand.double() - ref.double()).abs().max().item()) if ref.dtype != torch.bool else float(wrong > 0)
        if wrong:
            return Comparison(False, abs_err, None, f"{where}: {wrong} of {ref.numel()} elements differ")
        return Comparison(True, 0.0, 0.0)
    c64, r64 = _as_real(cand), _as_real(ref)  # complex: real and imaginary parts both count
    ref_finite = torch.isfinite(r64)
    bad_nonfinite = (~torch.isfinite(c64)) & ref_finite
    diff = (c64 - r64).abs()
    diff = torch.where(ref_finite, diff, torch.zeros_like(diff))
    # Positions where the reference itself is NaN/Inf must match exactly (rare: masked outputs).
    mismatched_special = (~ref_finite) & ~((c64 == r64) | (torch.isnan(c64) & torch.isnan(r64)))
    allowed = tol.atol + tol.rtol * r64.abs()
    over = (diff > allowed) & ref_finite
    max_abs = float(diff.max().item())
    max_rel = float((diff / r64.abs().clamp_min(tol.atol if tol.atol > 0 else 1e-30)).max().item())
    if bool(bad_nonfinite.any()):
        count = int(bad_nonfinite.sum().item())
        return Comparison(False, float("inf"), float("inf"), f"{where}: {count} NaN/Inf element(s) where the reference is finite")
    if bool(mismatched_special.any()):
        return Comparison(False, max_abs, max_rel, f"{where}: NaN/Inf positions differ from the reference")
    if bool(over.any()):
        count = int(over.sum().item())
        first = int(over.flatten().nonzero()[0].item())
        return Comparison(
            False, max_abs, max_rel,
            f"{where}: {count} of {ref.numel()} elements outside tolerance (atol {tol.atol:g}, rtol {tol.rtol:g}); "
            f"max abs error {max_abs:.3g}, first at flat index {first}",
        )
    return Comparison(True, max_abs, max_rel)


# ---------------------------------------------------------------- the judge: error vs the baseline's own

ToleranceSpec = Callable[[str], OutputTolerance] | Mapping[str, OutputTolerance]


def map_tensors(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """``value`` with ``fn`` applied to every tensor (tuple, list and dict structure kept, the
    rest as is)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_tensors(v, fn) for v in value)
    if isinstance(value, list):
        return [map_tensors(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    return value


def _to_float64(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return t.detach().to(torch.complex128).clone()
    if t.is_floating_point():
        return t.detach().to(torch.float64).clone()
    return t.detach().clone()


def float64_copies(inputs: Any) -> Any:
    """The inputs the judge gives the baseline to get the truth: floating tensors as float64,
    complex as complex128, everything else (indices, masks, numbers) unchanged, structure kept.

    The truth comes from running the baseline on these copies (not from a task's reference(),
    which needs every rank's inputs): each rank has its own inputs only, and the baseline's
    collectives run in float64 on NCCL and gloo alike."""
    return map_tensors(inputs, _to_float64)


def judge_outputs(candidate: Any, expected: Any, expected64: Any, tolerances: ToleranceSpec, where: str = "output") -> Comparison:
    """Is the candidate as close to the truth as the baseline is, output by output?

    expected: the baseline's outputs in the run dtype (structure, shapes and dtypes must match
    exactly); expected64: the baseline's outputs on float64_copies of the same inputs (the
    truth); tolerances: a task's ``TaskSpec.output_tolerance`` or a mapping of output path ->
    OutputTolerance ("*" for the rest). The rule and why it is this one: tasks.base.OutputTolerance.
    """
    lookup = tolerances if callable(tolerances) else _mapping_lookup(tolerances)
    pkb = lookup("").pkb  # ParallelKernelBench problems: PKB's allclose judges or is said beside
    if pkb is not None:
        return _pkb_judge(candidate, expected, _judge(candidate, expected, expected64, lookup, where, ""), pkb, where)
    return _judge(candidate, expected, expected64, lookup, where, "")


def _mapping_lookup(mapping: Mapping[str, OutputTolerance]) -> Callable[[str], OutputTolerance]:
    return lambda path: mapping.get(path, mapping.get("*", DEFAULT_OUTPUT_TOLERANCE))


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _judge(candidate: Any, expected: Any, truth: Any, lookup: Callable[[str], OutputTolerance], where: str, path: str) -> Comparison:
    if isinstance(expected, torch.Tensor):
        if not isinstance(candidate, torch.Tensor):
            return Comparison(False, message=f"{where}: expected a tensor, got {type(candidate).__name__}")
        if not isinstance(truth, torch.Tensor) or truth.shape != expected.shape:
            return Comparison(False, message=f"{where}: the float64 baseline gave another structure (a harness bug)")
        return _judge_tensor(candidate, expected, truth, lookup(path), where)
    if isinstance(expected, (tuple, list)):
        if not isinstance(candidate, (tuple, list)) or len(candidate) != len(expected):
            got = f"{type(candidate).__name__} of {len(candidate)}" if isinstance(candidate, (tuple, list)) else type(candidate).__name__
            return Comparison(False, message=f"{where}: expected a sequence of {len(expected)}, got {got}")
        result = Comparison(True, 0.0, 0.0)
        for index, (c, e, t) in enumerate(zip(candidate, expected, truth)):
            result = result.merge(_judge(c, e, t, lookup, f"{where}[{index}]", _join(path, index)))
        return result
    if isinstance(expected, dict):
        if not isinstance(candidate, dict) or set(candidate) != set(expected):
            keys = sorted(candidate) if isinstance(candidate, dict) else type(candidate).__name__
            return Comparison(False, message=f"{where}: expected keys {sorted(expected)}, got {keys}")
        result = Comparison(True, 0.0, 0.0)
        for key in expected:
            result = result.merge(_judge(candidate[key], expected[key], truth[key], lookup, f"{where}[{key!r}]", _join(path, key)))
        return result
    return compare_outputs(candidate, expected, Tolerance(0.0, 0.0), where)


# The typical (median) relative error is taken over at most this many elements, drawn at random
# with a secret generator: a sort of every element of a block of 512 stacked outputs cost seconds
# per block on the judge (measured), and the median of 2M random elements is within ~0.1
# percentile of the whole's. The largest error is still taken over every element.
MEDIAN_SAMPLE = 1 << 21
_SAMPLERS: dict[str, torch.Generator] = {}


def _median(values: torch.Tensor, index: torch.Tensor | None) -> float:
    return float((values if index is None else values.reshape(-1)[index]).median().item())


def _sample_index(numel: int, device: torch.device) -> torch.Tensor | None:
    """Secret random positions for the median (None: use every element). The judge's own
    generator, seeded from the OS: a candidate process can neither read nor predict it."""
    if numel <= MEDIAN_SAMPLE:
        return None
    key = str(device)
    gen = _SAMPLERS.get(key)
    if gen is None:
        gen = _SAMPLERS[key] = torch.Generator(device=device)
        gen.manual_seed(int.from_bytes(os.urandom(8), "little") & 0x7FFF_FFFF_FFFF_FFFF)
    return torch.randint(0, numel, (MEDIAN_SAMPLE,), generator=gen, device=device)


def _as_real(t: torch.Tensor) -> torch.Tensor:
    """float64 values; a complex tensor as (..., 2) real and imaginary parts, so both count."""
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj().to(torch.complex128))
    return t.to(torch.float64)


def _judge_tensor(candidate: torch.Tensor, expected: torch.Tensor, truth: torch.Tensor, tol: OutputTolerance, where: str) -> Comparison:
    if candidate.shape != expected.shape:
        return Comparison(False, message=f"{where}: shape {tuple(candidate.shape)}, expected {tuple(expected.shape)}")
    if candidate.dtype != expected.dtype:
        return Comparison(False, message=f"{where}: dtype {candidate.dtype}, expected {expected.dtype}")
    if candidate.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    if not (expected.is_floating_point() or expected.is_complex()):
        return _compare_tensors(candidate, expected, Tolerance(0.0, 0.0), where)
    if expected.dtype in (torch.float64, torch.complex128) and tol.floor_ulps > 0:
        # A float64 run has no more precise truth than itself: its baseline's error reads zero.
        # So the fixed float64 tolerance (1e-9), far below any wrong step and above any order.
        return _compare_tensors(candidate, expected, DEFAULT_TOLERANCES["float64"], where)
    device = candidate.device
    cand, base, true = _as_real(candidate), _as_real(expected.to(device)), _as_real(truth.to(device))
    finite = torch.isfinite(true)
    if bool((~torch.isfinite(cand) & finite).any()):
        count = int((~torch.isfinite(cand) & finite).sum().item())
        return Comparison(False, float("inf"), float("inf"), f"{where}: {count} NaN/Inf element(s) where the result is finite")
    if not bool(finite.all()):
        # Positions where the truth is NaN/Inf (masked outputs) must match the baseline's there.
        special = ~finite
        same = (cand == base) | (torch.isnan(cand) & torch.isnan(base))
        if not bool(same[special].all()):
            return Comparison(False, None, None, f"{where}: NaN/Inf positions differ from the baseline's")
        cand, base, true = cand[finite], base[finite], true[finite]
        if true.numel() == 0:
            return Comparison(True, 0.0, 0.0)
    err_cand = (cand - true).abs()
    err_base = (base - true).abs()
    magnitude = true.abs()
    eps = torch.finfo(expected.dtype).eps
    tau = max(1e-3 * float(true.square().mean().sqrt().item()), torch.finfo(torch.float64).tiny)
    rel_cand = err_cand / (magnitude + tau)
    index = _sample_index(true.numel(), true.device)
    typical_cand = _median(rel_cand, index)
    typical_base = _median(err_base / (magnitude + tau), index)
    worst_cand = float(err_cand.max().item())
    worst_base = float(err_base.max().item())
    # The median of a few elements is as noisy as one element (a loss, a norm): the full floor
    # there; over many it is a stable figure, ~eps/8 for a correctly rounded result: an eighth.
    allowed_typical = (tol.k * typical_base + tol.floor_ulps * eps * max(0.125, 1 / math.sqrt(true.numel()))
                       + tol.floor_relative)
    allowed_worst = tol.k * worst_base + (tol.floor_ulps * eps + tol.floor_relative) * float(magnitude.max().item())
    max_rel = float(rel_cand.max().item())
    if typical_cand > allowed_typical:
        return Comparison(
            False, worst_cand, max_rel,
            f"{where}: typical relative error {typical_cand:.3g} > allowed {allowed_typical:.3g} "
            f"({tol.k:g} x the baseline's {typical_base:.3g} + floor)",
        )
    if worst_cand > allowed_worst:
        first = int((err_cand > allowed_worst).flatten().nonzero()[0].item())
        return Comparison(
            False, worst_cand, max_rel,
            f"{where}: max abs error {worst_cand:.3g} > allowed {allowed_worst:.3g} "
            f"({tol.k:g} x the baseline's {worst_base:.3g} + floor), "
            f"first at flat index {first}",
        )
    return Comparison(True, worst_cand, max_rel)


def clone_value(value: Any) -> Any:
    """A value with every tensor cloned (structure kept, the rest as is)."""
    return map_tensors(value, torch.Tensor.clone)


def tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def _span(t: torch.Tensor) -> tuple[str, int, int] | None:
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return None
    start = storage.data_ptr()
    return (str(t.device), start, start + storage.nbytes())


def find_aliasing(outputs: Any, inputs: Iterable[Any], earlier_outputs: Iterable[Any] = ()) -> str | None:
    """A sentence when an output shares memory with an input or with an earlier call's output."""
    def spans(values: Iterable[Any]) -> list[tuple[str, int, int]]:
        return [s for v in values for t in tensors_in(v) if (s := _span(t)) is not None]

    out_spans = spans([outputs])
    for label, others in (("an input", spans(inputs)), ("an earlier call's output", spans(earlier_outputs))):
        for dev, start, end in out_spans:
            for odev, ostart, oend in others:
                if dev == odev and start < oend and ostart < end:
                    return f"an output shares memory with {label}"
    seen: list[tuple[str, int, int]] = []
    for span in out_spans:
        if any(span[0] == s[0] and span[1] < s[2] and s[1] < span[2] for s in seen):
            return "two outputs share memory"
        seen.append(span)
    return None


def poison_free_memory(nbytes: int, device: torch.device) -> None:
    """Fill memory the allocator will hand out next with NaN bit patterns (0xFF bytes).

    A candidate that returns torch.empty(...) without writing every element then shows NaN
    instead of stale correct values left by an earlier call.
    """
    if nbytes <= 0:
        return
    block = torch.empty(nbytes, dtype=torch.uint8, device=device)
    block.fill_(0xFF)
    del block


# ---------------------------------------------------------------------- ParallelKernelBench compatibility
VERDICTS_DIFFER = "verdicts differ"  # marks a trial message that carries the second verdict


def pkb_allclose(candidate: Any, reference: Any, atol: float, rtol: float) -> bool:
    """ParallelKernelBench's own check (as its utils/compare_outputs.py describes it): recursive
    over tensors, tuples/lists and dicts; tensors of equal shape by torch.allclose on float copies
    (so no dtype check); anything else by ==."""
    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor) or candidate.shape != reference.shape:
            return False
        # Where the tensors are (not copied to the host: element-wise, so the same answer, and a
        # block of 512 timed outputs on the GPU took seconds through the host, measured on the H200).
        ref = reference.detach().float()
        return bool(torch.allclose(candidate.detach().to(ref.device).float(), ref, atol=atol, rtol=rtol))
    if isinstance(reference, (tuple, list)):
        return isinstance(candidate, (tuple, list)) and len(candidate) == len(reference) and all(
            pkb_allclose(c, r, atol, rtol) for c, r in zip(candidate, reference))
    if isinstance(reference, dict):
        return isinstance(candidate, dict) and set(candidate) == set(reference) and all(
            pkb_allclose(candidate[k], reference[k], atol, rtol) for k in reference)
    return bool(candidate == reference)


def _pkb_verdicts(candidate: Any, reference: Any, tol: Tolerance, where: str) -> Comparison:
    """Judge with ``tol`` (PKB's allclose when pkb_style) and, when ``tol.second`` is set, say in the
    message what the other tolerance's verdict is if it differs (the Result screen shows both)."""
    import dataclasses

    plain = dataclasses.replace(tol, pkb_style=False, second=None)
    ours = compare_outputs(candidate, reference, plain, where)
    if tol.pkb_style:
        correct = pkb_allclose(candidate, reference, tol.atol, tol.rtol)
        judged = Comparison(correct, ours.max_abs_error, ours.max_rel_error,
                            None if correct else ours.message or f"{where}: outside PKB's allclose(atol={tol.atol:g}, rtol={tol.rtol:g})")
    else:
        judged = ours
    second = tol.second
    if second is None:
        return judged
    if second.pkb_style:
        other, label = pkb_allclose(candidate, reference, second.atol, second.rtol), f"PKB's allclose(atol={second.atol:g}, rtol={second.rtol:g})"
    else:
        other_cmp = compare_outputs(candidate, reference, dataclasses.replace(second, second=None), where)
        other, label = other_cmp.correct, f"pkb-tui's check (atol {second.atol:g}, rtol {second.rtol:g})"
        if other_cmp.message and not other:
            label += f": {other_cmp.message}"
    if other == judged.correct:
        return judged
    note = f"{VERDICTS_DIFFER}: {label} {'passes' if other else 'fails'}"
    return Comparison(judged.correct, judged.max_abs_error, judged.max_rel_error,
                      f"{judged.message}; {note}" if judged.message else note)


PKB_ATOL = PKB_RTOL = 1e-2  # ParallelKernelBench's run_local.py defaults


def _pkb_judge(candidate: Any, expected: Any, ours: Comparison, pkb: str, where: str) -> Comparison:
    """A PKB problem's verdict: this project's per-output rule (``ours``) or PKB's allclose on the
    baseline's outputs (``pkb == "judge"``), with the other verdict in the message when it differs."""
    theirs = pkb_allclose(candidate, expected, PKB_ATOL, PKB_RTOL)
    allclose = f"PKB's allclose(atol={PKB_ATOL:g}, rtol={PKB_RTOL:g})"
    if pkb == "judge":
        judged = Comparison(theirs, ours.max_abs_error, ours.max_rel_error,
                            None if theirs else ours.message or f"{where}: outside {allclose}")
        other, label = ours.correct, "pkb-tui's check" + (f": {ours.message}" if ours.message and not ours.correct else "")
    else:
        judged, other, label = ours, theirs, allclose
    if other == judged.correct:
        return judged
    note = f"{VERDICTS_DIFFER}: {label} {'passes' if other else 'fails'}"
    return Comparison(judged.correct, judged.max_abs_error, judged.max_rel_error,
                      f"{judged.message}; {note}" if judged.message else note)
