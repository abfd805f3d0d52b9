"""Code extraction rules, pass@k / fast_p@k on fixtures with known counts, prompts from the task
module, and the generation tables in a real SQLite file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pkb_tui.generate.extract import extract_code
from pkb_tui.generate.metrics import fast_p_curve, outcomes_from_candidates, pass_at_k, suite_mean, task_metrics
from pkb_tui.generate.prompts import TEMPLATE_VERSION, load_hardware, prompt_hash, task_prompt
from pkb_tui.store import Store
from pkb_tui.store.schema import SCHEMA_VERSION
from tasks.base import load_task


# ---------------------------------------------------------------- extraction
def test_the_last_block_defining_solution_wins_over_a_draft() -> None:
    reply = ("Draft:\n```python\ndef solution(x):\n    return x\n```\nOops, fixed:\n"
             "```py\ndef solution(x):\n    return x + 1\n```\n")
    extracted = extract_code(reply)
    assert extracted.code == "def solution(x):\n    return x + 1\n"
    assert "the last of 2" in extracted.how


def test_helper_blocks_the_solution_uses_are_joined_in_reply_order_and_others_left_out() -> None:
    reply = ("```python\nimport torch\nimport torch.distributed as dist\n```\n"
             "```python\nUNUSED = 1\n```\n"
             "```cuda\n__global__ void k() {}\n```\n"
             "```python\ndef _ring(x):\n    return torch.roll(x, 1)\n```\n"
             "```python\ndef solution(x):\n    dist.barrier()\n    return _ring(x)\n```\n")
    extracted = extract_code(reply)
    assert extracted.used_blocks == [0, 3, 4]
    assert extracted.code is not None
    assert extracted.code.index("import torch") < extracted.code.index("def _ring") < extracted.code.index("def solution")
    assert "UNUSED" not in extracted.code and "__global__" not in extracted.code
    compile(extracted.code, "candidate", "exec")


def test_a_reply_that_is_only_code_and_one_with_none() -> None:
    assert extract_code("import torch\n\ndef solution(x):\n    return x\n").how.startswith("the whole reply")
    assert extract_code("Use NCCL.").code is None
    only_shell = extract_code("```bash\npip install triton\n```")
    assert only_shell.code is None and "none defines solution" in only_shell.how
    # An unlabelled fence with ~~~ counts as Python when it parses.
    assert extract_code("~~~\ndef solution(x):\n    return x\n~~~").code == "def solution(x):\n    return x\n"


def test_a_block_with_a_syntax_error_is_kept_so_the_evaluation_reports_it() -> None:
    extracted = extract_code("```python\ndef solution(x):\n    return x +\n```\n")
    assert extracted.code is not None and "syntax error" in extracted.how and not extracted.unterminated


# ---------------------------------------------------------------- pass@k
@pytest.mark.parametrize("n,c,k,expected", [
    (10, 0, 1, 0.0), (10, 10, 1, 1.0), (10, 3, 1, 0.3), (10, 3, 2, 1 - (7 * 6) / (10 * 9)),
    (5, 2, 5, 1.0), (4, 1, 2, 0.5), (3, 2, 3, 1.0), (200, 13, 10, 1 - math.comb(187, 10) / math.comb(200, 10)),
])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_is_undefined_past_n() -> None:
    assert pass_at_k(3, 1, 4) is None
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_pass_and_fast_p_per_task_and_suite_on_known_counts() -> None:
    # Task A: 4 samples; sample 0 right at round 1 (2.0x), sample 1 right at round 0 (0.8x), 2 and 3 never.
    # Task B: 4 samples, all right (1.2x, 1.6x, 0.9x, 3.0x) at round 0.
    rows = [
        {"task_id": "A", "sample": 0, "round": 0, "correct": 0, "speedup": None},
        {"task_id": "A", "sample": 0, "round": 1, "correct": 1, "speedup": 2.0},
        {"task_id": "A", "sample": 1, "round": 0, "correct": 1, "speedup": 0.8},
        {"task_id": "A", "sample": 2, "round": 0, "correct": 0, "speedup": 5.0},  # wrong: its speed counts for nothing
        {"task_id": "A", "sample": 3, "round": 0, "correct": 0, "speedup": None},
    ] + [{"task_id": "B", "sample": s, "round": 0, "correct": 1, "speedup": v} for s, v in enumerate((1.2, 1.6, 0.9, 3.0))]
    per_task = task_metrics(outcomes_from_candidates(rows), ks=(1, 2, 4), ps=(1.0, 1.5))
    a, b = per_task["A"], per_task["B"]
    assert (a.n, a.correct, a.best_speedup) == (4, 2, 2.0)
    assert a.pass_at == {1: 0.5, 2: pytest.approx(1 - 1 / 6), 4: 1.0}
    assert a.fast_at["1"][1] == 0.25 and a.fast_at["1.5"][2] == pytest.approx(0.5)
    assert b.pass_at[1] == 1.0 and b.fast_at["1"][1] == 0.75 and b.fast_at["1.5"][1] == 0.5
    assert suite_mean(per_task, 1) == pytest.approx(0.75)
    assert suite_mean(per_task, 1, 1.0) == pytest.approx(0.5)
    # Cut at round 0, sample 0 of A was not yet right.
    first_round = task_metrics(outcomes_from_candidates(rows, up_to_round=0), ks=(1,))
    assert first_round["A"].correct == 1
    curve = dict(fast_p_curve(outcomes_from_candidates(rows), [0.0, 1.0, 2.5]))
    assert curve == {0.0: 6 / 8, 1.0: 4 / 8, 2.5: 1 / 8}



def test_fast_p_counts_a_sample_by_its_interval_and_the_noise_floor_not_its_point() -> None:
    # All correct, points 1.3x. Sample 0: interval [1.2, 1.4], no floor -> faster than 1.
    # Sample 1: interval [0.97, 1.6] contains 1 -> not. Sample 2: [1.02, 1.5] but the host's floor is
    # 3%: widened it reaches 0.99 -> not. Sample 3: no interval measured (an old row) -> its point.
    # Sample 4: first round's interval contains 1, the second round's clears it -> faster.
    rows = [
        {"task_id": "T", "sample": 0, "round": 0, "correct": 1, "speedup": 1.3, "speedup_low": 1.2, "rounds": 8},
        {"task_id": "T", "sample": 1, "round": 0, "correct": 1, "speedup": 1.3, "speedup_low": 0.97, "rounds": 8},
        {"task_id": "T", "sample": 2, "round": 0, "correct": 1, "speedup": 1.3, "speedup_low": 1.02, "rounds": 8,
         "noise_floor_fraction": 0.03},
        {"task_id": "T", "sample": 3, "round": 0, "correct": 1, "speedup": 1.3},
        {"task_id": "T", "sample": 4, "round": 0, "correct": 1, "speedup": 1.5, "speedup_low": 0.9, "rounds": 8},
        {"task_id": "T", "sample": 4, "round": 1, "correct": 1, "speedup": 1.2, "speedup_low": 1.1, "rounds": 8},
    ]
    outcomes = outcomes_from_candidates(rows)
    assert [o.fast(1.0) for o in outcomes] == [True, False, False, True, True]
    assert task_metrics(outcomes, ks=(1,), ps=(1.0,))["T"].fast_at["1"][1] == pytest.approx(3 / 5)
    assert dict(fast_p_curve(outcomes, [1.0]))[1.0] == pytest.approx(3 / 5)
    assert outcomes[4].speedup == 1.5  # the best point is still reported as the sample's speedup

# ---------------------------------------------------------------- prompts
def test_the_prompt_is_built_from_the_task_module_and_the_hardware(tmp_path: Path) -> None:
    with Store(tmp_path / "runs.db") as store:
        host = {"hostname": "box", "gpu_model": "NVIDIA H200", "gpu_count": 8, "torch_version": "2.11"}
        plain = load_hardware(store, "nccl", 8, host=host)
        prompt = task_prompt(load_task("all_reduce"), world_size=8, mode="nccl", size="small", dtype="bfloat16",
                             hardware=plain)
        text = prompt.messages[0]["content"]
        assert "def baseline(x: torch.Tensor)" in text and "solution(x: torch.Tensor) -> torch.Tensor" in text
        assert "8 x NVIDIA H200" in text and "450 GB/s" in text and "Not calibrated" in text
        assert "Inputs on rank 0: arg 0: (10007,) bfloat16" in text and "atol" in text and "pkb_tui.symheap" in text
        assert "Floor:" in text and "World size 8, mode `nccl`" in text
        assert prompt.sha256 == prompt_hash(prompt.system, prompt.messages) and len(prompt.sha256) == 64
        assert prompt.template == f"system+task.{TEMPLATE_VERSION}"
        # After `calibrate`, the measured link figure is what the prompt says, and so the hash changes.
        host_id = store.upsert_host(host)
        store.add_calibration(host_id, [{"kind": "allreduce_busbw", "bandwidth_gbps": 377.0}])
        calibrated = task_prompt(load_task("all_reduce"), world_size=8, mode="nccl", size="small", dtype="bfloat16",
                                 hardware=load_hardware(store, "nccl", 8, host=host))
        assert "377 GB/s" in calibrated.messages[0]["content"] and "calibrated" in calibrated.messages[0]["content"]
        assert calibrated.sha256 != prompt.sha256


# ---------------------------------------------------------------- store
def test_the_generation_tables_keep_a_reply_once_and_recover_a_dead_run(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with Store(db) as store:
        assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        gen = store.create_gen_run({"endpoint": "e", "api": "openai", "base_url": "http://127.0.0.1:1", "model_id": "m",
                                    "model_slug": "m", "endpoint_config": {"api_key_env": "K"}, "request": {"samples": 2},
                                    "out_dir": "/x", "template_version": "v1", "launcher_pid": 2 ** 22 + 12345})
        store.add_prompt("h", "t", "{}")
        first = store.ensure_gen_request(gen, "all_reduce", 0, 0, "h")
        assert store.ensure_gen_request(gen, "all_reduce", 0, 0, "h") == first  # a resume finds the same row
        store.add_gen_reply(first, {"text": "raw", "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 4})
        row = store.gen_requests(gen)[0]
        assert row["status"] == "replied" and row["completion_tokens"] == 4 and row["reply_chars"] == 3
    with Store(db) as store:
        assert store.recover_gen_runs() == 1
        assert store.gen_run(gen)["status"] == "interrupted"
        assert "--resume" in store.gen_run(gen)["status_detail"]


def test_the_digest_of_an_evaluation_gives_verdict_errors_speed_roofline_and_kernels(tmp_path: Path) -> None:
    from pkb_tui.generate.prompts import digest_run
    from tests.app_fixtures import seed_runs

    db = tmp_path / "runs.db"
    run_ids = seed_runs(db)
    with Store(db) as store:
        wrong, right = store.run(run_ids[0]), store.run(run_ids[1])
    wrong_text = digest_run(wrong)
    assert wrong_text.startswith("Verdict: failed") and "WRONG" in wrong_text and "mismatch at 4,096 elements" in wrong_text
    assert "rank 0: max_abs_error 0.001" in wrong_text
    right_text = digest_run(right, log_tail="Traceback: boom")
    assert "speedup 2.00x" in right_text and "p10" in right_text and "Roofline: 84.0%" in right_text
    assert "ring_allreduce_kernel<bf16> [candidate]" in right_text and "Traceback: boom" in right_text


def test_print_prompt_sends_nothing_and_shows_the_hardware(cli, tmp_path: Path) -> None:
    result = cli("--db", str(tmp_path / "runs.db"), "generate", "--task", "all_reduce,broadcast", "--print-prompt",
                 "--mode", "cpu")
    assert result.code == 0, result.err
    assert result.out.count("===== ") == 2 and "## Hardware" in result.out and "Not calibrated" in result.out
