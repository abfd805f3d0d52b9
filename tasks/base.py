"""The task contract and the registry that finds tasks by id.

A task is one module under tasks/<family>/ that holds all of itself:

    TASK = TaskSpec(id="all_reduce", title=..., family="collective", source=..., ...)

    def make_inputs(ctx: TaskContext) -> tuple[torch.Tensor, ...]: ...   # this rank's inputs
    def baseline(*inputs): ...                                           # PyTorch + torch.distributed
    def reference(inputs_per_rank: list[tuple], ctx: TaskContext) -> list: ...  # plain maths, no comms
    def traffic(ctx: TaskContext) -> Traffic: ...                        # roofline model, per rank

``baseline``'s signature is the solution signature; it returns a tensor, a tuple/list or a dict of
tensors. ``reference`` gets every rank's inputs (made in one process with ``ctx.for_rank(r)``) and
returns what each rank's baseline must return: it is how tests prove the baseline right.
Modules whose name starts with "_" are helpers, not tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import pkgutil
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import torch

from pkb_tui.errors import PkbError

FAMILIES = (
    "collective", "tensor", "sequence", "context", "expert", "data", "fsdp", "pipeline",
    "vocab", "graph", "scientific", "other",
)
PKB_FAMILY_PREFIX = "pkb-"  # families of ParallelKernelBench problems (pkb_tui/pkb): pkb-collective, ...
MODES = ("nccl", "shared-gpu", "cpu")
SIZE_NAMES = ("small", "default", "large")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def family_known(family: str) -> bool:
    """One of FAMILIES, or one of them behind "pkb-" (a ParallelKernelBench problem)."""
    return family in FAMILIES or (family.startswith(PKB_FAMILY_PREFIX) and family[len(PKB_FAMILY_PREFIX):] in FAMILIES)


@dataclass(frozen=True)
class Tolerance:
    """|candidate - reference| <= atol + rtol * |reference|, element-wise."""

    atol: float
    rtol: float
    # PKB compatibility (pkb_tui/pkb): judge like ParallelKernelBench's own check (allclose on
    # float copies, no dtype check), and/or report a second verdict beside the judging one.
    pkb_style: bool = False
    second: "Tolerance | None" = None


# Reductions in low precision need room that grows with the number of summed terms; these are the
# defaults for one rounding per element of the output (tasks with reductions over ranks widen them).
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-9, 1e-9),
    "float32": Tolerance(1e-5, 1e-5),
    "float16": Tolerance(1e-3, 1e-3),
    "bfloat16": Tolerance(1e-2, 1e-2),
}


# busbw = algbw x factor, the nccl-tests convention (its doc/PERFORMANCE.md), so figures compare with
# that tool's. "payload" is nccl-tests' size: the whole buffer for all-reduce / broadcast / reduce,
# the whole gathered (all-gather) or whole input (reduce-scatter) buffer, the whole send buffer for
# all-to-all / gather / scatter. sendrecv: one peer exchange (halo, pipeline), what a rank sends.
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
BUS_FACTOR_KINDS = tuple(_BUS_FACTORS)


def bus_factor(kind: str, world_size: int) -> float:
    """The factor from algorithm bandwidth to bus bandwidth for a ``kind`` of communication.

    0 at one rank for every kind: nothing crosses a link, so no bus bandwidth is claimed (nccl-tests'
    own formulas give 0 there for all but broadcast / reduce / sendrecv, whose 1 would credit a local
    copy as link traffic). Every task's traffic() takes its factor from here.
    """
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if kind not in _BUS_FACTORS:
        raise KeyError(f"no bus factor for {kind!r}; known: {', '.join(_BUS_FACTORS)}")
    if world_size == 1:
        return 0.0
    return float(_BUS_FACTORS[kind](world_size))


@dataclass(frozen=True)
class OutputTolerance:
    """How far one output of a candidate may be from the truth, in units of the baseline's own error.

    The judge has three versions of each output: the candidate's, the baseline's in the run dtype
    (``expected``) and the baseline's on float64 copies of the same inputs (the truth ``t``, to
    float64 rounding). Per element, e_c = |candidate - t| and e_b = |expected - t|. Element-wise
    ratios cannot be used: an honest kernel that sums in another order has errors of the same
    size as the baseline's but at other elements, and the baseline is exact at many elements by
    luck. So two statistics of the whole output are compared:

      typical: median e_c / (|t| + tau) <= k * median e_b / (|t| + tau) + floor_ulps * eps * f + floor_relative
      worst:   max e_c <= k * max e_b + (floor_ulps * eps + floor_relative) * max |t|

    tau = 1e-3 * RMS(t) (relative errors near zero stay finite); eps the machine epsilon of the
    output's dtype; f = max(1/8, 1/sqrt(elements)).

    Why: the median of relative errors is what a loss of precision moves (int8 or fp8 transport,
    a skipped term: most elements get worse) and is stable over many elements however badly a
    few cancel; the maximum catches a wrong block, row or element that the median ignores.
    k = 3: a ring summing in the run dtype has up to ~2.5x the median error of fp32 accumulation
    at 8 ranks (measured on bf16 sums; two orders of one kind differ by < 1.3x), while int8
    transport with one scale per 32 elements has ~8x the median error of one bf16 rounding on
    Gaussian values, and far more with outliers (TaskContext.randn_outliers). floor_ulps: outputs
    of a few elements (a loss) may be exact in the baseline by luck, so a whole ulp there; over
    many elements the median relative error of a correctly rounded result is ~eps/8, so an eighth.
    floor_relative (1e-6, 8 float32 ulps, nothing in bf16/fp16): in float32 a baseline that
    rounds once can be 2-6x closer to the truth than an honest kernel rounding along a chain of
    operations (measured, baselines against the once-rounded maths: up to 4.3e-7); every wrong
    step is far above it (int8 ~1e-2, a 1e-3 offset, a dropped term). All zero (EXACT_OUTPUT)
    with an exact baseline (movement, sorting, selection): bit-exact. Complex outputs count as
    (real, imag) pairs; integer and bool outputs must be equal.
    """

    k: float = 3.0
    floor_ulps: float = 1.0
    floor_relative: float = 1e-6
    # ParallelKernelBench problems (pkb_tui/pkb): "second" reports PKB's allclose(1e-2, 1e-2)
    # beside this rule's verdict when they differ; "judge" lets PKB's allclose judge and reports this rule's.
    pkb: str | None = None


DEFAULT_OUTPUT_TOLERANCE = OutputTolerance()
EXACT_OUTPUT = OutputTolerance(k=0.0, floor_ulps=0.0, floor_relative=0.0)  # movement and selection: bit-exact


@dataclass(frozen=True)
class Traffic:
    """The roofline model of one rank for one call.

    send_bytes / recv_bytes: the least bytes this rank must send to / receive from its peers over
    the interconnect for any correct algorithm. memory_bytes: device-memory bytes it must read and
    write at least. flops: arithmetic it must do. payload_bytes and bus_factor give the bus
    bandwidth by the nccl-tests convention: busbw = payload_bytes / time * bus_factor.
    tf32_flops: of ``flops``, those that PyTorch's defaults run on tensor cores in TF32 when the
    dtype is float32: convolutions (torch.backends.cudnn.allow_tf32 is on by default; matmuls'
    allow_tf32 is off). The compute floor counts them at the TF32 rate, else a float32 baseline
    convolution beats its own floor.
    messages: how many per-message latencies (alpha) the fastest algorithm must pay one after
    another (1 unless a task declares more: a pipeline of dependent exchanges). The roofline's wire
    term is messages x alpha + wire_bytes / link bandwidth.
    """

    send_bytes: int
    recv_bytes: int
    memory_bytes: int
    flops: int = 0
    payload_bytes: int = 0
    bus_factor: float = 1.0
    tf32_flops: int = 0
    messages: int = 1  # dependent messages in a row on the critical path: the roofline's latency term counts alpha per message
    source: str = ""  # "" for a hand-written model; "measured from the baseline's calls" (engine/interposer.py)

    @property
    def wire_bytes(self) -> int:
        """Bytes over the busier direction of this rank's links (links are full duplex)."""
        return max(self.send_bytes, self.recv_bytes)


@dataclass(frozen=True)
class TaskSpec:
    """What a task is, in data. Everything the registry, CLI and TUI list comes from here."""

    id: str
    title: str
    family: str
    source: str  # the codebase or paper it is modelled on
    why: str  # why its communication matters there
    sizes: dict[str, dict[str, Any]]  # "small" (CPU, tests), "default" (8-GPU box), "large"
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    tolerances: dict[str, Tolerance] = field(default_factory=dict)  # missing dtypes: defaults
    # Per output, by path ("" a lone tensor, "0" / "loss" an item, "grads/1" nested; "*" any
    # other): how far from the truth relative to the baseline's own error (see OutputTolerance).
    output_tolerances: dict[str, OutputTolerance] = field(default_factory=dict)
    world_sizes: tuple[int, ...] | None = None  # None: any world size >= 1
    min_world_size: int = 1
    modes: tuple[str, ...] = MODES
    mode_note: str = ""  # why a mode is missing, shown to the user

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances.get(dtype, DEFAULT_TOLERANCES[dtype])

    def output_tolerance(self, path: str) -> OutputTolerance:
        """The tolerance of the output at ``path``: its own, else the task's "*", else the default."""
        return self.output_tolerances.get(path, self.output_tolerances.get("*", DEFAULT_OUTPUT_TOLERANCE))


def accumulate_dtype(tensor: torch.Tensor | torch.dtype) -> torch.dtype:
    """float32 for half-precision tensors (the fp32 accumulation the task prescribes), the
    tensor's own dtype when wider: the judge runs baselines on float64 copies of the inputs to
    get the truth, and a hard-coded .float() there would cut it to float32 precision."""
    return torch.promote_types(tensor if isinstance(tensor, torch.dtype) else tensor.dtype, torch.float32)


@dataclass
class TaskContext:
    """What make_inputs / traffic / reference know about the call: who, where, how big, which trial."""

    rank: int
    world_size: int
    dtype_name: str
    size: str
    params: dict[str, Any]
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    mode: str = "cpu"
    trial: int | None = None  # the trial's index when the caller knows it (PKB's inputs are seeded by it)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    def for_rank(self, rank: int) -> "TaskContext":
        return dataclasses.replace(self, rank=rank)

    def generator(self, stream: int = 0) -> torch.Generator:
        """A generator private to (trial seed, rank, stream), on this context's device.

        Values depend only on these three and the device type, so a rank's inputs can be remade in
        another process (tests, reference maths) and every trial gets fresh values.
        """
        digest = hashlib.blake2b(f"{self.seed}:{self.rank}:{stream}".encode(), digest_size=8).digest()
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF)
        return gen

    def randn(self, *shape: int, stream: int = 0, dtype: torch.dtype | None = None) -> torch.Tensor:
        gen = self.generator(stream)
        out = torch.randn(*shape, generator=gen, device=self.device, dtype=torch.float32)
        return out.to(dtype or self.dtype)

    def randn_outliers(self, *shape: int, stream: int = 0, dtype: torch.dtype | None = None) -> torch.Tensor:
        """randn with a log-normal magnitude per element, the same element scale on every rank
        (a parameter's gradient is large or small on all ranks alike): RMS ~1, the median element
        ~0.1 of it, the largest ~10x. Real gradients and activations have such outlier channels,
        and they are what int8 or fp8 transport destroys: a block's scale is set by its largest
        element, so the small ones keep a few bits, while the dtype keeps its relative precision
        everywhere. With uniform magnitudes, bf16 rounding and int8 per 32 elements lose about
        the same."""
        values = self.randn(*shape, stream=stream, dtype=torch.float32) * self.outlier_scales(*shape, stream=stream)
        return values.to(dtype or self.dtype)

    def outlier_scales(self, *shape: int, stream: int = 0) -> torch.Tensor:
        """float32 log-normal magnitudes, the same on every rank: RMS ~1, median ~0.1, max ~10.
        Multiply a weight's output features (or a tensor's channels) by them to give a layer's
        outputs the outlier channels real models have (see randn_outliers for why)."""
        z = torch.randn(*shape, generator=self.shared_generator(stream=1000 + stream), device=self.device,
                        dtype=torch.float32)
        return torch.exp(1.5 * z.clamp(-3, 3) - 2.25)

    def randint(self, low: int, high: int, shape: tuple[int, ...], *, stream: int = 0) -> torch.Tensor:
        gen = self.generator(stream)
        return torch.randint(low, high, shape, generator=gen, device=self.device, dtype=torch.int64)

    def shared_generator(self, stream: int = 0) -> torch.Generator:
        """Like generator() but the same on every rank (for values all ranks must agree on)."""
        return self.for_rank(-1).generator(stream)


@dataclass
class Task:
    """A loaded task: its spec plus the functions of its module."""

    spec: TaskSpec
    module: ModuleType
    make_inputs: Callable[[TaskContext], tuple]
    baseline: Callable[..., Any]
    reference: Callable[[list, TaskContext], list]
    traffic: Callable[[TaskContext], Traffic]

    @property
    def id(self) -> str:
        return self.spec.id

    def context(
        self, *, rank: int, world_size: int, dtype: str, size: str, seed: int = 0,
        device: torch.device | None = None, mode: str = "cpu", trial: int | None = None,
    ) -> TaskContext:
        return TaskContext(
            rank=rank, world_size=world_size, dtype_name=dtype, size=size,
            params=dict(self.spec.sizes[size]), seed=seed,
            device=device or torch.device("cpu"), mode=mode, trial=trial,
        )

    def check_request(self, *, world_size: int, mode: str, dtype: str, size: str) -> None:
        """Raise PkbError saying what to change when this task cannot run as asked."""
        spec = self.spec
        if dtype not in spec.dtypes:
            raise PkbError(
                f"Task {spec.id} does not support dtype {dtype}; choose one of {', '.join(spec.dtypes)}."
            )
        if size not in spec.sizes:
            raise PkbError(
                f"Task {spec.id} has no size {size!r}; choose one of {', '.join(spec.sizes)}."
            )
        if mode not in spec.modes:
            note = f" ({spec.mode_note})" if spec.mode_note else ""
            raise PkbError(
                f"Task {spec.id} does not run in {mode} mode{note}; it supports {', '.join(spec.modes)}."
            )
        if world_size < spec.min_world_size or (
            spec.world_sizes is not None and world_size not in spec.world_sizes
        ):
            allowed = (
                ", ".join(map(str, spec.world_sizes)) if spec.world_sizes is not None
                else f">= {spec.min_world_size}"
            )
            raise PkbError(f"Task {spec.id} does not run at world size {world_size}; it supports {allowed}.")


_REQUIRED = ("make_inputs", "baseline", "reference", "traffic")
_registry: dict[str, Task] | None = None
_broken: dict[str, str] = {}  # task module that failed to load -> why, in one line


def _task_from_module(module: ModuleType) -> Task:
    spec = module.TASK
    missing = [name for name in _REQUIRED if not callable(getattr(module, name, None))]
    if missing:
        raise PkbError(f"Task module {module.__name__} lacks {', '.join(missing)}; see tasks/base.py.")
    if not family_known(spec.family):
        raise PkbError(f"Task {spec.id} has unknown family {spec.family!r}; use one of {', '.join(FAMILIES)}.")
    unknown_dtypes = [d for d in spec.dtypes if d not in DTYPES]
    if unknown_dtypes:
        raise PkbError(f"Task {spec.id} lists unknown dtypes {unknown_dtypes}.")
    return Task(spec, module, *(getattr(module, name) for name in _REQUIRED))


def _discover() -> tuple[dict[str, Task], dict[str, str]]:
    """(tasks by id, broken module -> why). One module that fails to import or breaks the contract
    is left out and reported; it never takes the other tasks down with it."""
    import tasks as package

    found: dict[str, Task] = {}
    broken: dict[str, str] = {}
    for info in pkgutil.walk_packages(package.__path__, prefix="tasks.", onerror=lambda name: broken.setdefault(
            name, "its package failed to import")):
        leaf = info.name.rsplit(".", 1)[-1]
        if leaf.startswith("_") or leaf == "base":
            continue
        try:
            module = importlib.import_module(info.name)
            if not hasattr(module, "TASK"):
                continue
            task = _task_from_module(module)
        except Exception as exc:  # SyntaxError is an Exception too; a bad module must not stop discovery
            broken[info.name] = _one_line(exc)
            continue
        if task.id in found:
            broken[info.name] = f"claims id {task.id!r}, which {found[task.id].module.__name__} already has"
            continue
        found[task.id] = task
    return dict(sorted(found.items())), broken


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def all_tasks() -> dict[str, Task]:
    """Every task that loads, by id (imported once per process); broken_tasks() names the rest.

    With $PKB_ROOT set (a ParallelKernelBench clone), its problems follow as pkb/<N>_<name>
    (pkb_tui/pkb/tasks.py). Rank processes inherit the launcher's environment, so setting
    os.environ["PKB_ROOT"] before a launch (pkb_tui.pkb.activate does) makes load_task("pkb/...")
    work in every process of the run.
    """
    global _registry, _broken
    if _registry is None:
        _registry, _broken = _discover()
    pkb = _pkb_tasks()
    return {**_registry, **pkb} if pkb else _registry


def _pkb_tasks() -> dict[str, Task]:
    import os

    root = os.environ.get("PKB_ROOT")
    if not root:
        return {}
    from pkb_tui.pkb.tasks import pkb_tasks  # late: pkb_tui.pkb imports this module

    return pkb_tasks(root)


def broken_tasks() -> dict[str, str]:
    """Task modules that failed to load: module name -> the reason, in one line."""
    all_tasks()
    return dict(_broken)


def load_task(task_id: str) -> Task:
    tasks = all_tasks()
    if task_id not in tasks:
        hint = ""
        if task_id.startswith("pkb/") and not _pkb_tasks():
            hint = " ParallelKernelBench problems need --pkb-root DIR (or $PKB_ROOT) pointing at a clone."
        if _broken:
            hint += " " + "; ".join(f"{name} failed to load ({why})" for name, why in sorted(_broken.items())) + "."
        raise PkbError(f"Unknown task {task_id!r}; `pkb-tui tasks` lists the {len(tasks)} known ones.{hint}")
    return tasks[task_id]
