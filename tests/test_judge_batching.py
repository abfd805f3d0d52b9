"""The batching check (engine.timing.batched) on real torchrun ranks (cpu, world size 2).

Nothing but the runner, in the candidate's process, sequences a block's calls; a patched runner
can pay a call's latency once per block and be right on every output. The fixture's problem is a
fixed 0.5 ms latency and a sum of 8x8 values, so the gain in blocks and its absence one call at a
time are steady on any CPU (4.4-4.8x in blocks of 6-7 against 1.0x alone, three runs on the 2-core
box, against the CPU limit of 3x; gloo's own all_reduce is too noisy alone to test this on). On
2026-12-06 the same box read 3.3-3.4x in blocks of 5 against 0.92-1.01x alone, on the limit: the
check then fails it, or the launcher reports it at its speed alone (timing.unconfirmed_in_blocks),
or its points are within the limit and it is credited at most 3x its speed alone, which is what
the CPU rule allows (a CI run did that)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pkb_tui.engine import timing
from tests.test_pkb_tasks import PKB_ENV

CLONE = Path(__file__).parent / "fixtures" / "pkb_batching"


def _speedup_alone(runs_dir: Path, model: str) -> timing.SpeedupEstimate | None:
    """The speedup of ``model``'s calls one at a time, from its batch's timing events, paired by
    round as the launcher pairs it (timing.paired_speedup on the rounds of calls alone, cpu's p25)."""
    import json

    items: dict[int, str] = {}
    singles: dict[int, dict[str, list]] = {}
    for path in runs_dir.glob("*/events.*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line.partition(" ")[2])
            if event.get("event") == "run_started":
                items[event["item"]] = Path(event["model"]).name
            elif event.get("event") == "timing":
                singles.setdefault(event["item"], {})[event["variant"]] = (event.get("eager") or {}).get("single_rounds_us") or []
    for item, name in items.items():
        if name == model and len(singles.get(item, {})) == 2:
            return timing.paired_speedup(singles[item]["baseline"], singles[item]["candidate"], "p25")
    return None


@pytest.fixture
def pkb_env(monkeypatch: pytest.MonkeyPatch):
    for name in PKB_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.timeout(600)
def test_a_runner_that_batches_a_blocks_calls_fails_and_the_honest_reference_passes(cli, tmp_db: Path, pkb_env) -> None:
    result = cli("run", "--pkb-root", str(CLONE), "--task", "pkb/all", "--model",
                 f"{CLONE / 'solutions_batch'},{CLONE / 'solutions_honest'}", "--world-size", "2", "--mode", "cpu",
                 "--m", "8", "--n", "8", "--trials", "2", "--no-profile", "--json")
    runs = {r["model"]: r for r in result.json()["runs"]}
    batch, honest = runs["solutions_batch"], runs["solutions_honest"]
    # Never credited with its speed in blocks: failed by the check where the intervals decide, else
    # reported at the speed of its calls one at a time (on this 2-core box, 2026-12-06: 3.1-3.6x in
    # blocks against ~1x alone, the check's 3x limit undecided, both before and after the cap).
    if batch["status"] == "failed":
        assert "timing inconsistent" in batch["status_detail"] and "one call at a time" in batch["status_detail"], batch
        assert batch["correct"] is False  # a failed run is not counted correct anywhere (leaderboard, fast_p)
    elif (batch["speedup_note"] or "").startswith("the speedup of calls one at a time"):
        assert batch["status"] == "passed", batch
        assert batch["speedup"] < 2.0 and batch["speedup_eager"] < 2.0, batch  # in blocks it reads 3x and more
    else:  # within the CPU rule's limit: at most 3x its own speed alone, as the launcher paired it
        assert batch["status"] == "passed", batch
        alone = _speedup_alone(tmp_db.parent / "pkb-runs", "solutions_batch")
        assert alone is not None and batch["speedup"] <= timing.BATCHED_LIMIT["cpu"] * max(alone.point, 1.0), (batch, alone)
    assert honest["status"] == "passed", honest
    assert not (honest["speedup_note"] or "").startswith("the speedup of calls one at a time"), honest
