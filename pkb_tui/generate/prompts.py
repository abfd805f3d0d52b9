"""Prompts from the task module: what it computes, its baseline, inputs, tolerances, traffic model and
roofline floor, the hardware as calibrated here, the helpers, one worked example. Templates are files
in templates/ with the version in their name (task.v1.md); the rendered prompt's sha256 is stored
with every request, so a reply can be traced to the exact words that asked for it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from pkb_tui.engine.roofline import Bandwidths, bandwidths_for, evaluate
from tasks.base import Task

TEMPLATE_VERSION = "v1"
TEMPLATES = Path(__file__).with_name("templates")
SHAPES_MAX_BYTES = 256 * 1024 * 1024  # inputs made on the CPU to show their shapes only below this

MODE_NOTES = {
    "nccl": "one GPU per rank (tensors on cuda:<rank>), NCCL default group; peers reachable over NVLink/PCIe.",
    "shared-gpu": "every rank on the one GPU cuda:0, gloo default group (CUDA tensors), peers' memory through CUDA "
                  "IPC (pkb_tui.symheap); timings there do not represent an interconnect.",
    "cpu": "CPU tensors, gloo default group: torch-level solutions only (no CUDA kernels); timings do not "
           "represent a GPU.",
}

HELPERS_GPU = """\
- torch.distributed (send/recv, batch_isend_irecv, collectives) and `tasks._comm` (the harness's compat layer:
  sendrecv(send, dst, recv, src), all_gather_single, reduce_scatter_single, all_to_all_single; works on NCCL and gloo).
- `pkb_tui.symheap`: the same buffer on every rank with every peer's device pointer (CUDA IPC):
      from pkb_tui import symheap
      heap = symheap.get_heap()                               # once per process, collective
      buf = heap.buffer("my.in", (numel,), torch.float32)     # collective on first use, then cached
      buf.local.copy_(x); buf.peer(r)                         # this rank's / peer r's buffer as tensors
      heap.barrier()                                          # device-side barrier on the current stream
      heap.launch(kernel, grid, block, (buf.peer_ptrs_device, heap.signal_pads, heap.rank, ...))
  `symheap.DEVICE_CODE` holds CUDA helpers (pkb_block_barrier) to prepend to your kernel source.
- CuPy RawKernel (NVRTC): cupy.RawKernel(source, "name"), pass tensor.data_ptr() and run on
  torch.cuda.current_stream().
- Triton (@triton.jit) for single-GPU compute parts."""

HELPERS_CPU = """\
- torch.distributed (send/recv, batch_isend_irecv, collectives) and `tasks._comm` (the harness's compat layer:
  sendrecv(send, dst, recv, src), all_gather_single, reduce_scatter_single, all_to_all_single).
- In cpu mode there is no GPU: no symmetric heap, CuPy or Triton; write the algorithm with torch ops and messages."""


@dataclass
class Prompt:
    system: str
    messages: list[dict[str, str]]  # [{"role": "user"|"assistant", "content": ...}]
    template: str  # which templates rendered it, with their version

    @property
    def sha256(self) -> str:
        return prompt_hash(self.system, self.messages)

    def as_json(self) -> str:
        return json.dumps({"system": self.system, "messages": self.messages}, ensure_ascii=False)


def prompt_hash(system: str, messages: list[dict[str, str]]) -> str:
    text = json.dumps({"system": system, "messages": messages}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def template(name: str) -> Template:
    return Template((TEMPLATES / f"{name}.{TEMPLATE_VERSION}.md").read_text())


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit} ({int(n):,} bytes)"
    return f"{int(n):,} bytes"


def fmt_time_us(us: float | None) -> str:
    if us is None or not math.isfinite(us):
        return "n/a"
    return f"{us / 1000:.3f} ms" if us >= 1000 else f"{us:.2f} µs"


@dataclass
class Hardware:
    """What the prompt says of the machine: from `pkb-tui calibrate` when measured, else datasheets."""

    host: dict[str, Any]
    calibration: dict[str, float]
    calibrated_at: float | None
    bandwidths: Bandwidths

    def describe(self, mode: str, world_size: int) -> str:
        host, bw = self.host, self.bandwidths
        gpu = f"{host.get('gpu_count') or 0} x {host.get('gpu_model')}" if host.get("gpu_model") else "no GPU (CPU only)"
        lines = [f"- GPUs: {gpu}; torch {host.get('torch_version') or '?'}, CUDA {host.get('cuda_version') or 'none'}."]
        lines.append(f"- Link ({bw.link_kind}): {_gbps(bw.link_gbps)} per direction per GPU; source: {bw.link_source}.")
        lines.append(f"- Memory: {_gbps(bw.memory_gbps)}; source: {bw.memory_source}.")
        if not self.calibration:
            lines.append("- Not calibrated on this host (`pkb-tui calibrate`): the figures above are datasheet or nominal values.")
        return "\n".join(lines)


def _gbps(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.0f} GB/s"


def load_hardware(store: Any, mode: str, world_size: int, *, host: dict[str, Any] | None = None) -> Hardware:
    """This host's facts and newest calibration from the Store (the host row is written if new)."""
    if host is None:
        from pkb_tui.engine.calibrate import host_facts

        host = host_facts()
    host_id = store.upsert_host(host)
    calibration = store.latest_calibration(host_id)
    row = store.conn.execute("SELECT MAX(measured_at) FROM calibrations WHERE host_id=?", (host_id,)).fetchone()
    calibrated_at = row[0] if row else None
    bandwidths = bandwidths_for(host, calibration, mode, world_size, calibrated_at=calibrated_at)
    return Hardware(host, calibration, calibrated_at, bandwidths)


def _input_shapes(task: Task, world_size: int, mode: str, size: str, dtype: str, memory_bytes: int) -> str:
    if memory_bytes > SHAPES_MAX_BYTES:
        return "(inputs too large to make here to show their shapes; see the size parameters)"
    try:
        ctx = task.context(rank=0, world_size=world_size, dtype=dtype, size=size, mode="cpu")
        inputs = task.make_inputs(ctx)
    except Exception as exc:  # a task whose inputs need a GPU: the parameters say enough
        return f"(shapes not shown: making the inputs on the CPU failed: {type(exc).__name__})"
    described = []
    for index, value in enumerate(inputs if isinstance(inputs, (tuple, list)) else (inputs,)):
        if hasattr(value, "shape"):
            described.append(f"arg {index}: {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}")
        else:
            described.append(f"arg {index}: {type(value).__name__} {value!r}"[:120])
    return "Inputs on rank 0: " + "; ".join(described) + "."


def task_prompt(task: Task, *, world_size: int, mode: str, size: str, dtype: str, hardware: Hardware) -> Prompt:
    spec = task.spec
    ctx = task.context(rank=0, world_size=world_size, dtype=dtype, size=size, mode=mode)
    traffic = task.traffic(ctx)
    roof = evaluate(traffic, float("nan"), hardware.bandwidths, dtype)
    tolerance = spec.tolerance(dtype)
    floor = fmt_time_us(roof.floor_us) + ("" if not roof.terms_us else " (" + ", ".join(
        f"{k} {fmt_time_us(v)}" for k, v in sorted(roof.terms_us.items())) + ")")
    fields = {
        "task_id": spec.id, "title": spec.title, "why": spec.why, "source": spec.source,
        "signature": f"solution{inspect.signature(task.baseline)}".replace("'", ""),
        "baseline_source": inspect.getsource(task.baseline).rstrip(),
        "make_inputs_source": inspect.getsource(task.make_inputs).rstrip(),
        "size": size, "size_params": json.dumps(spec.sizes[size]),
        "input_shapes": _input_shapes(task, world_size, mode, size, dtype, traffic.memory_bytes),
        "dtype": dtype, "atol": f"{tolerance.atol:g}", "rtol": f"{tolerance.rtol:g}",
        "world_size": world_size, "mode": mode, "mode_note": MODE_NOTES.get(mode, ""),
        "send_bytes": fmt_bytes(traffic.send_bytes), "recv_bytes": fmt_bytes(traffic.recv_bytes),
        "memory_bytes": fmt_bytes(traffic.memory_bytes), "flops": f"{traffic.flops:,}",
        "floor": floor, "bound": roof.bound or "n/a",
        "hardware": hardware.describe(mode, world_size),
        "helpers": HELPERS_CPU if mode == "cpu" else HELPERS_GPU,
    }
    user = template("task").substitute(fields)
    return Prompt(template("system").template, [{"role": "user", "content": user}], f"system+task.{TEMPLATE_VERSION}")


def refine_prompt(first: Prompt, last_reply: str, *, round_index: int, rounds: int, digest: str, best: str,
                  goal: str) -> Prompt:
    """The conversation so far (task prompt, the last reply) and the evaluation of that reply."""
    user = template("refine").substitute(round=round_index, rounds=rounds, digest=digest, best=best, goal=goal)
    messages = [first.messages[0], {"role": "assistant", "content": last_reply or "(empty reply)"},
                {"role": "user", "content": user}]
    return Prompt(first.system, messages, f"system+task+refine.{TEMPLATE_VERSION}")


# ---------------------------------------------------------------------- evaluation digests
LOG_TAIL_CHARS = 2500
TOP_KERNELS = 6


def digest_run(run: dict[str, Any], *, log_tail: str | None = None) -> str:
    """A structured digest of one evaluation (Store.run's record): verdict, per-rank mismatch figures,
    speedup with its spread, roofline share, top kernels; the log's tail when it errored."""
    lines = [f"Verdict: {run['status']}" + (f" ({run['status_detail'].strip()[:600]})" if run.get("status_detail") else "")]
    results = run.get("results") or {}
    base, cand = results.get("baseline") or {}, results.get("candidate") or {}
    trials = run.get("trial_results") or []
    if trials:
        lines.append("Trials (max abs / rel error; worst rank):")
        for trial in trials:
            label = "timed outputs" if trial["trial"] < 0 else f"trial {trial['trial']}"
            mark = "correct" if trial["correct"] else "WRONG"
            figures = f"{_g(trial.get('max_abs_error'))} / {_g(trial.get('max_rel_error'))}, worst rank {trial.get('worst_rank')}"
            message = f" - {trial['message']}" if trial.get("message") else ""
            lines.append(f"- {label}: {mark}, {figures}{message}")
            detail = trial.get("detail")
            if not trial["correct"] and isinstance(detail, list):
                per_rank = [d for d in detail if isinstance(d, dict)][:8]
                for d in per_rank:
                    extra = ", ".join(f"{k} {_g(v)}" for k, v in d.items() if k != "rank")[:200]
                    lines.append(f"    rank {d.get('rank')}: {extra}")
    if cand.get("median_us") is not None:
        lines.append(
            f"Time: yours {fmt_time_us(cand['median_us'])} (p10 {fmt_time_us(cand.get('p10_us'))}, p90 "
            f"{fmt_time_us(cand.get('p90_us'))}), baseline {fmt_time_us(base.get('median_us'))}; "
            f"speedup {_x(cand.get('speedup'))}.")
    if cand.get("roofline_fraction") is not None:
        lines.append(f"Roofline: {cand['roofline_fraction'] * 100:.1f}% of the floor "
                     f"{fmt_time_us(cand.get('roofline_floor_us'))} ({cand.get('roofline_bound')}-bound).")
    kernels = [k for k in run.get("kernels") or [] if k["variant"] == "candidate" and k["rank"] == 0][:TOP_KERNELS]
    if kernels:
        lines.append("Your top kernels/ops on rank 0 (calls, total):")
        lines += [f"- {k['name'][:80]} [{k['category']}]: {k['calls']} calls, {fmt_time_us(k['total_us'])}" for k in kernels]
    if log_tail:
        lines.append("Log tail:\n```\n" + log_tail[-LOG_TAIL_CHARS:] + "\n```")
    return "\n".join(lines)


def _g(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"
