"""The timing and comparison functions on their own."""

from __future__ import annotations

import pytest
import torch

from pkb_tui.engine import timing
from pkb_tui.engine.compare import compare_outputs, find_aliasing
from pkb_tui.engine.stats import summarize_rounds
from tasks.base import Tolerance

TOL = Tolerance(1e-5, 1e-5)


def test_per_call_figures_come_from_blocks_with_the_harness_share_subtracted() -> None:
    assert timing.per_call_us(1_200.0, 200.0, 100) == 10.0
    assert timing.per_call_us(150.0, 200.0, 10) == 0.0  # never negative
    figures = summarize_rounds([[12.0, 10.0], [11.0, 30.0]])
    assert figures.median_us == 11.5 and figures.min_us == 10.0 and figures.max_us == 30.0 and figures.samples == 4


def test_percentile_interpolates() -> None:
    assert timing.percentile([0.0, 10.0], 50) == 5.0
    assert timing.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 10) == pytest.approx(1.4)


def test_a_runner_report_the_judges_clock_rules_out_is_tampering() -> None:
    honest = [(10_000.0, 9_900.0)] * 9
    assert timing.reconcile(honest, overhead_us=100.0) is None
    # Now and then a descheduled runner reports far less than its judge waited: still honest.
    assert timing.reconcile(honest + [(110_000.0, 5_900.0)], overhead_us=100.0) is None
    # More device time than the wall time around it: impossible.
    assert "reported" in timing.reconcile(honest + [(10_000.0, 20_000.0)], overhead_us=100.0)
    assert timing.reconcile([(1_000.0, float("nan"))], overhead_us=10.0) is not None
    # Clocks patched to zero, or a tenth of every block: a lie.
    assert timing.reconcile([(10_000.0, 0.0)] * 10, overhead_us=100.0) is not None
    assert timing.reconcile([(100_000.0, 5_000.0)] * 10, overhead_us=100.0) is not None


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


def test_a_plain_value_the_runner_did_not_send_reads_none_never_the_expected_one() -> None:
    """Runner replies leave out empty lists; the judge must not fill the gap from its own spec."""
    import torch

    from pkb_tui.engine.worker import _build_output

    arena = torch.zeros(16, dtype=torch.uint8)
    spec = {"tuple": [{"v": 42}]}
    assert _build_output(spec, arena, []) == (None,)
    assert _build_output(spec, arena, [7]) == (7,)


def test_batched_flags_a_block_speedup_that_a_call_alone_does_not_show() -> None:
    # adversarial/batch-calls on the CPU box: 6.4x per call in blocks of 6, 1.6x alone
    assert "timing inconsistent" in timing.batched((1629.2, 217.8), (1115.5, 716.2), 6, 3.0)
    # an honest candidate as fast alone as in blocks, and a slower one, pass
    assert timing.batched((100.0, 20.0), (120.0, 26.0), 512, 2.0) is None
    assert timing.batched((100.0, 300.0), (100.0, 50.0), 512, 2.0) is None
    # below the limit in blocks: not flagged, however the call alone reads
    assert timing.batched((100.0, 60.0), (100.0, 200.0), 512, 2.0) is None


def test_batched_is_inconclusive_where_a_call_alone_is_not_resolved_or_the_block_is_one_call() -> None:
    assert timing.batched((100.0, 10.0), (0.0, 40.0), 512, 2.0) is None  # the baseline alone within jitter
    assert timing.batched((100.0, 10.0), (40.0, 0.0), 512, 2.0) is None  # the candidate alone within jitter
    assert timing.batched((100.0, 10.0), (100.0, 100.0), 1, 2.0) is None  # blocks of one call are the single
    assert "blocks of 512 calls" in timing.batched((100.0, 10.0), (100.0, 100.0), 512, 2.0)
