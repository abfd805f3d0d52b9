"""PKB problems as tasks: `reference/<N>_<name>.py` of a clone -> task `pkb/<N>_<name>`.

- baseline: the reference's `solution`, imported on first call (listing 87 problems imports none).
- inputs: the clone's own `utils/input_output_tensors.py: create_input_tensor(rank, world_size,
  problem_id, base_shape, dtype, trial=0, device=None)`, imported from the clone at run time.
  Base shape (M, N) from the named size (small 256x256, default 1024x1024 as PKB, large 8192x8192)
  or from `--m/--n` ($PKB_SHAPE="M,N"); dtype default bfloat16 (the CLI's choice).
- trials: by default PKB's own seeds, i.e. trial t of a run calls create_input_tensor(trial=t), so
  inputs match what run_local.py makes for its trial t (the worker passes t as TaskContext.trial). With `--fresh-seeds` ($PKB_FRESH_SEEDS=1)
  the trial number passed is derived from this project's per-trial seed (--seed, task, trial), so
  every --seed gives other inputs; for the eight collectives, whose PKB inputs are constant fills
  (rank+1) whatever the trial, fresh-seeds mode also replaces floating-point inputs by random values.
- traffic: no hand-written model; the one measured from the baseline's calls (engine/interposer.py).
- tolerance: this project's per-output rule (the judge's, against the float64 truth);
  `--pkb-tolerance` ($PKB_TOLERANCE=pkb) judges with PKB's allclose(atol=1e-2, rtol=1e-2) on the
  baseline's outputs; either way the other verdict is reported when it differs.
- families: from the problem's name (PKB's numbering groups them: 1-8 collectives, ...), so a
  renumbered problem keeps its family; unknown names -> pkb-other.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from pkb_tui.errors import PkbError
from tasks.base import DEFAULT_TOLERANCES, OutputTolerance, Task, TaskContext, TaskSpec, Tolerance, Traffic

PROBLEM_FILE = re.compile(r"^(?P<number>\d+)_(?P<name>[A-Za-z0-9_\-]+)\.py$")
INPUTS_FILE = Path("utils") / "input_output_tensors.py"
PKB_SIZES: dict[str, dict[str, int]] = {
    "small": {"m": 256, "n": 256},  # CPU and tests
    "default": {"m": 1024, "n": 1024},  # PKB's own default (run_local.py --m/--n)
    "large": {"m": 8192, "n": 8192},  # 128 MiB per bfloat16 tensor: bandwidth-bound on NVLink
}
PKB_DTYPES = ("bfloat16", "float32", "float16")
PKB_TOLERANCE = Tolerance(atol=1e-2, rtol=1e-2, pkb_style=True)  # utils/compare_outputs.py's defaults

# Family from the problem's name, first match wins (the names of PKB's 87 problems, grouped as its
# numbering and paper group them). Own-family names as in tasks.base.FAMILIES.
_FAMILY_RULES: tuple[tuple[str, str], ...] = (
    (r"^(all_?reduce|all_?gather|broadcast|reduce|scatter|gather|reduce_?scatter|all_?to_?all)$", "collective"),
    (r"moe|expert|load_balancing", "expert"),
    (r"vocab", "vocab"),
    (r"ulysses|rope|layernorm_backward|reducescatter_fused_rmsnorm", "sequence"),
    (r"ring_attention|hyena|fla_|magi1_cso|_cp\b|_cp_", "context"),
    (r"fsdp|zero\d|fused_adam|fp8_allgather_params|fp8_reduce_scatter_grads", "fsdp"),
    (r"ddp|clip_grad|grad_acc|quantized_grad|importance_sampling|contrastive", "data"),
    (r"gnn|torchrec|kjt", "graph"),
    (r"physicsnemo|torchharmonics|gsplat|deepmd|conv3d|conv2d_boundary|sinkhorn|knn", "scientific"),
    (r"gemm|gemv|^tp_|rms_norm|embedding|muon", "tensor"),
)

# World sizes PKB's input maker accepts, by problem name (facts from its utils/input_output_tensors.py:
# 8 attention heads or 8 experts split over the ranks, tensor-parallel groups of 2).
_WORLD_SIZE_RULES: tuple[tuple[str, tuple[int, ...], str], ...] = (
    (r"^(rope_allgather|ulysses_gather_seq_scatter_heads(_qkv)?|ulysses_gather_heads_scatter_seq|ulysses_attention_e2e"
     r"|ring_attention|ring_attention_backward_dp|moe_pre_all2all|moe_post_all2all)$", (1, 2, 4, 8),
     "PKB's inputs split 8 heads or 8 experts over the ranks"),
    (r"^fla_kimi_delta_attention_cp_tp$", (2, 4, 6, 8), "PKB's inputs build tensor-parallel groups of 2"),
)


# Modes PKB's references cannot run in, by problem name (facts from its reference/ files).
_MODE_RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (r"^allgather$", ("nccl",),
     "its reference all-gathers into a (world_size, M, N) tensor, which NCCL accepts and gloo rejects"),
)


def family_for(name: str) -> str:
    for pattern, family in _FAMILY_RULES:
        if re.search(pattern, name):
            return f"pkb-{family}"
    return "pkb-other"


def activate(root: str | os.PathLike[str]) -> Path:
    """Make a PKB clone the source of pkb/ tasks in this process and in every process it launches:
    $PKB_ROOT names it (tasks.base reads it), and the clone root joins $PYTHONPATH and sys.path so
    candidates' `import utils.cuda_helpers` (and the references' imports) find PKB's helpers."""
    path = Path(root).expanduser().resolve()
    if not (path / "reference").is_dir():
        raise PkbError(f"{path} has no reference/ folder; point --pkb-root at a ParallelKernelBench clone.")
    if not (path / INPUTS_FILE).is_file():
        raise PkbError(f"{path} has no {INPUTS_FILE}; point --pkb-root at a ParallelKernelBench clone.")
    os.environ["PKB_ROOT"] = str(path)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(path) not in parts:
        # last, so this project's own packages win over any same-named module of the clone
        os.environ["PYTHONPATH"] = os.pathsep.join([*parts, str(path)])
    _add_to_sys_path(path)
    return path


def _add_to_sys_path(root: Path) -> None:
    if str(root) not in sys.path:
        sys.path.append(str(root))


_by_root: dict[str, dict[str, Task]] = {}


def pkb_tasks(root: str | os.PathLike[str]) -> dict[str, Task]:
    """Every problem of the clone at ``root`` as a Task, by id (cached per root and process)."""
    key = f"{Path(root).expanduser()}|{tolerance_mode()}"  # the judging tolerance is part of the spec
    if key not in _by_root:
        _by_root[key] = _discover(Path(root).expanduser().resolve())
    return _by_root[key]


def _discover(root: Path) -> dict[str, Task]:
    reference = root / "reference"
    if not reference.is_dir():
        return {}
    found: list[tuple[int, str, Path]] = []
    for file in reference.glob("*.py"):
        match = PROBLEM_FILE.match(file.name)
        if match:
            found.append((int(match["number"]), match["name"], file))
    tasks: dict[str, Task] = {}
    for number, name, file in sorted(found):
        task = _make_task(root, number, name, file)
        tasks[task.id] = task
    return tasks


def _make_task(root: Path, number: int, name: str, file: Path) -> Task:
    stem = f"{number}_{name}"
    task_id = f"pkb/{stem}"
    world_sizes, note = None, ""
    for pattern, sizes, why in _WORLD_SIZE_RULES:
        if re.search(pattern, name):
            world_sizes, note = sizes, why
    modes: tuple[str, ...] = ("nccl", "shared-gpu", "cpu")
    mode_note = ""
    for pattern, allowed, why in _MODE_RULES:
        if re.search(pattern, name):
            modes, mode_note = allowed, why
    spec = TaskSpec(
        id=task_id, title=f"PKB {number}: {name.replace('_', ' ')}", family=family_for(name),
        source=f"ParallelKernelBench reference/{file.name}",
        why=note or "a ParallelKernelBench problem: PyTorch + torch.distributed reference, inputs from its own input maker",
        sizes=PKB_SIZES, dtypes=PKB_DTYPES, tolerances=_tolerances(), world_sizes=world_sizes,
        output_tolerances={"*": OutputTolerance(pkb="judge" if tolerance_mode() == "pkb" else "second")},
        modes=modes, mode_note=mode_note,
    )
    module = ModuleType(f"pkb_reference_{number}")
    module.__file__ = str(file)  # the launcher hashes the baseline's source from here
    task = Task(spec, module, make_inputs=_InputMaker(root, number, task_id, spec.family), baseline=_no_reference,
                reference=_no_reference, traffic=_MeasuredTraffic(root, task_id, file))
    task.baseline = _LazyBaseline(task, root, file)  # needs the task: it puts the real function there
    return task


def _tolerances() -> dict[str, Tolerance]:
    """The judging tolerance per dtype, with the other one attached for the second verdict."""
    pkb_judges = os.environ.get("PKB_TOLERANCE", "") == "pkb"
    out: dict[str, Tolerance] = {}
    for dtype in PKB_DTYPES:
        own = DEFAULT_TOLERANCES[dtype]
        out[dtype] = Tolerance(PKB_TOLERANCE.atol, PKB_TOLERANCE.rtol, pkb_style=True, second=own) if pkb_judges \
            else Tolerance(own.atol, own.rtol, second=PKB_TOLERANCE)
    return out


def tolerance_mode() -> str:
    """Which tolerance judges PKB problems in this process: "pkb" or "pkb-tui" (stored with each run)."""
    return "pkb" if os.environ.get("PKB_TOLERANCE", "") == "pkb" else "pkb-tui"


def _no_reference(inputs_per_rank: list, ctx: TaskContext) -> list:
    raise PkbError("PKB problems have no separate reference maths: their reference solution is the baseline.")


def base_shape(ctx: TaskContext) -> tuple[int, int]:
    """(M, N): $PKB_SHAPE ("M,N", from --m/--n) when set, else the named size's."""
    override = os.environ.get("PKB_SHAPE", "")
    if override:
        m, n = (int(v) for v in override.split(","))
        return m, n
    return int(ctx.params["m"]), int(ctx.params["n"])


def _load_file(root: Path, file: Path, module_name: str) -> ModuleType:
    _add_to_sys_path(root)
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise PkbError(f"Cannot import {file}.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


class _InputMaker:
    """make_inputs(ctx) for one problem: the clone's create_input_tensor, as a picklable object."""

    def __init__(self, root: Path, number: int, task_id: str, family: str) -> None:
        self.root, self.number, self.task_id, self.family = root, number, task_id, family

    def __call__(self, ctx: TaskContext) -> tuple:
        inputs_module = _load_file(self.root, self.root / INPUTS_FILE, f"pkb_clone_inputs_{abs(hash(str(self.root)))}")
        fresh = os.environ.get("PKB_FRESH_SEEDS", "") == "1"
        trial = _fresh_trial(ctx) if fresh else pkb_trial(ctx)
        made = inputs_module.create_input_tensor(
            ctx.rank, ctx.world_size, self.number, base_shape(ctx), ctx.dtype, trial=trial, device=ctx.device,
        )
        inputs = tuple(made) if isinstance(made, (tuple, list)) else (made,)
        if fresh and self.family == "pkb-collective":
            # PKB fills the collectives' inputs with rank+1 whatever the trial: values that hide
            # wrong indexing. Any values are valid inputs of a pure collective.
            inputs = tuple(
                ctx.randn(*t.shape, stream=i, dtype=t.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                for i, t in enumerate(inputs)
            )
        return inputs


def _fresh_trial(ctx: TaskContext) -> int:
    """A PKB trial number from this project's per-trial seed (small enough for PKB's seed formula)."""
    return ctx.seed % (1 << 31)


def pkb_trial(ctx: TaskContext) -> int:
    """PKB's trial number for this call: the trial index the worker passes in the context; phases
    that are no trial (timing, profile) get one derived from their seed."""
    return ctx.trial if ctx.trial is not None else _fresh_trial(ctx)


class _LazyBaseline:
    """The reference's solution, imported on first call; then the task holds the function itself
    (so the timed baseline is the reference's own function, not this wrapper)."""

    def __init__(self, task: Task, root: Path, file: Path) -> None:
        self.task, self.root, self.file = task, root, file

    def load(self):
        module = _load_file(self.root, self.file, f"pkb_reference_{self.file.stem}")
        fn = getattr(module, "solution", None)
        if not callable(fn):
            raise PkbError(f"{self.file} defines no callable `solution`.")
        return fn

    def __call__(self, *args: Any) -> Any:
        fn = self.load()
        self.task.baseline = fn
        return fn(*args)


class _MeasuredTraffic:
    """traffic(ctx): the model measured from the baseline's calls on gloo ranks (cached)."""

    def __init__(self, root: Path, task_id: str, file: Path) -> None:
        self.root, self.task_id, self.file = root, task_id, file

    def __call__(self, ctx: TaskContext) -> Traffic:
        from pkb_tui.engine.interposer import measured_traffic

        per_rank = measured_traffic(
            self.task_id, ctx.world_size, ctx.dtype_name, ctx.size,
            sources=[self.file, self.root / INPUTS_FILE], extra=os.environ.get("PKB_SHAPE", ""),
        )
        return per_rank[ctx.rank]


def expand_selector(selector: str, tasks: dict[str, Task]) -> list[str]:
    """PKB task selectors: "pkb/all", "pkb/3" (by number), "pkb/1-8" (a range), or a full id."""
    if not selector.startswith("pkb/"):
        return [selector]
    rest = selector[len("pkb/"):]
    pkb = {tid: int(tid[4:].split("_", 1)[0]) for tid in tasks if tid.startswith("pkb/")}
    if rest == "all":
        return list(pkb)
    range_match = re.fullmatch(r"(\d+)(?:-(\d+))?", rest)
    if range_match:
        low = int(range_match[1])
        high = int(range_match[2] or low)
        chosen = [tid for tid, number in sorted(pkb.items(), key=lambda kv: kv[1]) if low <= number <= high]
        if not chosen:
            raise PkbError(f"No PKB problem numbered {rest} under $PKB_ROOT; `pkb-tui tasks --family pkb` lists them.")
        return chosen
    return [selector]
