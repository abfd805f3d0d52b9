"""A launch that fails shows the failed rank's own exception, never torchrun's wrapper traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pkb_tui.engine.logs import RANKS_DID_NOT_START, first_failed_rank, launch_failure_detail, rank_failure
from pkb_tui.store import Store
from tests.conftest import fixture_model

REPO = Path(__file__).resolve().parents[1]
FAST = ("--trials", "1", "--iterations", "2", "--warmup", "1", "--no-profile")

# torchrun 2.13's output when rank 1 raised at start-up (its wrapper traceback and summary after it).
TORCHRUN_OUTPUT = """\
=== launch 1: python -m torch.distributed.run ...
hello from 0
[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/worker.py", line 7, in <module>
[rank0]: something rank 0 said
[rank1]:     inner()
[rank1]: RuntimeError: Numpy is not available
W1203 08:29:53.547000 7939 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7960 closing signal SIGTERM
E1203 08:29:53.549000 7939 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
pkb_tui.engine.worker FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_08:29:53
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7960)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_08:29:53
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 7961)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_root_cause_rank_and_its_exception_come_from_launch_log(tmp_path: Path) -> None:
    (tmp_path / "launch.log").write_text("=== launch 0: an earlier launch\nRuntimeError: old news\n" + TORCHRUN_OUTPUT)
    assert first_failed_rank(TORCHRUN_OUTPUT) == (1, 1)
    failure = rank_failure(tmp_path, items=[0])
    assert failure.rank == 1 and failure.exit_code == 1
    assert failure.lines[-1] == "RuntimeError: Numpy is not available"
    assert not any("rank 0 said" in line or "ChildFailedError" in line or "old news" in line for line in failure.lines)
    assert failure.headline == "rank 1 failed (exit code 1): RuntimeError: Numpy is not available"


def test_a_rank_log_of_this_launch_wins_over_launch_log_and_older_items_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "launch.log").write_text(TORCHRUN_OUTPUT)
    (tmp_path / "item000.rank1.log").write_text("Traceback (most recent call last):\nValueError: from an earlier launch\n")
    (tmp_path / "item003.rank1.log").write_text(
        "some output\nTraceback (most recent call last):\n  File \"cand.py\", line 3\nKeyError: 'peer_ptr'\n"
    )
    (tmp_path / "item003.rank0.log").write_text("Traceback (most recent call last):\nOSError: rank 0's own\n")
    detail = launch_failure_detail(tmp_path, 1, items=[3, 4])
    first = detail.splitlines()[0]
    assert first == "a rank process died (torchrun exit code 1): rank 1 failed (exit code 1): KeyError: 'peer_ptr'"
    assert "item003.rank1.log" in detail and "earlier launch" not in detail and "rank 0's own" not in detail


def _cli(*args: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [extra_path, str(REPO)])), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pkb_tui.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=REPO)


def test_ranks_that_cannot_start_are_a_harness_failure_showing_the_ranks_exception(tmp_path: Path) -> None:
    # The newcomer's first run: numpy missing, so torch.distributed's object gathers fail on every rank.
    hidden = tmp_path / "hide-numpy"
    (hidden / "numpy").mkdir(parents=True)
    (hidden / "numpy" / "__init__.py").write_text(
        "raise ModuleNotFoundError('No module named numpy (hidden by the test)', name='numpy')\n"
    )
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "--runs-dir", str(tmp_path / "runs"), "run", "--task", "all_reduce",
                  "--model", "baseline", "--mode", "cpu", *FAST, extra_path=str(hidden))
    assert result.returncode == 3, result.stderr
    assert "RuntimeError: Numpy is not available" in result.stdout
    with Store(db) as store:
        run = store.run(1)
    detail = run["status_detail"]
    assert detail.startswith(RANKS_DID_NOT_START)
    assert detail.splitlines()[0].endswith("RuntimeError: Numpy is not available")
    assert "ChildFailedError" not in detail and "torch/distributed/run.py" not in detail
    assert Path(run["log_path"]).parent.parent == tmp_path / "runs"  # --runs-dir took
    shown = _cli("--db", str(db), "show", "1")
    assert "detail: " + RANKS_DID_NOT_START in shown.stdout and "Numpy is not available" in shown.stdout


def test_a_rank_that_dies_mid_run_shows_what_it_said_and_is_the_candidates_failure(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "run", "--task", "all_reduce", "--model", fixture_model("crash-with-message"),
                  "--mode", "cpu", *FAST)
    assert result.returncode == 1, result.stderr
    with Store(db) as store:
        detail = store.run(1)["status_detail"]
    first = detail.splitlines()[0]
    # The judge saw its runner die: the rank, the exit code and the candidate's own last words.
    assert "rank 1 exited with code 7: CUDA error: an illegal memory access was encountered" in first, first
    assert "ChildFailedError" not in detail


def test_the_timeout_bounds_the_ranks_start_up(tmp_path: Path) -> None:
    # One second cannot cover starting two Python processes that import torch: the launch ends at
    # the timeout, counted from the launch, and the run says the ranks never started.
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "run", "--task", "all_reduce", "--model", "baseline", "--mode", "cpu",
                  "--timeout", "1", *FAST)
    assert result.returncode == 3, result.stderr
    with Store(db) as store:
        run = store.run(1)
    assert run["status"] == "error"
    assert run["status_detail"].startswith(f"{RANKS_DID_NOT_START}: the ranks' start-up took longer than its timeout (1 s)")


def test_the_first_run_is_not_charged_the_ranks_start_up(tmp_path: Path) -> None:
    # The candidate's first call returns half a second after the launch is one timeout old (12 s,
    # from torchrun's start): a timeout that counted the ranks' start-up (~2.5 s here) ended it
    # ("did not answer within its timeout"); counted from the run's own start it passes.
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "run", "--task", "all_reduce", "--model", fixture_model("slow-first-call"),
                  "--mode", "cpu", "--timeout", "12", *FAST)
    with Store(db) as store:
        run = store.run(1)
    assert (run["status"], result.returncode) == ("passed", 0), (run["status_detail"], result.stderr[-2000:])


def test_the_baseline_trials_experiment_runs_the_trials_on_both_runners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # PKB_BASELINE_TRIALS=1: the baseline's runner loads the task and makes each trial's call
    # before timing (as the candidate's does). Its first version called an unloaded runner and
    # ended every run "error".
    monkeypatch.setenv("PKB_BASELINE_TRIALS", "1")
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "run", "--task", "all_reduce", "--model", "baseline", "--mode", "cpu",
                  "--trials", "2", "--iterations", "2", "--warmup", "1", "--no-profile")
    with Store(db) as store:
        run = store.run(1)
    assert (run["status"], result.returncode) == ("passed", 0), (run["status_detail"], result.stderr[-2000:])


@pytest.mark.parametrize("forkserver", ["1", "0"])
def test_a_runner_has_the_judges_comparison_code_before_the_first_call(tmp_path: Path, forkserver: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The first null block of a runner cloned its outputs with engine.compare, imported there (8.5 ms
    # on this box): in the warm-up, whose block less its null sizes the blocks, a call of tens of
    # microseconds read as nothing and blocks of hundreds of calls were asked for. Both ways a
    # runner starts (forked from the warm server, or a fresh interpreter) import it before any call.
    monkeypatch.setenv("PKB_FORKSERVER", forkserver)
    model = tmp_path / "probe"
    model.mkdir()
    (model / "all_reduce.py").write_text(
        "import sys\n\nimport torch.distributed as dist\n\n"
        "print('pkb-test: compare loaded:', 'pkb_tui.engine.compare' in sys.modules, flush=True)\n\n\n"
        "def solution(x):\n    out = x.clone()\n    dist.all_reduce(out)\n    return out\n")
    db = tmp_path / "runs.db"
    result = _cli("--db", str(db), "run", "--task", "all_reduce", "--model", str(model), "--mode", "cpu",
                  "--world-size", "1", "--trials", "1", "--no-timing", "--no-profile")
    with Store(db) as store:
        run = store.run(1)
    assert (run["status"], result.returncode) == ("passed", 0), (run["status_detail"], result.stderr[-2000:])
    said = [line for log in Path(run["log_path"]).parent.glob("*.log") for line in log.read_text().splitlines()
            if "pkb-test: compare loaded:" in line]
    assert said and all(line.endswith("True") for line in said), said
