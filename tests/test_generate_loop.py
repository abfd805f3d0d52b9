"""The generation loop end to end: a real HTTP endpoint on 127.0.0.1 scripted to write torch-p2p-like
solutions (some wrong on purpose), real torchrun evaluation on CPU (gloo, 2 ranks), refine rounds fed
the verdicts, every reply kept in a real SQLite file, and a generate killed with SIGKILL that resumes
without repeating the requests it had finished."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pkb_tui.store import Store
from tests._llm_server import LlmServer, Scripted, models_toml

ROOT = Path(__file__).resolve().parents[1]
# cpu here and in CI; on a GPU box `PKB_GEN_TEST_MODE=nccl` (or shared-gpu) runs the same story on the GPUs.
TEST_MODE = os.environ.get("PKB_GEN_TEST_MODE", "cpu")
RING_ALL_REDUCE = (ROOT / "solutions" / "torch-p2p" / "all_reduce.py").read_text()

# Wrong on purpose: every rank returns its own tensor, no sum (a mismatch on every rank).
WRONG = "My ring all-reduce:\n```python\nimport torch\n\n\ndef solution(x: torch.Tensor) -> torch.Tensor:\n    return x.clone()\n```\n"
FIXED = f"You are right, the sum was missing. The whole module:\n```python\n{RING_ALL_REDUCE}```\n"
# Correct, split over two blocks: the helper first, then the solution that uses it.
TWO_BLOCKS = (
    "First a helper:\n```python\nimport torch\nimport torch.distributed as dist\n\n\ndef _summed(x):\n"
    "    out = x.clone()\n    dist.all_reduce(out)\n    return out\n```\nThen the entry point:\n"
    "```python\ndef solution(x):\n    return _summed(x)\n```\n"
)
NO_CODE = "I would use a ring algorithm with chunked sends, pipelined over two streams."


def _round_of(record: dict) -> int:
    messages = record["body"]["messages"]
    found = re.search(r"round (\d+) of", messages[-1]["content"])
    return int(found.group(1)) if found else 0


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKB_TEST_KEY", "sk-test-not-a-real-key")


def test_generate_refines_a_wrong_candidate_into_a_right_one_and_the_leaderboard_counts_it(cli, tmp_path: Path) -> None:
    # Per round, the replies in the order the samples ask (concurrency 1 keeps that order):
    # sample 0: wrong, then fixed; sample 1: right at once (two blocks); sample 2: no code, twice, then none.
    script = {0: [WRONG, TWO_BLOCKS, NO_CODE], 1: [FIXED, NO_CODE], 2: [NO_CODE]}

    def respond(record: dict) -> Scripted:
        return Scripted(text=script[_round_of(record)].pop(0), completion_tokens=300)

    db = tmp_path / "runs.db"
    with LlmServer(respond) as server:
        config = models_toml(tmp_path / "models.toml", server.url, name="local-sonnet", api="anthropic", concurrency=1)
        result = cli("--db", str(db), "generate", "--task", "all_reduce", "--model", "local-sonnet", "--samples", "3",
                     "--rounds", "2", "--until-correct", "--world-size", "2", "--mode", TEST_MODE, "--size", "small",
                     "--trials", "2", "--models-config", str(config), "--out", str(tmp_path), "--json")
    assert result.code == 0, result.err
    summary = result.json()
    task = summary["tasks"]["all_reduce"]
    assert (task["n"], task["correct"]) == (3, 2)
    assert task["pass_at"]["1"] == pytest.approx(2 / 3)
    assert task["pass_at"]["3"] == pytest.approx(1.0)
    assert len(server.requests) == 6  # 3 first answers, 2 refines in round 1 (sample 1 was right), 1 in round 2

    # The refine request of sample 0 carried the wrong candidate's verdict and per-rank figures.
    refine = [r for r in server.requests if _round_of(r) == 1][0]["body"]["messages"]
    assert refine[1] == {"role": "assistant", "content": WRONG}
    assert "Verdict: failed" in refine[2]["content"] and "WRONG" in refine[2]["content"]
    assert "Fix it first" in refine[2]["content"]

    with Store(db) as store:
        rows = store.gen_requests(summary["gen_run_id"])
        chain0 = [r for r in rows if r["sample"] == 0]
        assert [(r["candidate_status"], r["run_status"]) for r in chain0] == [("evaluated", "failed"), ("evaluated", "passed")]
        s1 = [r for r in rows if r["sample"] == 1]
        assert len(s1) == 1 and s1[0]["run_status"] == "passed" and "joined" in s1[0]["extraction"]
        s2 = [r for r in rows if r["sample"] == 2]
        assert [r["candidate_status"] for r in s2] == ["no_code"] * 3 and all(r["run_id"] is None for r in s2)
        # Every reply kept whole with its usage and cost; the prompt by hash.
        reply = store.gen_reply(chain0[1]["id"])
        assert reply["text"] == FIXED and reply["completion_tokens"] == 300 and reply["resolved_model"] == "served-model-2026"
        assert reply["cost_usd"] == pytest.approx((120 * 3.0 + 300 * 15.0) / 1e6)
        assert store.prompt(chain0[1]["prompt_hash"])["text"].count("round 1 of 2") == 1
        # The candidate file is in the solution set of its sample and round, traced to the run.
        run = store.run(chain0[1]["run_id"])
        assert Path(chain0[1]["path"]) == tmp_path / "solutions/gen/test-model-1" / str(summary["gen_run_id"]) / "s00r1/all_reduce.py"
        assert store.source(run["candidate_source_hash"])["text"] == RING_ALL_REDUCE
        # No key anywhere in the database.
    assert b"sk-test-not-a-real-key" not in db.read_bytes()

    board = cli("--db", str(db), "generations")
    assert board.code == 0
    line = [ln for ln in board.out.splitlines() if ln.startswith("local-sonnet")][0]
    assert line.split()[:7] == ["local-sonnet", "test-model-1", "1", "3", "67%", "100%", "3"]


def test_a_killed_generate_resumes_without_repeating_finished_requests(tmp_path: Path) -> None:
    release = threading.Event()
    answered: list[int] = []

    def respond(record: dict) -> Scripted:
        answered.append(1)
        if len(answered) == 3 and not release.is_set():
            return Scripted(text=NO_CODE, hold=release)  # the third request hangs until the process is killed
        return Scripted(text=NO_CODE + f" ({len(answered)})")

    db = tmp_path / "runs.db"
    with LlmServer(respond) as server:
        config = models_toml(tmp_path / "models.toml", server.url, concurrency=1, max_retries=0)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PKB_TEST_KEY": "k"}
        args = [sys.executable, "-m", "pkb_tui.cli", "--db", str(db), "generate", "--task", "all_reduce", "--model", "local",
                "--samples", "4", "--mode", "cpu", "--models-config", str(config), "--out", str(tmp_path)]
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(server.requests) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(server.requests) == 3, proc.stderr.read() if proc.poll() is not None else "no third request"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        release.set()

        conn = sqlite3.connect(db)
        statuses = [row[0] for row in conn.execute("SELECT status FROM gen_requests ORDER BY sample")]
        conn.close()
        assert statuses == ["replied", "replied", "sent", "pending"]

        resumed = subprocess.run(args[:5] + ["generate", "--resume", "1", "--models-config", str(config), "--json"],
                                 env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 1, resumed.stderr  # no sample was correct: exit 1, not an error
    assert len(server.requests) == 5  # the hung third and the never-sent fourth; not the two finished ones
    assert server.requests[3]["body"] == server.requests[2]["body"]  # the cut request asked again in the same words
    with Store(db) as store:
        rows = store.gen_requests(1)
        assert [(r["sample"], r["status"], r["candidate_status"]) for r in rows] == [
            (s, "replied", "no_code") for s in range(4)]
        texts = [store.gen_reply(r["id"])["text"] for r in rows]
        assert texts[:2] == [NO_CODE + " (1)", NO_CODE + " (2)"]  # the replies from before the kill, kept
        assert store.gen_run(1)["status"] == "finished"
    assert json.loads(resumed.stdout)["requests"] == 4


def test_a_quota_error_stops_the_generation_and_a_resume_sends_only_what_is_left(cli, tmp_path: Path) -> None:
    quota = Scripted(status=429, error={"type": "insufficient_quota", "code": "insufficient_quota",
                                        "message": "You exceeded your current quota."})
    script = [Scripted(text=NO_CODE), Scripted(status=400, error={"message": "max_tokens is too large"}), quota]
    db = tmp_path / "runs.db"
    with LlmServer(lambda record: script.pop(0)) as server:
        config = models_toml(tmp_path / "models.toml", server.url, concurrency=1)
        common = ("--db", str(db), "generate", "--models-config", str(config))
        stopped = cli(*common, "--task", "all_reduce", "--model", "local", "--samples", "4", "--mode", "cpu",
                      "--out", str(tmp_path))
        assert stopped.code == 2 and "quota or billing" in stopped.err
        assert len(server.requests) == 3  # the quota error was not retried, and sample 3 was never sent
        with Store(db) as store:
            assert store.gen_run(1)["status"] == "stopped"
            rows = store.gen_requests(1)
            assert [(r["status"], r["candidate_status"]) for r in rows] == [
                ("replied", "no_code"), ("failed", "request_failed"), ("pending", None), ("pending", None)]
            assert "max_tokens is too large" in rows[1]["error"]
        script += [Scripted(text=NO_CODE), Scripted(text=NO_CODE)]
        resumed = cli(*common, "--resume", "1")
        assert resumed.code == 1, resumed.err
        assert len(server.requests) == 5  # samples 2 and 3 only: the failed request is finished, not resent
    with Store(db) as store:
        assert store.gen_run(1)["status"] == "finished"
        assert [r["sample"] for r in store.gen_requests(1)] == [0, 1, 2, 3]
