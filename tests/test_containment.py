"""What a candidate may take of the machine (engine.limits), on CPU with two real ranks.

Each fixture under tests/fixtures/containment/ gives the right answer and abuses the machine:
memory held in the runner, memory held by a daemon that escaped the runner's process tree,
threads by the hundred, output by the tens of MiB. The limits end the first three with a verdict
that names the limit; the flood passes with its log cut to its head and tail; nothing of the batch
is left running.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pkb_tui.engine.sandbox import landlock_abi

CONTAINMENT = Path(__file__).parent / "fixtures" / "containment"
HONEST = Path(__file__).resolve().parents[1] / "solutions" / "torch-p2p"


def _processes_under(folder: Path) -> list[str]:
    """Processes whose working directory is inside ``folder`` (runners work in its scratch)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if cwd.startswith(str(folder)):
                found.append(f"{entry}: {cwd}")
    return found


@pytest.mark.timeout(1200)
def test_limits_end_abusive_candidates_with_a_verdict_that_names_the_limit(cli, tmp_db: Path, tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    abusers = ("memory-hog", "thread-bomb", "escaped-hog", "flood", "escape-attempts")
    models = ",".join([*(str(CONTAINMENT / name) for name in abusers), str(HONEST)])
    result = cli("run", "--task", "all_reduce", "--model", models, "--world-size", "2", "--size", "small",
                 "--trials", "2", "--no-timing", "--no-profile", "--timeout", "300", "--runs-dir", str(runs_dir),
                 "--max-host-memory-gib", "1", "--max-tasks", "150", "--json")
    runs = {r["model"]: r for r in result.json()["runs"]}
    for name in ("memory-hog", "escaped-hog"):
        assert runs[name]["status"] == "error", runs[name]
        assert "exceeded its host-memory limit" in runs[name]["status_detail"], runs[name]["status_detail"]
        assert "> 1.0 GiB" in runs[name]["status_detail"], runs[name]["status_detail"]
    assert runs["thread-bomb"]["status"] == "error", runs["thread-bomb"]
    assert "exceeded its limit of 150 threads and processes" in runs["thread-bomb"]["status_detail"]
    assert runs["torch-p2p"]["status"] == "passed", runs["torch-p2p"]
    # Every write outside its scratch and its own caches refused, every capability gone (root or not).
    if landlock_abi() > 0:
        assert runs["escape-attempts"]["status"] == "passed", runs["escape-attempts"]["status_detail"]
    else:
        assert "escaped the sandbox" in runs["escape-attempts"]["status_detail"]

    # The flood is right, so it passes; its log keeps the first and the last MiB and says what went.
    assert runs["flood"]["status"] == "passed", runs["flood"]
    (batch,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    logs = sorted(batch.glob("item003.rank0.candidate.log"))
    assert logs, sorted(p.name for p in batch.iterdir())
    text = logs[0].read_text(errors="replace")
    assert logs[0].stat().st_size < 3 * 2**20, logs[0].stat().st_size
    assert "FLOOD-FIRST-LINE" in text and "bytes of output dropped here" in text
    assert "FLOOD-LAST-LINE call 2" in text.rsplit("bytes of output dropped here", 1)[1]
    total = sum(p.stat().st_size for p in batch.rglob("*") if p.is_file())
    assert total < 32 * 2**20, total  # 48 MiB printed per rank, a few MiB kept in all

    # Nothing of the batch runs on: not the runners, not the daemon that escaped.
    assert _processes_under(runs_dir) == []
    notes = runs["torch-p2p"]["notes"]
    assert any("limits per candidate and rank: 1.0 GiB of host memory, 150 threads" in n for n in notes), notes


@pytest.mark.timeout(600)
def test_a_runner_without_its_sandbox_says_so_in_the_runs_notes(cli, tmp_db: Path, monkeypatch) -> None:
    monkeypatch.setenv("PKB_SANDBOX", "0")
    result = cli("run", "--task", "all_reduce", "--model", str(HONEST), "--world-size", "1", "--size", "small",
                 "--trials", "1", "--no-timing", "--no-profile", "--timeout", "300", "--json")
    (run,) = result.json()["runs"]
    assert run["status"] == "passed", run
    assert "the candidate's sandbox on rank 0: no write sandbox: PKB_SANDBOX=0" in run["notes"], run["notes"]
