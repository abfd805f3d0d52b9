"""Which files must a runner (the process that imports candidate code) be able to write for CUDA,
NCCL, CuPy and Triton to work under the Landlock write sandbox? (GPU box only.)

Each attempt runs in a fresh process: the runner's sandbox (pkb_tui.engine.sandbox) over its own
scratch folder (TMPDIR) and JIT cache (jit_env), plus one candidate set of device and /proc paths,
capabilities dropped; then CUDA init, a tensor, NCCL at world size 1, a CuPy kernel (compiled into
the JIT cache) and a Triton kernel. Prints one line per attempt, the first failing step if any, and
which of /dev/shm, another process's /proc entry and /proc/sys each set leaves writable.

    python bench/sandbox_cuda_probe.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTEMPT = r"""
import glob, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
from pkb_tui.engine.sandbox import drop_capabilities, jit_env, restrict_writes
scratch = Path(tempfile.mkdtemp(prefix="probe-scratch-")); jit = Path(tempfile.mkdtemp(prefix="probe-jit-"))
env = jit_env(jit); os.environ.update(env, TMPDIR=str(scratch)); tempfile.tempdir = None  # gettempdir() cached /tmp
for v in env.values(): Path(v).mkdir(parents=True, exist_ok=True)
pid = os.getpid()
paths = {{"scratch": [scratch, jit], "null": ["/dev/null", "/dev/zero", "/dev/full"], "self": [f"/proc/{{pid}}"],
         "nvidia": sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")), "shm": ["/dev/shm"],
         "dev": ["/dev"], "proc": ["/proc"], "mps": [os.environ[e] for e in ("CUDA_MPS_PIPE_DIRECTORY",
         "CUDA_MPS_LOG_DIRECTORY") if os.environ.get(e)]}}
note = restrict_writes([p for key in {keys!r} for p in paths[key]], scope_signals=True)
kept = drop_capabilities()
step = "sandbox"
def writable(path):
    try:
        with open(path, "a"): return True
    except OSError: return False
try:
    assert note is None, note
    import torch
    step = "cuda init"; torch.cuda.set_device(0); x = torch.ones(1 << 20, device="cuda")
    step = "nccl"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT={port!r}, RANK="0", WORLD_SIZE="1")
    import torch.distributed as dist
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0)); dist.all_reduce(x); torch.cuda.synchronize()
    dist.destroy_process_group()
    step = "cupy"; import cupy
    k = cupy.RawKernel('extern "C" __global__ void k(float* a) {{ a[threadIdx.x] += {salt}.0f; }}', "k")
    a = cupy.zeros(32, dtype=cupy.float32); k((1,), (32,), (a,)); assert float(a.sum()) == 32 * {salt}
    step = "triton"; import importlib.util
    source = scratch / "probe_triton.py"  # triton.jit wants its source in a file
    source.write_text("import triton, triton.language as tl\n@triton.jit\ndef add(p, n: tl.constexpr):\n"
                      "    i = tl.arange(0, n); tl.store(p + i, tl.load(p + i) + {salt})\n")
    spec = importlib.util.spec_from_file_location("probe_triton", source); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = torch.zeros(64, device="cuda"); mod.add[(1,)](t, 64); torch.cuda.synchronize(); assert float(t.sum()) == 64 * {salt}
    leaks = [name for name, path in (("/dev/shm", "/dev/shm/pkb-probe"), ("/proc/1/oom_score_adj", "/proc/1/oom_score_adj"),
             ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/core_pattern")) if writable(path)]
    print("ok" + (f"; still writable: {{', '.join(leaks)}}" if leaks else "; /dev/shm, /proc/1, /proc/sys refused")
          + ("" if kept is None else f"; {{kept}}"))
except BaseException as exc:
    print(f"failed at {{step}}: {{type(exc).__name__}}: {{str(exc).splitlines()[0][:160] if str(exc) else ''}}")
"""

SETS = [
    ["scratch", "null", "self", "nvidia"],
    ["scratch", "null", "self", "nvidia", "shm", "mps"],
    ["scratch", "null", "self", "nvidia", "shm", "proc", "mps"],
    ["scratch", "dev", "proc", "mps"],
]


def main() -> int:
    for index, keys in enumerate(SETS):
        code = ATTEMPT.format(root=str(ROOT), keys=keys, port=str(29577 + index), salt=index + 1)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
        except subprocess.TimeoutExpired:
            line = "timed out"
        print(f"writable {'+'.join(keys)}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
