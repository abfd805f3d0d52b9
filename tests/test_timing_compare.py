"""The timing and comparison functions on their own."""

from __future__ import annotations

import time

import pytest
import torch

from pkb_tui.engine import timing
from pkb_tui.engine.compare import compare_outputs, find_aliasing
from tasks.base import Tolerance

TOL = Tolerance(1e-5, 1e-5)


def test_the_slowest_rank_sets_each_iteration() -> None:
    stats = timing.summarize([[10.0, 10.0, 10.0], [30.0, 5.0, 20.0]])
    assert stats.iterations == 3
    assert stats.median_us == 20.0 and stats.min_us == 10.0 and stats.max_us == 30.0


def test_percentile_interpolates() -> None:
    assert timing.percentile([0.0, 10.0], 50) == 5.0
    assert timing.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 10) == pytest.approx(1.4)


def test_a_candidate_patching_the_clock_after_import_does_not_reach_the_timer(monkeypatch) -> None:
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)
    samples, _ = timing.time_iterations(
        lambda i: sum(range(20000)), iterations=5, warmup=1, device=torch.device("cpu"), barrier=lambda: None,
    )
    assert all(s > 0 for s in samples)


def test_the_counter_hooks_run_after_the_warmup_and_between_timed_iterations() -> None:
    # The byte counters start once the warm-up is done and step between iterations, never inside one.
    log: list[str] = []
    timing.time_iterations(
        lambda i: log.append(f"call {i}"), iterations=3, warmup=2, device=torch.device("cpu"),
        barrier=lambda: log.append("barrier"), on_start=lambda: log.append("start"), between=lambda: log.append("tick"),
    )
    assert log == ["call 0", "call 1", "start",
                   "barrier", "call 0", "tick", "barrier", "call 1", "tick", "barrier", "call 2", "tick"]


def test_nan_never_passes_even_where_tolerance_is_huge() -> None:
    ref = torch.ones(5)
    got = ref.clone()
    got[2] = float("nan")
    result = compare_outputs(got, ref, Tolerance(1e9, 1e9))
    assert not result.correct and "NaN" in result.message


def test_shape_dtype_and_structure_must_match() -> None:
    ref = torch.zeros(2, 3)
    assert "shape" in compare_outputs(torch.zeros(3, 2), ref, TOL).message
    assert "dtype" in compare_outputs(torch.zeros(2, 3, dtype=torch.float64), ref, TOL).message
    assert "keys" in compare_outputs({"a": ref}, {"b": ref}, TOL).message
    assert compare_outputs((ref, {"x": ref}), (ref.clone(), {"x": ref.clone()}), TOL).correct


def test_error_figures_are_reported() -> None:
    ref = torch.arange(6, dtype=torch.float32)
    got = ref.clone()
    got[4] += 0.5
    result = compare_outputs(got, ref, TOL)
    assert not result.correct
    assert result.max_abs_error == pytest.approx(0.5)
    assert "1 of 6 elements" in result.message


def test_outputs_aliasing_inputs_or_earlier_outputs_are_flagged() -> None:
    x = torch.randn(8)
    assert "an input" in find_aliasing(x[2:], [x])
    earlier = torch.randn(4)
    assert "earlier call" in find_aliasing((earlier,), [x], [earlier])
    assert find_aliasing(x.clone(), [x], [earlier]) is None


def test_rounds_split_the_iterations_evenly_larger_blocks_first() -> None:
    assert timing.split_rounds(10, 5) == [2, 2, 2, 2, 2]
    assert timing.split_rounds(12, 5) == [3, 3, 2, 2, 2]
    assert timing.split_rounds(3, 5) == [1, 1, 1]  # never an empty block
    assert timing.split_rounds(7, 1) == [7]
    assert sum(timing.split_rounds(31, 5)) == 31
