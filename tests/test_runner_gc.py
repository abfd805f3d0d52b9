"""Python's collector and the timed window: a collection pass over the runner's heap (torch's
~200,000 objects: tens of ms on a VM) fell in some blocks and not others. The runner collects
before each block and keeps the collector off until the block's answer has gone."""

from __future__ import annotations

from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "fixtures" / "solutions" / "gc-probe"


@pytest.mark.timeout(600)
def test_every_call_the_judge_makes_runs_with_the_collector_off(cli, tmp_db: Path) -> None:
    # gc-probe returns zeros from any call made with the collector on: trials and timed calls alike.
    result = cli("run", "--task", "all_reduce", "--model", str(PROBE), "--world-size", "1", "--size", "small",
                 "--trials", "2", "--iterations", "6", "--warmup", "2", "--no-profile", "--timeout", "300", "--json")
    (run,) = result.json()["runs"]
    assert run["status"] == "passed", run
    assert run["speedup"] is not None, run  # the timed calls ran (and were judged) too
