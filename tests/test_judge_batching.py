"""The batching check (engine.timing.batched) on real torchrun ranks (cpu, world size 2).

Nothing but the runner, in the candidate's process, sequences a block's calls; a patched runner
can pay a call's latency once per block and be right on every output. The fixture's problem is a
fixed 0.5 ms latency and a sum of 8x8 values, so the gain in blocks and its absence one call at a
time are steady on any CPU (4.4-4.8x in blocks of 6-7 against 1.0x alone, three runs on the 2-core
box, against the CPU limit of 3x; gloo's own all_reduce is too noisy alone to test this on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_pkb_tasks import PKB_ENV

CLONE = Path(__file__).parent / "fixtures" / "pkb_batching"


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
    else:
        assert batch["status"] == "passed", batch
        assert (batch["speedup_note"] or "").startswith("the speedup of calls one at a time"), batch
        assert batch["speedup"] < 2.0 and batch["speedup_eager"] < 2.0, batch  # in blocks it reads 3x and more
    assert honest["status"] == "passed", honest
    assert not (honest["speedup_note"] or "").startswith("the speedup of calls one at a time"), honest
