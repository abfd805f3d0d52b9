"""The Generate screen: a generation started from the form against a real HTTP endpoint on
127.0.0.1, its requests listed as they land, a reply and its code viewable, an evaluation opening
the Result screen; and a snapshot of the screen on a fixed generation run in a real SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pkb_tui.app import PkbApp
from pkb_tui.app.screens.generate import GenerateScreen, ReplyScreen
from pkb_tui.app.screens.result import ResultScreen
from pkb_tui.app.widgets.row_list import RowList
from pkb_tui.store import Store
from tests._llm_server import LlmServer, Scripted, models_toml
from tests.app_fixtures import app_config, seed_runs

CODE_REPLY = "Ring version:\n```python\nimport torch\n\n\ndef solution(x):\n    return x.clone()\n```\n"


def seed_generation(db: Path, run_ids: list[int]) -> int:
    """A finished generation: all_reduce x 2 samples x 2 rounds, linked to two known runs, and one reply
    without code; fixed figures so the snapshot is the same everywhere."""
    with Store(db) as store:
        gen = store.create_gen_run({
            "endpoint": "local-sonnet", "api": "anthropic", "base_url": "http://127.0.0.1:9", "model_id": "test-model-1",
            "model_slug": "test-model-1", "endpoint_config": {"api_key_env": "PKB_TEST_KEY"}, "status": "finished",
            "request": {"tasks": ["all_reduce", "all_gather"], "samples": 2, "rounds": 1, "world_size": 2, "mode": "cpu",
                        "size": "small", "dtype": "float32"},
            "out_dir": "solutions/gen/test-model-1/1", "template_version": "v1", "created_at": 1_767_225_600.0,
        })
        store.add_prompt("p0", "system+task.v1", '{"system": "s", "messages": []}')
        plan = [  # (task, sample, round, reply text, candidate status, run id)
            ("all_reduce", 0, 0, CODE_REPLY, "evaluated", run_ids[0]),
            ("all_reduce", 0, 1, CODE_REPLY.replace("x.clone()", "x * 2"), "evaluated", run_ids[1]),
            ("all_reduce", 1, 0, "Use a ring.", "no_code", None),
            ("all_gather", 0, 0, CODE_REPLY, "evaluated", run_ids[2]),
        ]
        for task, sample, round_index, text, status, run_id in plan:
            request_id = store.ensure_gen_request(gen, task, sample, round_index, "p0")
            store.add_gen_reply(request_id, {"text": text, "finish_reason": "end_turn", "resolved_model": "test-model-1-2026",
                                             "prompt_tokens": 1500, "completion_tokens": 320 + 10 * round_index,
                                             "latency_us": 4.2e6, "cost_usd": 0.0093, "received_at": 1_767_225_700.0})
            fields = {"request_id": request_id, "gen_run_id": gen, "task_id": task, "sample": sample, "round": round_index,
                      "extraction": "block 1 of 1" if status != "no_code" else "no code in reply", "status": status,
                      "run_id": run_id, "created_at": 1_767_225_700.0}
            if status != "no_code":
                fields["source_hash"] = store.add_source(f"s{sample}r{round_index}/{task}.py", text.split("```python\n")[1][:-4])
                fields["path"] = f"solutions/gen/test-model-1/1/s{sample:02d}r{round_index}/{task}.py"
            else:
                fields["detail"] = "no code in reply"
            store.add_gen_candidate(fields)
    return gen


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PKB_TEST_KEY", "k")
    models_toml(tmp_path / "models.toml", "http://127.0.0.1:9", name="local-sonnet", api="anthropic")
    monkeypatch.setenv("PKB_MODELS_CONFIG", "models.toml")  # relative: the same text on every machine
    db = tmp_path / "runs.db"
    run_ids = seed_runs(db)
    seed_generation(db, run_ids)
    return db, run_ids


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.3)


def test_generate_screen_snapshot(seeded, snap_compare):
    db, _ = seeded
    assert snap_compare(PkbApp(config=app_config(db)), press=["G"], run_before=settle)


def test_a_reply_and_its_code_are_shown_and_its_evaluation_opens_the_result(seeded) -> None:
    asyncio.run(_reply_and_result(*seeded))


async def _reply_and_result(db: Path, run_ids: list[int]) -> None:
    app = PkbApp(config=app_config(db))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("G")
        await settle(pilot)
        screen = app.screen
        assert isinstance(screen, GenerateScreen)
        table = screen.query_one("#gen-requests", RowList)
        assert [r[0] for r in table.rows] == ["all_gather", "all_reduce", "all_reduce", "all_reduce"]
        assert "best: all_gather" in str(screen.query_one("#gen-best").render())
        table.cursor = 2  # all_reduce sample 0 round 1: evaluated by run_ids[1]
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ReplyScreen)
        shown = " ".join(str(s.render()) for s in app.screen.query("Static"))
        assert "return x * 2" in shown and "Ring version" in shown and "end_turn" in shown
        await pilot.press("o")
        await pilot.pause(0.3)
        assert isinstance(app.screen, ResultScreen) and app.screen.run_id == run_ids[1]


def test_a_generation_started_from_the_form_lists_its_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_started_from_the_form(tmp_path, monkeypatch))


async def _started_from_the_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKB_TEST_KEY", "k")
    replies = [Scripted(text="I would pipeline two rings."), Scripted(text="Still thinking: no code.")]
    with LlmServer(replies) as server:
        monkeypatch.setenv("PKB_MODELS_CONFIG", str(models_toml(tmp_path / "models.toml", server.url, concurrency=1)))
        db = tmp_path / "runs.db"
        app = PkbApp(config=app_config(db, defaults={"gen_out": str(tmp_path), "mode": "cpu"}))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press("G")
            await settle(pilot)
            screen = app.screen
            assert isinstance(screen, GenerateScreen)
            screen.query_one("#gen-samples").value = "1"
            screen.query_one("#gen-rounds").value = "1"
            screen.query_one("#gen-requests", RowList).focus()
            await pilot.press("r")
            await settle(pilot)
            await pilot.pause(0.3)
            table = screen.query_one("#gen-requests", RowList)
            assert [(r[0], r[2], str(r[4])) for r in table.rows] == [("all_reduce", "0", "no code"), ("all_reduce", "1", "no code")]
            assert all(r[3].isdigit() for r in table.rows)  # the usage's completion tokens, once the reply landed
            assert "finished" in str(screen.query_one("#gen-title").render())
            await pilot.press("o")  # nothing was evaluated: said so, nothing opens
            await pilot.pause(0.1)
            assert isinstance(app.screen, GenerateScreen)
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert "I would pipeline two rings." in " ".join(str(s.render()) for s in app.screen.query("Static"))
    assert len(server.requests) == 2
    assert not (tmp_path / "solutions" / "gen" / "test-model-1" / "1").exists() or not any(
        (tmp_path / "solutions" / "gen" / "test-model-1" / "1").rglob("*.py"))


def test_history_leaderboard_ranks_the_endpoint_by_pass_at_k(seeded) -> None:
    asyncio.run(_leaderboard(*seeded))


async def _leaderboard(db: Path, run_ids: list[int]) -> None:
    from pkb_tui.app.widgets.gen_board import GenBoard

    app = PkbApp(config=app_config(db))
    async with app.run_test(size=(110, 40)) as pilot:
        await pilot.press("h")
        await settle(pilot)
        assert not app.screen.query(GenBoard)
        await pilot.press("b")
        await settle(pilot)
        board = app.screen.query_one(GenBoard)
        line = [ln for ln in str(board.query_one("#gen-board-table").render()).splitlines() if ln.startswith("local-sonnet")][0]
        # all_reduce: 2 samples, 1 right (2.00x); all_gather: 1 sample, right (1.20x): means over the 2 tasks.
        assert line.split() == ["local-sonnet", "2", "3", "75%", "75%", "1", "75%", "25%", "test-model-1"]
        # The per-sample solution sets do not crowd the per-model leaderboard.
        models = [row[0] for row in app.screen.query_one("#leaderboard", RowList).rows]
        assert not any(m.startswith("gen:") for m in models)
        await pilot.press("b")
        await pilot.pause(0.1)
        assert not board.display


def test_leaderboard_with_endpoints_snapshot(seeded, snap_compare):
    db, _ = seeded
    assert snap_compare(PkbApp(config=app_config(db)), press=["h", "b"], run_before=settle, terminal_size=(100, 40))


def test_a_request_in_flight_shows_its_streamed_token_count() -> None:
    from pkb_tui.app.screens.generate import request_row

    row = {"id": 7, "task_id": "all_reduce", "sample": 1, "round": 0, "status": "sent", "completion_tokens": None}
    cells = request_row(row, streamed=42)
    assert cells[3] == "~42" and str(cells[4]) == "sending"
    landed = request_row({**row, "status": "replied", "completion_tokens": 512, "candidate_status": "pending",
                          "cost_usd": 0.0081}, streamed=42)
    assert landed[3] == "512" and str(landed[4]) == "to run" and "$0.0081" in str(landed[7])
