"""Per-problem scores as ParallelKernelBench's paper reports them, over the runs in runs.db.

- pass@k: for each (model, problem), over its n finished runs of which c were correct, the unbiased
  estimator 1 - C(n-c, k) / C(n, k) (the chance that at least one of k runs drawn is correct);
  a model's pass@k is the mean over the problems with n >= k.
- fast_p: over the latest finished run of each (model, problem), the share of problems whose
  candidate is correct and faster than the baseline by more than p (fast_1: faster at all), by the
  project's one rule (store.faster.counts_as_faster): the speedup's interval, widened by the host's
  noise floor, clears p. PKB's paper counts the point ratio; a ratio the timing noise could explain
  is not counted here.

Kept apart from Store.leaderboard (another issue reworks it): it reads the same tables and writes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

from pkb_tui.generate.metrics import pass_at_k
from pkb_tui.store.faster import row_counts_as_faster

FINISHED = ("passed", "failed", "error", "timeout")


@dataclass
class ProblemScore:
    model: str
    task_id: str
    runs: int
    correct_runs: int
    latest_correct: bool
    latest_speedup: float | None
    latest_timing: dict = field(default_factory=dict)  # the latest run's speedup, speedup_low, rounds, noise floor

    def pass_at(self, k: int) -> float | None:
        return pass_at_k(self.runs, self.correct_runs, k)  # the generation loop's estimator (generate/metrics.py)

    def fast(self, p: float) -> bool:
        return self.latest_correct and row_counts_as_faster(self.latest_timing, p)


@dataclass
class ModelScore:
    model: str
    problems: list[ProblemScore] = field(default_factory=list)

    def pass_at(self, k: int) -> float | None:
        values = [v for v in (p.pass_at(k) for p in self.problems) if v is not None]
        return sum(values) / len(values) if values else None

    def fast(self, p: float) -> float | None:
        return sum(pr.fast(p) for pr in self.problems) / len(self.problems) if self.problems else None


def problem_scores(conn: sqlite3.Connection, *, prefix: str | None = None) -> list[ModelScore]:
    """Scores per model, each with its problems (task ids starting with ``prefix`` when given)."""
    marks = ",".join("?" for _ in FINISHED)
    rows = conn.execute(
        f"SELECT r.id, r.model, r.task_id, c.correct, c.speedup, c.speedup_low, c.rounds, c.noise_floor_fraction, "
        f"c.interval_floor "
        f"FROM runs r "
        f"LEFT JOIN results c ON c.run_id = r.id AND c.variant = 'candidate' "
        f"WHERE r.status IN ({marks}) ORDER BY r.id", FINISHED,
    ).fetchall()
    by_pair: dict[tuple[str, str], ProblemScore] = {}
    for _, model, task_id, correct, speedup, low, rounds, floor, floor_in in rows:
        if prefix and not task_id.startswith(prefix):
            continue
        score = by_pair.get((model, task_id))
        if score is None:
            score = by_pair[(model, task_id)] = ProblemScore(model, task_id, 0, 0, False, None)
        score.runs += 1
        score.correct_runs += bool(correct)
        score.latest_correct, score.latest_speedup = bool(correct), speedup  # rows come in id order
        score.latest_timing = {"speedup": speedup, "speedup_low": low, "rounds": rounds, "noise_floor_fraction": floor,
                               "interval_floor": floor_in}
    models: dict[str, ModelScore] = {}
    for (model, _), score in sorted(by_pair.items()):
        models.setdefault(model, ModelScore(model)).problems.append(score)
    return list(models.values())


def board_rows(scores: Iterable[ModelScore], ks: tuple[int, ...], ps: tuple[float, ...]) -> list[tuple[str, ...]]:
    """One row per model: problems, pass@k for each k, fast_p for each p (as percentages)."""
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.0f}%"

    return [(s.model, str(len(s.problems)), *(pct(s.pass_at(k)) for k in ks), *(pct(s.fast(p)) for p in ps))
            for s in scores]
