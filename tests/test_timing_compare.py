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


def _rounds(per_call_us: float, spread: float = 0.03, rounds: int = 8, calls: int = 4) -> list[list[float]]:
    """Per-round per-call figures around ``per_call_us``, each round and call a little apart."""
    return [[per_call_us * (1 + spread * (((r * 7 + k * 3) % 5) - 2) / 2) for k in range(calls)] for r in range(rounds)]


def _check(blocks: tuple[float, float], alone: tuple[float, float], calls: int = 512, limit: float = 2.0,
           spread: float = 0.03) -> str | None:
    return timing.batched((_rounds(blocks[0], spread), _rounds(blocks[1], spread)),
                          (_rounds(alone[0], spread), _rounds(alone[1], spread)), calls, limit)


def test_batched_flags_a_speedup_that_is_only_in_blocks() -> None:
    # adversarial/batch-calls on the CPU box: 7.5x per call in blocks of 6, 1.1x alone
    sentence = _check((1629.2, 217.8), (1115.5, 1014.0), calls=6, limit=3.0)
    assert sentence and "timing inconsistent" in sentence and "blocks of 6 calls" in sentence
    assert "one call at a time" in sentence
    # slower alone and faster in blocks by more than the limit (the bound alone is never below 1x)
    assert _check((100.0, 40.0), (100.0, 300.0)) is not None


def test_batched_flags_a_gross_gap_however_fast_the_call_alone_is() -> None:
    assert _check((400.0, 10.0), (100.0, 33.0)) is not None  # 40x in blocks, 3x alone


def test_batched_passes_honest_pipelining_and_noise() -> None:
    # an honest handwritten all_gather on an H100: 11.6x in blocks, 2.6x alone (tiny kernels gain
    # the launch latency between them in a block): faster alone than the first rule looks at, and
    # under the gross limit
    assert _check((20.0, 20.0 / 11.6), (25.0, 25.0 / 2.6)) is None
    # as fast alone as in blocks; slower in both; faster in blocks but within the limit
    assert _check((100.0, 20.0), (120.0, 26.0)) is None
    assert _check((100.0, 300.0), (100.0, 50.0)) is None
    assert _check((100.0, 60.0), (100.0, 200.0)) is None
    # gloo's noise on CPU (CI, torch-p2p reduce: 5.5x [1.7, 11.5] in blocks, 1.2x alone): the
    # interval in blocks reaches below the limit
    noisy = [[881.0] * 2] * 6
    candidate = [[x] * 2 for x in (124.5, 509.0, 77.0, 130.0, 400.0, 90.0)]
    singles_b, singles_c = [[1000.0] * 2] * 6, [[830.0] * 2] * 6
    assert timing.batched((noisy, candidate), (singles_b, singles_c), 10, 3.0) is None
    # the same with the gloo outlier rounds gone is flagged: the check can fail
    steady = [[x] * 2 for x in (124.5, 110.0, 77.0, 130.0, 100.0, 90.0)]
    assert timing.batched((noisy, steady), (singles_b, singles_c), 10, 3.0) is not None


def test_batched_is_inconclusive_where_a_call_alone_is_not_resolved_or_the_block_is_one_call() -> None:
    # the baseline alone within the harness's jitter: nothing to compare against
    assert _check((100.0, 10.0), (0.0, 40.0)) is None
    # the candidate alone within the jitter: its speedup alone is unbounded, nothing flagged
    assert _check((100.0, 10.0), (40.0, 0.0)) is None
    assert _check((100.0, 10.0), (100.0, 100.0), calls=1) is None  # blocks of one call are the single
    assert "blocks of 512 calls" in (_check((100.0, 10.0), (100.0, 100.0)) or "")
    # no rounds of calls alone at all, or fewer than bound a median (a fail rests on rounds)
    assert timing.batched((_rounds(100.0), _rounds(10.0)), ([], []), 512, 2.0) is None
    few = (_rounds(100.0, rounds=5), _rounds(10.0, rounds=5)), (_rounds(100.0, rounds=5), _rounds(100.0, rounds=5))
    assert timing.batched(*few, 512, 2.0) is None


def test_batching_unresolved_asks_for_rounds_only_while_the_points_suspect_and_the_intervals_do_not_decide() -> None:
    # gloo-like noise: 3.4x in blocks and 1.1x alone by the points, intervals too wide to decide
    blocks_b = [[x] * 2 for x in (1450.0, 2107.0, 512.0, 1188.0, 2704.0, 743.0)]
    blocks_c = [[x] * 2 for x in (184.0, 311.0, 377.0, 975.0, 165.0, 547.0)]
    alone_b = [[x] * 2 for x in (388.0, 199.0, 715.0, 2276.0, 1010.0, 1457.0)]
    alone_c = [[x] * 2 for x in (1312.0, 1193.0, 670.0, 307.0, 3459.0, 272.0)]
    assert timing.batched((blocks_b, blocks_c), (alone_b, alone_c), 8, 3.0) is None
    assert timing.batching_unresolved((blocks_b, blocks_c), (alone_b, alone_c), 8, 3.0)
    # decided already (steady figures): no more rounds for this
    steady = (_rounds(100.0), _rounds(10.0)), (_rounds(100.0), _rounds(100.0))
    assert timing.batched(*steady, 512, 2.0) is not None
    assert not timing.batching_unresolved(*steady, 512, 2.0)
    # nothing suspect: as fast alone as in blocks, or one call per block
    honest = (_rounds(100.0), _rounds(20.0)), (_rounds(120.0), _rounds(26.0))
    assert not timing.batching_unresolved(*honest, 512, 2.0)
    assert not timing.batching_unresolved((blocks_b, blocks_c), (alone_b, alone_c), 1, 3.0)


def test_an_unconfirmed_speedup_in_blocks_is_capped_at_the_speed_alone() -> None:
    # The points say batching (3.4x in blocks, 1.1x alone), the intervals never decided: the run
    # claims the speed alone, for every method above it, with a note that says why.
    blocks_b = [[x] * 2 for x in (1450.0, 2107.0, 512.0, 1188.0, 2704.0, 743.0)]
    blocks_c = [[x] * 2 for x in (184.0, 311.0, 377.0, 975.0, 165.0, 547.0)]
    alone_b = [[x] * 2 for x in (388.0, 199.0, 715.0, 2276.0, 1010.0, 1457.0)]
    alone_c = [[x] * 2 for x in (1312.0, 1193.0, 670.0, 307.0, 3459.0, 272.0)]
    alone = timing.unconfirmed_in_blocks((blocks_b, blocks_c), (alone_b, alone_c), 8, 3.0)
    assert alone is not None
    assert alone == timing.paired_speedup(alone_b, alone_c)
    fields = {"speedup": 3.4, "speedup_low": 1.2, "speedup_high": 9.0, "speedup_eager": 3.4, "speedup_eager_low": 1.2,
              "speedup_eager_high": 9.0, "speedup_graph": 0.5, "speedup_graph_low": 0.4, "speedup_graph_high": 0.6,
              "within_noise": 0, "speedup_note": "median of 6 per-round ratios"}
    capped = timing.cap_at_alone(fields, alone, "eager", 8)
    assert (capped["speedup"], capped["speedup_low"], capped["speedup_high"]) == (alone.point, alone.low, alone.high)
    assert capped["speedup_eager"] == alone.point
    assert capped["speedup_graph"] == 0.5  # below the speed alone: left as measured
    assert capped["within_noise"] == (1 if alone.low <= 1.0 <= alone.high else 0)
    assert "calls one at a time" in capped["speedup_note"] and "eager 3.40x [1.20, 9.00]" in capped["speedup_note"]
    assert fields["speedup"] == 3.4  # the caller's columns are not changed in place
    # the graph basis: its figure capped where it is above the speed alone
    graph_fast = {**fields, "speedup": 3.0, "speedup_graph": 3.0, "speedup_graph_low": 2.5, "speedup_graph_high": 3.5}
    assert timing.cap_at_alone(graph_fast, alone, "graph", 8)["speedup"] == alone.point
    # decided (steady: batched() flags it) or honest: nothing to cap
    steady = (_rounds(100.0), _rounds(10.0)), (_rounds(100.0), _rounds(100.0))
    assert timing.unconfirmed_in_blocks(*steady, 512, 2.0) is None
    honest = (_rounds(100.0), _rounds(20.0)), (_rounds(120.0), _rounds(26.0))
    assert timing.unconfirmed_in_blocks(*honest, 512, 2.0) is None
    assert timing.cap_at_alone(fields, timing.paired_speedup(_rounds(100.0), _rounds(20.0)), "eager", 8) == fields


def test_the_launcher_stores_the_speed_alone_where_blocks_were_not_confirmed() -> None:
    # The launcher's own path from the judges' Timing events to the results columns.
    from types import SimpleNamespace

    from pkb_tui.engine import events as ev
    from pkb_tui.engine.launcher import Launcher

    blocks_b = [[x] * 2 for x in (1450.0, 2107.0, 512.0, 1188.0, 2704.0, 743.0)]
    blocks_c = [[x] * 2 for x in (184.0, 311.0, 377.0, 975.0, 165.0, 547.0)]
    alone_b = [[x] * 2 for x in (388.0, 199.0, 715.0, 2276.0, 1010.0, 1457.0)]
    alone_c = [[x] * 2 for x in (1312.0, 1193.0, 670.0, 307.0, 3459.0, 272.0)]

    def event(variant: str, rounds: list[list[float]], singles: list[list[float]], calls: int) -> ev.Timing:
        eager = {"rounds_us": rounds, "single_rounds_us": singles, "calls_per_block": calls}
        return ev.Timing(item=0, variant=variant, median_us=1.0, p10_us=1.0, p90_us=1.0, mean_us=1.0, min_us=1.0,
                         max_us=1.0, iterations=12, eager=eager)

    def fields(calls: int) -> dict:
        state = SimpleNamespace(timings={"baseline": event("baseline", blocks_b, alone_b, calls),
                                         "candidate": event("candidate", blocks_c, alone_c, calls)})
        owner = SimpleNamespace(_mode="cpu", _noise_floor=None)
        return Launcher._timing_fields(owner, state, SimpleNamespace(speedup_basis="eager"))["candidate"]  # type: ignore[arg-type]

    capped = fields(8)
    assert capped["speedup"] == timing.paired_speedup(alone_b, alone_c).point
    assert "calls one at a time" in capped["speedup_note"]
    plain = fields(1)  # a block of one call is its own call alone: nothing to compare
    assert plain["speedup"] == timing.paired_speedup(blocks_b, blocks_c, "p25").point
    assert "calls one at a time" not in plain["speedup_note"]


def test_the_phase_clock_says_where_an_items_time_went(monkeypatch: pytest.MonkeyPatch) -> None:
    from pkb_tui.engine import worker

    now = iter([0.0, 4.0, 5.5, 6.0, 9.0, 20.0, 20.01])
    monkeypatch.setattr(worker, "_monotonic", lambda: next(now))
    clock = worker.PhaseClock()  # 0.0
    clock.mark("start-up")  # 4.0
    clock.mark("trials")  # 5.5
    with clock.part("the judge's checks"):  # 6.0 .. 9.0
        pass
    clock.rounds = 6
    clock.mark("timing rounds")  # 20.0
    assert clock.summary() == ("start-up 4.0 s, trials 1.5 s, 6 timing rounds 14.5 s "
                               "(of which the judge's checks 3.0 s)")  # the rest (10 ms) left out


def test_blocks_are_sized_per_method_and_an_untimed_method_gets_no_inputs() -> None:
    from pkb_tui.engine import worker

    # Eager 50 us a call, graph 2 us: ~TARGET_BLOCK_US each, graph capped at its own limit.
    warm = [{"eager": 50.0, "graph": 2.0}, {"eager": 40.0, "graph": 1.5}]  # the slowest rank sizes
    sized = worker.calls_per_block(["eager", "graph"], ["eager", "graph"], warm, 10**6, "cuda")
    assert sized == {"eager": 100, "graph": min(worker.MAX_GRAPH_CALLS_PER_BLOCK, 2500)}
    # Not capturable for every runner: the graph block is never run, so none of its inputs are made.
    sized = worker.calls_per_block(["eager", "graph"], ["eager"], [{"eager": 50.0}], 10**6, "cuda")
    assert sized == {"eager": 100, "graph": 0}
    # The arena's budget is shared by the timed methods only.
    sized = worker.calls_per_block(["eager", "graph"], ["eager"], [{"eager": 50.0}], 60, "cuda")
    assert sized == {"eager": 60, "graph": 0}
    sized = worker.calls_per_block(["eager", "graph"], ["eager", "graph"], [{"eager": 50.0, "graph": 2.0}], 60, "cuda")
    assert sized["eager"] + sized["graph"] <= 60 and min(sized.values()) >= 1
