"""Shared fixtures: a fresh database per test, the CLI called in-process, fixture solution sets."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

FIXTURE_SOLUTIONS = Path(__file__).parent / "fixtures" / "solutions"

# Rank processes on a 2-core machine: one thread each, or they fight over the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def tmp_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = tmp_path / "runs.db"
    monkeypatch.setenv("PKB_DB", str(db))
    return db


def fixture_model(name: str) -> str:
    return str(FIXTURE_SOLUTIONS / name)


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Call `pkb-tui ARGS...` in this process; returns exit code, stdout and stderr."""
    from pkb_tui.cli import main

    def run(*args: str) -> CliResult:
        out = io.StringIO()
        code = main(list(args), out=out)
        captured = capsys.readouterr()
        return CliResult(code, out.getvalue() + captured.out, captured.err)

    return run


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test leaves os.environ as it found it: the CLI called in-process sets PKB_ROOT and
    PYTHONPATH for `--pkb-root`, which would otherwise add a PKB clone's problems to every later
    test's task registry."""
    saved = dict(os.environ)
    yield
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
