"""Per-kernel timings over a short torch.profiler window, after timing (never during it).

``profile_kernels(fn, iterations, device)`` runs ``fn`` under torch.profiler and returns one row per
kernel name: {name, category, calls, total_us, mean_us, share_fraction}, biggest total first. On a
GPU the rows are the device's activities (kernels, memcpy, memset) plus any gloo collectives (the
shared-gpu mode's path); in cpu mode they are the CPU operators, so the panel works everywhere.
``share_fraction`` is a row's share of the summed time of all rows (of the device's busy time).

``classify_kernel(name)`` puts a name in one of four categories:

- communication: NCCL kernels (ncclDevKernel_*, ncclSymkDevKernel_*, ncclKernel_*), torch's own
  c10d kernels (symmetric memory), and on the CPU gloo / c10d / record_param_comms operators.
  NCCL's kernel name tells the collective and dtype, not the algorithm actually used, so names are
  kept whole and never parsed into an "algorithm".
- copy: memcpy / memset activities (HtoD, DtoH, DtoD, PtoP peer copies), torch's copy/fill/cat
  kernels, aten::copy_ and friends on the CPU.
- compute: kernels that carry a library's signature: a C++ namespace of torch, CUTLASS, cuBLAS,
  cuDNN, CUB, Thrust or FlashAttention (at::, c10::, cutlass::, cub::, ...), a vendor GEMM prefix
  (sm90_xmma_*, ampere_sgemm_*, nvjet_*, gemv*, splitKreduce*, ...), torch.compile's generated
  Triton kernels (triton_poi_/red_/per_/tem_...), or CuPy's built-in kernels (cupy_*).
- candidate: every other device kernel. The rule is "not signed by a library we know", because a
  candidate's kernels come from CuPy RawKernel / RawModule, a user's Triton @jit function or its
  own CUDA C++ and carry whatever name the author gave them ('one_shot_all_reduce_kernel',
  'pkb::ring_allreduce<float>'). On the CPU, operators outside the framework's namespaces (a
  candidate's own record_function labels) count as candidate too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

CATEGORIES = ("communication", "copy", "candidate", "compute")
# Calls of each variant the worker profiles (after timing): the kernel table's rows sum over them.
PROFILE_CALLS = 3

_COMM_PREFIX = re.compile(r"^(?:void\s+)?(?:nccl|rccl)", re.IGNORECASE)
_COMM_CPU = re.compile(
    r"^(?:gloo:|nccl:|mpi:|ucc:|c10d::|_c10d_functional::|c10d_functional::|symm_mem::|record_param_comms|ProcessGroup)",
)
# Copy-engine and memset activities as CUPTI / kineto name them ("Memcpy DtoD (Device -> Device)",
# "Memset (Device)") or as nsys does ("[CUDA memcpy ...]"); a kernel merely called memcpy_* is not one.
_COPY_ACTIVITY = re.compile(r"^(?:Memcpy [A-Za-z]+ \(|Memset \(|\[CUDA mem(?:cpy|set))")
_COPY_KERNEL = re.compile(r"direct_copy_kernel|copy_device_to_device|CatArrayBatchedCopy|FillFunctor|^(?:void\s+)?cupy_copy")
_COPY_CPU_OPS = {
    "aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::_copy_from",
    "aten::_copy_from_and_resize", "aten::fill_", "aten::zero_", "aten::cat", "aten::index_copy_",
}
# First component of a kernel's C++ qualified name that marks it as a library's (or torch's).
_LIBRARY_NAMESPACES = {
    "at", "at_cuda_detail", "c10", "caffe2", "torch", "cutlass", "cute", "cublas", "cublasLt", "cudnn", "cub",
    "thrust", "pytorch_flash", "flash", "fmha", "cusparse", "cufft", "curand", "magma", "cusolver",
    "(anonymous namespace)", "std", "transformer_engine", "xformers",
}
_COMM_NAMESPACES = {"c10d"}  # torch's symmetric-memory kernels: c10d::symmetric_memory::*
_LIBRARY_PREFIX = re.compile(
    r"^(?:sm\d+_|xmma_|ampere_|volta_|turing_|hopper_|maxwell_|pascal_|blackwell_|cutlass|cublas|cudnn|nvjet|"
    r"gemv|gemm|splitKreduce|dot_kernel|scal_kernel|axpy_kernel|reduce_1Block|nrm2|asum|trsm|kernel_convert|"
    r"regular_fft|vector_fft|cupy_|cask_|fmha|flash_fwd|flash_bwd|"
    r"triton_(?:poi|red|per|tem|for|mm|bmm|sch|unk)_)",
)
_CPU_NAMESPACES = re.compile(r"^(?:aten|prim|profiler|autograd|torch|c10|quantized|cuda|mkldnn|_?inductor)::|^<built-in|^Optimizer\.|^ProfilerStep|^cuda[A-Z]|^\[")


def _first_namespace(name: str) -> str | None:
    """'at' for 'void at::native::foo<...>(...)', None for a name with no namespace."""
    mangled = re.match(r"^_ZN(\d+)", name)
    if mangled:  # an undemangled C++ name: _ZN2at6native...
        start = mangled.end()
        return name[start:start + int(mangled.group(1))]
    if re.match(r"^_Z\d+", name):
        return None
    text = name[5:] if name.startswith("void ") else name
    if text.startswith("(anonymous namespace)::"):
        return "(anonymous namespace)"
    head = re.split(r"[<(\s]", text, maxsplit=1)[0]
    return head.split("::")[0] if "::" in head else None


def _plain_name(name: str) -> str:
    """The bare function name of a kernel without namespace ('gemv2T_kernel_val')."""
    mangled = re.match(r"^_Z(\d+)", name)
    if mangled:
        start = mangled.end()
        return name[start:start + int(mangled.group(1))]
    text = name[5:] if name.startswith("void ") else name
    return re.split(r"[<(\s]", text, maxsplit=1)[0]


def classify_kernel(name: str, device_type: str = "cuda") -> str:
    """'communication', 'copy', 'candidate' or 'compute' for a kernel (or CPU operator) name."""
    if device_type == "cpu":
        if _COMM_CPU.match(name):
            return "communication"
        if name in _COPY_CPU_OPS or _COPY_ACTIVITY.match(name):
            return "copy"
        return "compute" if _CPU_NAMESPACES.search(name) else "candidate"

    if _COMM_PREFIX.match(name):
        return "communication"
    if _COPY_ACTIVITY.match(name) or _COPY_KERNEL.search(name):
        return "copy"
    if _COMM_CPU.match(name):
        return "communication"  # CPU-side collectives seen while profiling a GPU (gloo in shared-gpu mode)
    namespace = _first_namespace(name)
    if namespace in _COMM_NAMESPACES:
        return "communication"
    if namespace in _LIBRARY_NAMESPACES or _LIBRARY_PREFIX.match(_plain_name(name)):
        return "compute"
    return "candidate"


def aggregate_events(events: Iterable[Any], device_type: str) -> list[dict[str, Any]]:
    """Rows per name from torch.profiler FunctionEvents (device activities on GPU, operators on CPU)."""
    from torch.autograd import DeviceType

    totals: dict[str, list[float]] = {}
    for evt in events:
        name = evt.name
        if device_type == "cuda":
            if evt.device_type == DeviceType.CUDA:
                duration_us = float(evt.time_range.elapsed_us())
            elif evt.device_type == DeviceType.CPU and name.startswith("gloo:"):
                duration_us = float(evt.time_range.elapsed_us())  # gloo runs on its own thread
            else:
                continue
        else:
            if evt.device_type != DeviceType.CPU or name.startswith(("ProfilerStep", "[memory]")):
                continue
            # Self time, so nested operators are not counted twice; an async event (gloo's work on its
            # own thread) has no self time, so its span is what it cost.
            duration_us = float(evt.time_range.elapsed_us()) if getattr(evt, "is_async", False) or name.startswith("gloo:") \
                else float(evt.self_cpu_time_total)
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += duration_us
    return rows_from_totals(totals, device_type)


def rows_from_totals(totals: dict[str, list[float]], device_type: str) -> list[dict[str, Any]]:
    grand_total = sum(total for _, total in totals.values())
    rows: list[dict[str, Any]] = []
    for name, (calls, total_us) in totals.items():
        rows.append({
            "name": name, "category": classify_kernel(name, device_type), "calls": int(calls),
            "total_us": total_us, "mean_us": total_us / calls if calls else 0.0,
            "share_fraction": total_us / grand_total if grand_total > 0 else None,
        })
    rows.sort(key=lambda r: (-r["total_us"], r["name"]))
    return rows


def profile_kernels(
    fn: Callable[[], object], iterations: int, device: Any, trace_path: str | None = None,
) -> list[dict[str, Any]]:
    """Profile ``iterations`` calls of ``fn`` and return per-kernel rows (see module docstring).

    A Chrome/Perfetto trace of the window is written to ``trace_path`` when given.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    if on_gpu:
        torch.cuda.synchronize(device)  # earlier work must not spill into the window
    with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as prof:
        for _ in range(iterations):
            fn()
        if on_gpu:
            torch.cuda.synchronize(device)
    if trace_path:
        prof.export_chrome_trace(str(trace_path))
    return aggregate_events(prof.events(), "cuda" if on_gpu else "cpu")
