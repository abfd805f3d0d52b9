"""Statistics of interleaved timings: known distributions in, known intervals out."""

from __future__ import annotations

import math
import random

import pytest

from pkb_tui.engine import stats


def _lognormal_rounds(rng: random.Random, median_us: float, sigma: float, rounds: int, calls: int,
                      drift: list[float] | None = None) -> list[list[float]]:
    return [[median_us * (drift[r] if drift else 1.0) * math.exp(rng.gauss(0.0, sigma)) for _ in range(calls)]
            for r in range(rounds)]


def _pair(seed: int, ratio: float, *, rounds: int = 20, calls: int = 30, sigma: float = 0.1,
          drift: list[float] | None = None) -> tuple[list[list[float]], list[list[float]]]:
    rng = random.Random(seed)
    baseline = _lognormal_rounds(rng, 100.0, sigma, rounds, calls, drift)
    candidate = _lognormal_rounds(rng, 100.0 / ratio, sigma, rounds, calls, drift)
    return baseline, candidate


@pytest.mark.parametrize("rounds", [8, 20])
def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time(rounds: int) -> None:
    covered = 0
    repetitions = 400
    for seed in range(repetitions):
        baseline, candidate = _pair(seed, 1.3, rounds=rounds, calls=15)
        estimate = stats.speedup_interval(baseline, candidate)
        covered += estimate.contains(1.3)
    rate = covered / repetitions
    # binomial sd at 400 draws is ~1.1%: a too-narrow interval (<91%) or a uselessly wide one
    # (the min..max of the rounds: >99%) both fail
    assert 0.91 <= rate <= 0.985, rate


def test_a_baseline_against_itself_gives_intervals_containing_one() -> None:
    contained = sum(stats.speedup_interval(*_pair(seed, 1.0)).contains(1.0) for seed in range(100))
    assert contained >= 90


def test_a_one_and_a_half_times_faster_candidate_is_an_interval_excluding_one() -> None:
    estimate = stats.speedup_interval(*_pair(7, 1.5))
    assert estimate.low > 1.0
    assert estimate.low < 1.5 < estimate.high
    assert abs(estimate.point - 1.5) < 0.05
    assert stats.clears(estimate, 1.0) and not stats.clears(estimate, 1.5)


def test_drift_between_rounds_cancels_because_rounds_pair_up() -> None:
    # the box slows down 3x over the measurement, both variants alike: the pooled medians' ratio
    # would still come out right on average, but the paired interval stays as narrow as without drift
    drift = [1.0 + 0.1 * r for r in range(20)]
    still = stats.speedup_interval(*_pair(3, 1.2))
    drifting = stats.speedup_interval(*_pair(3, 1.2, drift=drift))
    assert drifting.contains(1.2)
    assert drifting.relative_half_width < 1.5 * still.relative_half_width
    assert drifting.relative_half_width < 0.05


def test_bimodal_rounds_do_not_pull_the_median_ratio() -> None:
    # a quarter of rounds hit a slow mode on one variant only (a scheduler tick): a mean of
    # ratios would move ~8%, the median of round ratios stays near 1.0
    rng = random.Random(11)
    baseline = _lognormal_rounds(rng, 100.0, 0.05, 24, 20)
    candidate = _lognormal_rounds(rng, 100.0, 0.05, 24, 20)
    for r in range(0, 24, 4):
        candidate[r] = [x * 1.4 for x in candidate[r]]
    estimate = stats.speedup_interval(baseline, candidate)
    assert estimate.contains(1.0)
    assert abs(estimate.point - 1.0) < 0.04


def test_few_rounds_fall_back_to_a_within_round_bootstrap_and_say_so() -> None:
    baseline, candidate = _pair(5, 1.5, rounds=3)
    estimate = stats.speedup_interval(baseline, candidate, seed=1, resamples=300)
    assert "bootstrap" in estimate.method_note and "drift" in estimate.method_note
    assert estimate.low <= estimate.point <= estimate.high
    assert estimate.low > 1.0
    assert stats.speedup_interval(baseline, candidate, seed=1, resamples=300) == estimate  # seeded


def test_min_rounds_is_what_the_sign_test_needs() -> None:
    assert stats.min_rounds(0.95) == 6  # 1 - 2/2**5 = 0.9375 < 0.95 <= 1 - 2/2**6
    assert stats.min_rounds(0.99) == 8


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="pair up"):
        stats.speedup_interval([[1.0]], [[1.0], [2.0]])
    with pytest.raises(ValueError, match="positive"):
        stats.speedup_interval([[0.0]], [[1.0]])
    with pytest.raises(ValueError, match="no round"):
        stats.speedup_interval([[]], [[]])


def test_variant_summary_pools_rounds() -> None:
    figures = stats.summarize_rounds([[1.0, 2.0, 3.0], [4.0, 5.0]])
    assert figures.median_us == 3.0 and figures.min_us == 1.0 and figures.max_us == 5.0
    assert figures.samples == 5 and figures.rounds == 2
    assert figures.p10_us == pytest.approx(1.4)


def test_round_statistics() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert stats.round_location(values, "median") == 3.0
    assert stats.round_location(values, "p25") == 2.0
    assert stats.round_location([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0], "trimmed") == 4.5
    with pytest.raises(ValueError, match="unknown round statistic"):
        stats.round_location(values, "mode")


def test_within_noise_uses_the_host_floor() -> None:
    estimate = stats.SpeedupEstimate(1.04, 1.02, 1.06, "", 10, 0.95)
    assert not stats.within_noise(estimate, None)  # excludes 1.0
    assert stats.within_noise(estimate, 0.03)  # reaches into [0.971, 1.03]
    assert not stats.within_noise(estimate, 0.01)
    slower = stats.SpeedupEstimate(0.9, 0.88, 0.92, "", 10, 0.95)
    assert not stats.within_noise(slower, 0.05) and stats.within_noise(slower, 0.1)


def test_the_round_policy_stops_when_narrow_or_out_of_time() -> None:
    baseline, candidate = _pair(2, 1.1, rounds=40, sigma=0.01)
    few = stats.next_round_needed(baseline[:3], candidate[:3], elapsed_s=0.3, budget_s=10)
    assert few.more and "at least 6" in few.reason
    narrow = stats.next_round_needed(baseline[:8], candidate[:8], elapsed_s=0.8, budget_s=10)
    assert not narrow.more and narrow.estimate is not None and narrow.estimate.relative_half_width <= 0.02
    noisy_b, noisy_c = _pair(2, 1.1, rounds=8, sigma=0.5)
    wide = stats.next_round_needed(noisy_b, noisy_c, elapsed_s=0.8, budget_s=10)
    assert wide.more
    spent = stats.next_round_needed(noisy_b, noisy_c, elapsed_s=9.5, budget_s=10)
    assert not spent.more and "budget" in spent.reason and spent.rounds == 8
    capped = stats.next_round_needed(noisy_b, noisy_c, elapsed_s=0.8, budget_s=10, max_rounds=8)
    assert not capped.more


def test_noise_floor_from_selfchecks() -> None:
    estimates = [stats.SpeedupEstimate(p, p, p, "", 6, 0.95) for p in (1.01, 0.96, 1.02)]
    assert stats.noise_floor_from_selfchecks(estimates) == pytest.approx(1 / 0.96 - 1)
    assert stats.noise_floor_from_selfchecks([]) is None


def test_the_noise_floor_asks_only_for_what_the_rounds_interval_does_not_cover() -> None:
    # 1.05x whose rounds' interval reaches down to 1.03: the floor is the rest, in quadrature
    # (log space), and with it the widened interval just holds 1.0.
    leaning = stats.SpeedupEstimate(1.05, 1.03, 1.07, "", 8, 0.95)
    floor = stats.noise_floor_from_selfchecks([leaning])
    expected = math.expm1(math.sqrt(math.log(1.05) ** 2 - math.log(1.05 / 1.03) ** 2))
    assert floor == pytest.approx(expected)
    assert 0.0 < floor < 0.05  # less than the point's whole distance from 1.0
    assert stats.widened(leaning, floor).low == pytest.approx(1.0)
    assert stats.widened(leaning, floor * 0.9).low > 1.0
    # below 1.0 the high side faces 1.0; an interval that holds 1.0 asks for nothing
    slow = stats.SpeedupEstimate(0.98, 0.979, 0.985, "", 8, 0.95)
    assert stats.widened(slow, stats.noise_floor_from_selfchecks([slow])).high == pytest.approx(1.0)
    holding = stats.SpeedupEstimate(1.3, 0.8, 2.0, "", 8, 0.95)
    assert stats.noise_floor_from_selfchecks([holding]) == 0.0
    # the host's floor is what its worst self-check asks for
    assert stats.noise_floor_from_selfchecks([holding, slow, leaning]) == pytest.approx(expected)


def test_timing_result_fields_fill_both_methods_and_the_picked_one() -> None:
    b_eager, c_eager = _pair(1, 1.5)
    b_graph, c_graph = _pair(2, 3.0)
    eager = stats.MethodRounds(b_eager, c_eager)
    graph = stats.MethodRounds(b_graph, c_graph)
    fields = stats.timing_result_fields(eager, graph, basis="graph", noise_floor_fraction=0.02)
    cand, base = fields["candidate"], fields["baseline"]
    assert cand["timing_method"] == "graph" and base["timing_method"] == "graph"
    assert cand["speedup"] == cand["speedup_graph"] and abs(cand["speedup"] - 3.0) < 0.15
    assert abs(cand["speedup_eager"] - 1.5) < 0.08
    assert cand["median_us"] == cand["graph_median_us"] and base["rounds"] == 20 and base["iterations"] == 600
    assert cand["speedup_low"] <= cand["speedup"] <= cand["speedup_high"] and cand["within_noise"] == 0
    absent = stats.timing_result_fields(eager, stats.MethodRounds(note="not capturable: host sync"))
    assert absent["candidate"]["graph_note"] == "not capturable: host sync"
    assert "graph_median_us" not in absent["candidate"] and absent["candidate"]["speedup"] == absent["candidate"]["speedup_eager"]
    with pytest.raises(ValueError, match="basis"):
        stats.timing_result_fields(eager, basis="wall")


def test_cpu_mode_uses_the_steadier_round_statistic() -> None:
    assert stats.round_statistic_for("cpu") == "p25" and stats.round_statistic_for("nccl") == "median"


def test_the_floor_widens_an_interval_in_quadrature_and_covers_a_steady_process_offset() -> None:
    # A baseline against itself whose two processes differ steadily by 1.3% (the H100 gate's
    # self-check: tp_gemm_reducescatter 1.013 [1.013, 1.014]): the rounds' interval misses 1.0, the
    # interval widened by the host's floor (1.5%) holds it; a 1.5x candidate stays clear of 1.0.
    rounds = stats.SpeedupEstimate(1.013, 1.0126, 1.0138, "median of 6 per-round ratios", 6, 0.95)
    assert not rounds.contains(1.0)
    wide = stats.widened(rounds, 0.015)
    assert wide.contains(1.0) and wide.point == rounds.point and wide.rounds == 6
    spread = math.log1p(0.015)
    assert math.log(wide.point / wide.low) == pytest.approx(math.hypot(math.log(1.013 / 1.0126), spread))
    assert math.log(wide.high / wide.point) == pytest.approx(math.hypot(math.log(1.0138 / 1.013), spread))
    assert "+-1.5%" in wide.method_note and wide.method_note.startswith("median of 6")
    fast = stats.widened(stats.SpeedupEstimate(1.5, 1.45, 1.55, "", 8, 0.95), 0.015)
    assert fast.low > 1.4 and not fast.contains(1.0)
    assert stats.widened(rounds, None) is rounds and stats.widened(rounds, 0.0) is rounds


def test_timing_result_fields_fold_the_floor_in_once() -> None:
    b_eager, c_eager = _pair(3, 1.02, sigma=0.002)  # 2% faster, steadily: rounds alone exclude 1.0
    b_graph, c_graph = _pair(4, 1.0, sigma=0.002)
    eager, graph = stats.MethodRounds(b_eager, c_eager), stats.MethodRounds(b_graph, c_graph)
    plain = stats.timing_result_fields(eager, graph, basis="eager", noise_floor_fraction=0.03)["candidate"]
    folded = stats.timing_result_fields(eager, graph, basis="eager", noise_floor_fraction=0.03,
                                        interval_floors={"eager": 0.03, "graph": 0.01})["candidate"]
    assert plain["interval_floor"] is None and folded["interval_floor"] == 0.03
    assert plain["speedup_low"] > 1.0 and folded["speedup_low"] < 1.0 < folded["speedup_high"]
    assert folded["speedup"] == plain["speedup"]
    assert folded["speedup_graph_low"] < plain["speedup_graph_low"]  # the graph's own floor, 1%
    # within_noise: the rounds' interval against the floor, or the folded interval against 1.0 (not twice)
    assert plain["within_noise"] == 1 and folded["within_noise"] == 1
    from pkb_tui.store import faster

    row = {"speedup": 1.6, "speedup_low": 1.52, "rounds": 8, "noise_floor_fraction": 0.05}
    assert faster.row_counts_as_faster(row, 1.5) is False  # 1.52 / 1.05 < 1.5: the floor still to apply
    assert faster.row_counts_as_faster({**row, "interval_floor": 0.05}, 1.5) is True  # already in 1.52
    assert faster.floor_to_apply(row) == 0.05 and faster.floor_to_apply({**row, "interval_floor": 0.05}) is None
