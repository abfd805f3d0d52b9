"""A ParallelKernelBench clone's problems and candidate folders, read from the fixture clone
(tests/fixtures/pkb_clone, written for these tests in PKB's layout). No torchrun here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pkb_tui.engine.compare import VERDICTS_DIFFER, compare_outputs, pkb_allclose
from pkb_tui.errors import PkbError

CLONE = Path(__file__).parent / "fixtures" / "pkb_clone"
MODEL_A = CLONE / "solutions_reference_bf16_none_acme_model-a"
MODEL_B = CLONE / "solutions_reference_bf16_none_acme_model-b"
PKB_ENV = ("PKB_ROOT", "PYTHONPATH", "PKB_BACKEND", "PKB_SHAPE", "PKB_FRESH_SEEDS", "PKB_TOLERANCE")


@pytest.fixture
def pkb_env(monkeypatch: pytest.MonkeyPatch):
    """Whatever activate() and the CLI put in the environment is undone after the test."""
    for name in PKB_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def clone(pkb_env) -> Path:
    from pkb_tui.pkb.tasks import activate

    return activate(CLONE)


def _fixture_inputs(rank: int, world_size: int, problem: int, shape, dtype, trial: int):
    spec = importlib.util.spec_from_file_location("fixture_inputs", CLONE / "utils" / "input_output_tensors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.create_input_tensor(rank, world_size, problem, shape, dtype, trial=trial, device="cpu")


def test_every_reference_problem_is_a_task_with_its_id_family_and_pkb_defaults(clone: Path) -> None:
    from tasks import all_tasks, load_task

    tasks = {tid: t for tid, t in all_tasks().items() if tid.startswith("pkb/")}
    assert sorted(tasks) == ["pkb/1_all_reduce", "pkb/2_all_gather", "pkb/3_row_stats"]
    assert tasks["pkb/1_all_reduce"].spec.family == "pkb-collective"
    assert tasks["pkb/3_row_stats"].spec.family == "pkb-other"  # a name no rule knows
    task = load_task("pkb/2_all_gather")
    assert task.spec.dtypes[0] == "bfloat16" and task.spec.sizes["default"] == {"m": 1024, "n": 1024}
    assert Path(task.module.__file__) == clone / "reference" / "2_all_gather.py"
    assert "all_reduce" in all_tasks()  # the project's own tasks are still there


def test_without_a_clone_a_pkb_task_id_says_how_to_name_one(pkb_env) -> None:
    from tasks import load_task

    with pytest.raises(PkbError, match="--pkb-root"):
        load_task("pkb/1_all_reduce")


def test_a_folder_that_is_no_clone_is_refused_with_what_to_fix(tmp_path: Path, pkb_env) -> None:
    from pkb_tui.pkb.tasks import activate

    with pytest.raises(PkbError, match="no reference/ folder"):
        activate(tmp_path)


def test_families_follow_pkb_problem_names_and_the_registry_accepts_only_known_pkb_families() -> None:
    from pkb_tui.pkb.tasks import family_for
    from tasks.base import family_known

    names = {"allreduce": "collective", "reducescatter": "collective", "ulysses_attention_e2e": "sequence",
             "ring_attention_tp": "context", "moe_ep_wide": "expert", "zero1_optimizer_shard": "fsdp",
             "ddp": "data", "gnn_feature_exchange_all2all": "graph", "vocab_parallel_cross_entropy_loss": "vocab",
             "physicsnemo_distributed_rfft": "scientific", "gemm_reducescatter": "tensor", "distributed_sample_sort": "other"}
    assert {name: family_for(name) for name in names} == {name: f"pkb-{fam}" for name, fam in names.items()}
    assert family_known("pkb-collective") and family_known("collective")
    assert not family_known("pkb-nonsense") and not family_known("nonsense")


def test_inputs_come_from_the_clones_input_maker_with_pkb_trial_seeds(clone: Path) -> None:
    from tasks import load_task

    task = load_task("pkb/1_all_reduce")
    for trial in (0, 2):  # whatever the judge's (secret) seed: PKB's trial t gets PKB's inputs for t
        ctx = task.context(rank=1, world_size=2, dtype="bfloat16", size="small", seed=12345 + trial, trial=trial)
        (made,) = task.make_inputs(ctx)
        (expected,) = _fixture_inputs(1, 2, 1, (256, 256), torch.bfloat16, trial)
        assert torch.equal(made, expected), f"trial {trial}"
    # a phase that is no trial (timing) gets inputs from its own seed, not trial 0's
    timing = task.make_inputs(task.context(rank=1, world_size=2, dtype="bfloat16", size="small", seed=777))
    assert not torch.equal(timing[0], _fixture_inputs(1, 2, 1, (256, 256), torch.bfloat16, 0)[0])


def test_fresh_seeds_and_the_base_shape_override(clone: Path, pkb_env) -> None:
    from tasks import load_task

    task = load_task("pkb/1_all_reduce")
    pkb_env.setenv("PKB_FRESH_SEEDS", "1")
    pkb_env.setenv("PKB_SHAPE", "64,32")
    first = task.make_inputs(task.context(rank=0, world_size=2, dtype="float32", size="small", seed=11, trial=0))[0]
    second = task.make_inputs(task.context(rank=0, world_size=2, dtype="float32", size="small", seed=12, trial=0))[0]
    assert first.shape == (64, 32)
    assert not torch.equal(first, second)  # our seed decides, not PKB's trial index
    assert not torch.equal(first, _fixture_inputs(0, 2, 1, (64, 32), torch.float32, 0)[0])


def test_the_baseline_is_the_reference_solution_imported_on_first_call(clone: Path) -> None:
    from tasks import load_task

    task = load_task("pkb/3_row_stats")
    wrapper = task.baseline
    assert getattr(wrapper, "__name__", None) != "solution"  # listing imported no reference
    fn = wrapper.load()
    assert fn.__name__ == "solution" and fn.__module__ == "pkb_reference_3_row_stats"


def test_candidate_folders_give_the_model_name_provider_backend_and_files(clone: Path, pkb_env, tmp_path: Path) -> None:
    from pkb_tui.engine.solutions import find_model, list_models
    from pkb_tui.pkb.solutions import parse_folder_name

    model = find_model(str(MODEL_A))
    assert model.name == MODEL_A.name
    assert model.manifest["model"] == "model-a" and model.manifest["provider"] == "acme"
    assert model.manifest["backend"] == "reference" and model.manifest["precision"] == "bf16"
    assert model.solution_file("pkb/1_all_reduce") == MODEL_A / "1_all_reduce_reference.py"
    assert model.covers(["pkb/1_all_reduce", "pkb/2_all_gather", "pkb/3_row_stats", "all_reduce"]) == [
        "pkb/1_all_reduce", "pkb/2_all_gather", "pkb/3_row_stats"]
    assert {MODEL_A.name, MODEL_B.name} <= {m.name for m in list_models()}  # the clone's generator folders

    assert parse_folder_name("solutions_cuda_bf16_h100_8_together_zai-org_GLM-5.1") == {
        "backend": "cuda", "precision": "bf16", "hardware": "h100_8", "provider": "together", "model": "zai-org_GLM-5.1"}
    assert parse_folder_name("my_kernels") is None

    # any folder of <stem>_<backend>.py files; several backends need --backend
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("1_all_reduce_cuda.py", "1_all_reduce_triton.py", "2_all_gather_triton.py"):
        (mixed / name).write_text("def solution(x):\n    return x\n")
    with pytest.raises(PkbError, match="--backend"):
        find_model(str(mixed))
    pkb_env.setenv("PKB_BACKEND", "triton")
    chosen = find_model(str(mixed))
    assert chosen.name == "mixed" and chosen.manifest["backend"] == "triton"
    assert chosen.solution_file("pkb/2_all_gather") == mixed / "2_all_gather_triton.py"
    # a problem renamed in the clone keeps its candidate (matched by number)
    assert chosen.solution_file("pkb/1_allreduce") == mixed / "1_all_reduce_triton.py"


def test_problems_that_need_other_world_sizes_are_listed_with_the_reason(tmp_path: Path, pkb_env) -> None:
    from pkb_tui.cli import _expand_tasks
    from pkb_tui.pkb.tasks import activate

    clone = tmp_path / "clone"
    (clone / "reference").mkdir(parents=True)
    (clone / "utils").mkdir()
    (clone / "utils" / "input_output_tensors.py").write_text((CLONE / "utils" / "input_output_tensors.py").read_text())
    for name in ("1_allreduce.py", "54_ring_attention.py"):
        (clone / "reference" / name).write_text("def solution(x):\n    return x\n")
    activate(clone)
    ids, skipped = _expand_tasks(["pkb/all"], 3, "cpu", None, "small")
    assert ids == ["pkb/1_allreduce"]
    assert len(skipped) == 1 and "pkb/54_ring_attention" in skipped[0] and "1, 2, 4, 8" in skipped[0]
    assert _expand_tasks(["pkb/1-8"], 2, "cpu", None, "small") == (["pkb/1_allreduce"], [])


def test_pkb_allclose_and_the_second_verdict_when_the_two_checks_disagree() -> None:
    from pkb_tui.pkb.tasks import PKB_TOLERANCE
    from tasks.base import Tolerance

    ref = {"sum": torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "n": 2}
    as_float = {"sum": torch.tensor([1.0, 2.0]), "n": 2}
    assert pkb_allclose(as_float, ref, 1e-2, 1e-2)  # PKB compares float copies: no dtype check
    assert not pkb_allclose({"sum": ref["sum"], "n": 3}, ref, 1e-2, 1e-2)

    ours_judging = Tolerance(1e-2, 1e-2, second=PKB_TOLERANCE)
    result = compare_outputs(as_float, ref, ours_judging)
    assert not result.correct and VERDICTS_DIFFER in result.message and "PKB's allclose" in result.message
    assert compare_outputs(ref, ref, ours_judging).message is None  # agreement: no note

    pkb_judging = Tolerance(1e-2, 1e-2, pkb_style=True, second=Tolerance(1e-2, 1e-2))
    result = compare_outputs(as_float, ref, pkb_judging)
    assert result.correct and VERDICTS_DIFFER in result.message and "pkb-tui's check" in result.message
    off = {"sum": torch.tensor([1.0, 2.5], dtype=torch.bfloat16), "n": 2}
    assert not compare_outputs(off, ref, pkb_judging).correct


def test_the_dashboard_catalogue_lists_pkb_problems_beside_the_own_tasks(clone: Path) -> None:
    from pkb_tui.app.catalog import load_catalog

    catalog = load_catalog()
    ids = {t.id for t in catalog.tasks}
    assert {"pkb/1_all_reduce", "pkb/3_row_stats", "all_reduce"} <= ids
    assert {"pkb-collective", "pkb-other", "collective"} <= set(catalog.families)  # the family filter offers them
    model_a = next(m for m in catalog.models if m.name == MODEL_A.name)
    assert model_a.covered == 3 and model_a.notes == "acme · model-a · reference"


def test_the_result_screen_labels_a_pkb_problems_traffic_as_measured() -> None:
    from pkb_tui.app.screens.result import comparison_table

    run = {"task_id": "pkb/1_all_reduce", "results": {"baseline": {"correct": 1}, "candidate": {"correct": 1}}}
    from rich.console import Console

    console = Console(width=160, record=True)
    console.print(comparison_table(run))
    assert "traffic measured from the baseline's calls" in console.export_text()


def test_the_judge_gives_pkb_problems_both_verdicts() -> None:
    from pkb_tui.engine.compare import judge_outputs
    from tasks.base import OutputTolerance

    truth = torch.linspace(1.0, 2.0, 64, dtype=torch.float64)
    expected = truth.float()
    off = expected * 1.001  # 0.1%: inside PKB's rtol 1e-2, far outside the per-output rule
    second = judge_outputs(off, expected, truth, {"*": OutputTolerance(pkb="second")})
    assert not second.correct and "verdicts differ: PKB's allclose(atol=0.01, rtol=0.01) passes" in second.message
    judged = judge_outputs(off, expected, truth, {"*": OutputTolerance(pkb="judge")})
    assert judged.correct and "verdicts differ: pkb-tui's check" in judged.message and "fails" in judged.message
    assert judge_outputs(expected.clone(), expected, truth, {"*": OutputTolerance(pkb="second")}).message is None
