"""The leaderboard per model endpoint over every generation run: pass@1, pass@k, fast_p@k (suite
means over tasks), and the fast_p-vs-p curve. Reads only; used by the CLI and History."""

from __future__ import annotations

from typing import Any

from pkb_tui.generate.metrics import fast_p_curve, outcomes_from_candidates, suite_mean, task_metrics

P_GRID = tuple(round(0.25 * i, 2) for i in range(0, 17))  # 0 .. 4x


def endpoint_leaderboard(store: Any) -> list[dict[str, Any]]:
    """One entry per (endpoint, model id): samples from all its generation runs pooled per task (a
    sample is keyed by its generation run, so pooling keeps every draw independent)."""
    rows = store.gen_candidate_outcomes()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        # One chain per (generation run, sample): made distinct before pooling.
        keyed = {**row, "sample": f"{row['gen_run_id']}:{row['sample']}"}
        groups.setdefault((row["endpoint"], row["model_id"]), []).append(keyed)
    board = []
    for (endpoint, model), candidates in groups.items():
        outcomes = outcomes_from_candidates(candidates)
        per_task_n: dict[str, int] = {}
        for o in outcomes:
            per_task_n[o.task_id] = per_task_n.get(o.task_id, 0) + 1
        k = min(per_task_n.values()) if per_task_n else 1
        per_task = task_metrics(outcomes, sorted({1, k}), ps=(1.0, 1.5))
        board.append({
            "endpoint": endpoint, "model": model, "tasks": len(per_task), "samples": len(outcomes), "k": k,
            "pass@1": suite_mean(per_task, 1), "pass@k": suite_mean(per_task, k),
            "fast_1@1": suite_mean(per_task, 1, 1.0), "fast_1.5@1": suite_mean(per_task, 1, 1.5),
            "curve": fast_p_curve(outcomes, P_GRID),
        })
    return sorted(board, key=lambda e: (-(e["pass@1"] or 0), e["endpoint"]))
