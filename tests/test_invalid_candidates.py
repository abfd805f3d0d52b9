"""A bad candidate file is a failed run with its reason, not a usage error: the batch goes on.

Generated solution sets are full of files without `solution`, with syntax errors, wrong signatures
or nothing at all; one of them must not refuse a batch of 17 models. And a model is named by its
folder: a manifest may add a label but cannot take another model's name (and so its leaderboard
entry).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pkb_tui.engine.launcher import Launcher
from pkb_tui.engine.request import RunRequest
from pkb_tui.engine.solutions import find_model
from pkb_tui.store import Store
from tests.conftest import fixture_model

WRONG_ANSWER = "import torch\n\ndef solution(x):\n    return torch.zeros_like(x)\n"


@pytest.fixture
def bad_sets(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Model folder -> (path, the words its failed run must give)."""
    empty = tmp_path / "empty-file"
    empty.mkdir()
    (empty / "all_reduce.py").write_text("\n   \n")
    return {
        "broken-syntax": (fixture_model("broken-syntax"), "syntax error at line 1"),
        "no-solution": (fixture_model("no-solution"), "defines no `solution` function"),
        "bad-signature": (fixture_model("bad-signature"), "takes 3 argument(s) but the all_reduce baseline takes 1"),
        "empty-file": (str(empty), "is empty"),
    }


def test_plan_marks_bad_files_instead_of_refusing_the_batch(tmp_db: Path, bad_sets) -> None:
    request = RunRequest(tasks=["all_reduce"], models=["baseline", *(path for path, _ in bad_sets.values())], mode="cpu")
    items = Launcher(tmp_db).plan(request)
    by_model = {item.model: item for item in items}
    assert by_model["baseline"].invalid_reason is None
    for name, (_, words) in bad_sets.items():
        assert words in (by_model[name].invalid_reason or ""), name


def test_manifest_adds_a_label_but_never_another_models_name(tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    (impostor / "manifest.json").write_text(json.dumps({"model": "torch-p2p", "provider": "someone"}))
    model = find_model(str(impostor))
    assert model.name == "impostor" and model.label == "torch-p2p"
    assert model.display_name == "impostor (torch-p2p)"
    named_baseline = tmp_path / "baseline"
    named_baseline.mkdir()
    assert find_model(str(named_baseline)).name != "baseline"  # the built-in baseline's runs stay its own


def test_a_batch_with_bad_files_runs_the_rest_and_exits_1(cli, tmp_db: Path, tmp_path: Path, bad_sets) -> None:
    """One launch: torch-p2p (right), an impostor whose manifest says it is torch-p2p (wrong
    answers) and four bad files. The bad files are failed runs with their reasons, never launched;
    the impostor is recorded under its own folder name; torch-p2p keeps its leaderboard entry."""
    impostor = tmp_path / "impostor"
    impostor.mkdir()
    (impostor / "manifest.json").write_text(json.dumps({"model": "torch-p2p"}))
    (impostor / "all_reduce.py").write_text(WRONG_ANSWER)
    models = ",".join(["torch-p2p", str(impostor), *(path for path, _ in bad_sets.values())])
    result = cli("run", "--task", "all_reduce", "--model", models, "--mode", "cpu", "--trials", "1",
                 "--no-timing", "--no-profile")
    assert result.code == 1, result.err

    with Store(tmp_db) as store:
        runs = {run["model"]: run for run in store.runs()}
        assert runs["torch-p2p"]["status"] == "passed"
        assert runs["impostor"]["status"] == "failed"
        for name, (_, words) in bad_sets.items():
            assert runs[name]["status"] == "failed", name
            assert words in (runs[name]["status_detail"] or ""), runs[name]["status_detail"]
        board = {row["model"]: row for row in store.leaderboard(task_ids=["all_reduce"])}
    assert board["torch-p2p"]["correct"] == 1
    assert "impostor" in board and board["impostor"]["correct"] == 0
