"""PKB problems and candidate folders through the CLI, on real torchrun ranks (world size 2, cpu)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.test_pkb_tasks import CLONE, MODEL_A, MODEL_B, PKB_ENV


@pytest.fixture
def pkb_env(monkeypatch: pytest.MonkeyPatch):
    """What the CLI puts in the environment (it activates the clone) is undone after the test."""
    for name in PKB_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _trials(db: Path, run_id: int) -> list[tuple[int, int, str | None]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT trial, correct, message FROM trials WHERE run_id = ? AND trial >= 0 ORDER BY trial",
                            (run_id,)).fetchall()


def _request(db: Path, run_id: int) -> dict:
    with sqlite3.connect(db) as conn:
        return json.loads(conn.execute("SELECT request FROM runs WHERE id = ?", (run_id,)).fetchone()[0])


@pytest.mark.timeout(900)
def test_pkb_problems_against_a_right_and_a_wrong_generated_folder_in_one_launch(cli, tmp_db: Path, tmp_path: Path, pkb_env) -> None:
    pkb_env.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))
    result = cli("run", "--pkb-root", str(CLONE), "--task", "pkb/all", "--model", f"{MODEL_A},{MODEL_B}",
                 "--world-size", "2", "--mode", "cpu", "--trials", "3", "--no-timing", "--no-profile", "--json")
    assert result.code == 1, result.err  # some candidate wrong
    runs = {(r["task"], r["model"]): r for r in result.json()["runs"]}
    assert len(runs) == 6
    for task in ("pkb/1_all_reduce", "pkb/2_all_gather", "pkb/3_row_stats"):
        right = runs[(task, MODEL_A.name)]
        assert right["status"] == "passed" and right["dtype"] == "bfloat16", right
        assert runs[(task, MODEL_B.name)]["status"] == "failed"

    # right on its first call, wrong later: caught on trial 1 (PKB's run_local.py checks the first call only)
    late = runs[("pkb/1_all_reduce", MODEL_B.name)]
    assert [(t, c) for t, c, _ in _trials(tmp_db, late["id"])] == [(0, 1), (1, 0), (2, 0)]
    early = runs[("pkb/2_all_gather", MODEL_B.name)]
    assert [c for _, c, _ in _trials(tmp_db, early["id"])] == [0, 0, 0]
    # float32 where the reference returns bfloat16: refused before any comparison (PKB would compare float copies)
    dtype_run = runs[("pkb/3_row_stats", MODEL_B.name)]
    messages = [m for _, _, m in _trials(tmp_db, dtype_run["id"])]
    assert all("column_sum" in m and "expected torch.bfloat16" in m for m in messages), messages

    request = _request(tmp_db, late["id"])
    assert request["extra"]["pkb"]["tolerance"] == "pkb-tui" and request["extra"]["pkb"]["seeds"] == "pkb"
    # no hand-written model: the roofline's traffic is measured from the reference's all_reduce
    traffic = runs[("pkb/1_all_reduce", MODEL_A.name)]["baseline"]["traffic"]
    size_bytes = 256 * 256 * 2
    assert traffic["send_bytes"] == traffic["recv_bytes"] == 2 * (2 - 1) * size_bytes // 2
    assert traffic["payload_bytes"] == size_bytes


@pytest.mark.timeout(600)
def test_pkb_tolerance_judges_like_pkb_and_the_run_says_so(cli, tmp_db: Path, tmp_path: Path, pkb_env) -> None:
    pkb_env.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))
    # sums 0.1% off in float32: inside PKB's allclose(1e-2, 1e-2), outside this project's 1e-5
    common = ("run", "--pkb-root", str(CLONE), "--task", "pkb/3", "--model", str(MODEL_B), "--world-size", "2",
              "--mode", "cpu", "--dtype", "float32", "--trials", "2", "--no-timing", "--no-profile", "--json")
    result = cli(*common, "--pkb-tolerance")
    assert result.code == 0, result.out + result.err
    (run,) = result.json()["runs"]
    assert run["status"] == "passed"
    messages = [m for _, _, m in _trials(tmp_db, run["id"])]
    assert all(m and "verdicts differ: pkb-tui's check" in m and "fails" in m for m in messages), messages
    assert _request(tmp_db, run["id"])["extra"]["pkb"]["tolerance"] == "pkb"

    result = cli(*common)  # this project's check judges; PKB's verdict is said beside it
    assert result.code == 1
    (run,) = result.json()["runs"]
    messages = [m for _, _, m in _trials(tmp_db, run["id"])]
    assert all(m and "verdicts differ: PKB's allclose(atol=0.01, rtol=0.01) passes" in m for m in messages), messages
    assert _request(tmp_db, run["id"])["extra"]["pkb"]["tolerance"] == "pkb-tui"


def test_models_lists_the_clones_folders_with_provider_and_model(cli, pkb_env) -> None:
    result = cli("models", "--pkb-root", str(CLONE), "--json")
    assert result.code == 0
    by_name = {m["name"]: m for m in result.json()}
    assert by_name[MODEL_B.name]["manifest"]["model"] == "model-b"
    assert by_name[MODEL_B.name]["manifest"]["provider"] == "acme"
    assert sorted(by_name[MODEL_A.name]["tasks"]) == ["pkb/1_all_reduce", "pkb/2_all_gather", "pkb/3_row_stats"]


@pytest.mark.timeout(600)
def test_blocks_are_not_sized_by_the_baseline_runners_first_call(cli, tmp_db: Path, tmp_path: Path, pkb_env) -> None:
    # A reference whose first call in a process takes 1.5 s (a lazy set-up, as a library handle or
    # a communicator is on a GPU). The baseline's runner is new per item and the block size is read
    # from its warm-up block: a block holding that first call read ~190 ms a call and asked for one
    # call a block. Its first call is made untimed beforehand, so the blocks hold several calls.
    import json
    import shutil

    from pkb_tui.store import Store

    pkb_env.setenv("PKB_CACHE_DIR", str(tmp_path / "cache"))
    clone = tmp_path / "clone"
    shutil.copytree(CLONE, clone)
    # One rank and no collective: a warm call is tens of us, so a warm-up block of 8 reads far below
    # the ~5 ms a block is sized for even on a loaded box (with gloo at two ranks it did not always).
    (clone / "reference" / "4_slow_first.py").write_text(
        "import time\n\nimport torch\n\n_FIRST = [True]\n\n\n"
        "def solution(tensor: torch.Tensor) -> torch.Tensor:\n"
        "    if _FIRST:\n"
        "        _FIRST.clear()\n"
        "        time.sleep(1.5)\n"
        "    return tensor * 2\n")
    inputs = clone / "utils" / "input_output_tensors.py"
    inputs.write_text(inputs.read_text().replace("if problem_id == 1:", "if problem_id in (1, 4):"))
    result = cli("run", "--pkb-root", str(clone), "--task", "pkb/4", "--model", "baseline", "--world-size", "1",
                 "--mode", "cpu", "--dtype", "float32", "--trials", "1", "--warmup", "8", "--no-profile", "--json")
    assert result.code == 0, result.out + result.err
    (run,) = result.json()["runs"]
    assert run["status"] == "passed", run
    with Store(tmp_db) as store:
        batch_dir = Path(store.run(run["id"])["log_path"]).parent
    timings = [json.loads(line.partition(" ")[2]) for path in sorted(batch_dir.glob("events.*.jsonl"))
               for line in path.read_text().splitlines()]
    copies = {e["variant"]: e["input_copies"] for e in timings if e["event"] == "timing"}
    assert set(copies) == {"baseline", "candidate"}, copies
    assert min(copies.values()) >= 2, copies  # one call a block, had the first call sized it
