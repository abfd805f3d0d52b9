"""What does a runner need to write to open the judge's CUDA arena under its sandbox? (GPU box only.)

The judge shares its arena with a runner through CUDA IPC. This probe exports a CUDA tensor from
this process, twice: torch's way (``_share_cuda_``: memory handle, a reference-count file and an
event handle) and the bare memory handle (CuPy's ``ipcGetMemHandle``). Then, per candidate set of
writable paths, a fresh process applies the runner's sandbox and opens both. Prints one line per
attempt and which /dev/shm entries the export created.

    python bench/ipc_sandbox_probe.py
"""

from __future__ import annotations

import base64
import glob
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import base64, glob, json, os, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
from pkb_tui.engine.sandbox import drop_capabilities, restrict_writes
from pkb_tui.engine.channel import _unjsonable
spec = json.loads({spec!r})
scratch = Path(tempfile.mkdtemp(prefix="ipc-probe-"))
pid = os.getpid()
paths = {{"scratch": [scratch], "null": ["/dev/null", "/dev/zero", "/dev/full"], "self": [f"/proc/{{pid}}"],
         "nvidia": sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri/*")), "shm": ["/dev/shm"],
         "proc": ["/proc"], "dev": ["/dev"]}}
note = restrict_writes([p for key in {keys!r} for p in paths[key]], scope_signals=True)
drop_capabilities()
import torch
torch.cuda.set_device(0)
results = []
try:
    args = [_unjsonable(a) for a in spec["torch_args"]]
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    t = torch.empty(0, dtype=torch.uint8, device="cuda").set_(storage)
    results.append(f"torch: ok (sum {{int(t[:1024].sum())}})")
except BaseException as exc:
    results.append(f"torch: {{type(exc).__name__}}: {{str(exc).splitlines()[0][:120]}}")
try:
    import cupy
    ptr = cupy.cuda.runtime.ipcOpenMemHandle(base64.b64decode(spec["raw"]))
    mem = cupy.cuda.UnownedMemory(ptr, 1024, None)
    arr = cupy.ndarray((1024,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
    results.append(f"raw: ok (sum {{int(arr.get().sum())}})")
except BaseException as exc:
    results.append(f"raw: {{type(exc).__name__}}: {{str(exc).splitlines()[0][:120]}}")
print(("sandbox " + ("on" if note is None else note)) + "; " + "; ".join(results))
"""

SETS = [
    ["scratch", "null", "self", "nvidia"],
    ["scratch", "null", "self", "nvidia", "shm"],
    ["scratch", "null", "self", "nvidia", "proc"],
    ["scratch", "dev", "proc"],
]


def main() -> int:
    import cupy
    import torch

    from pkb_tui.engine.channel import _jsonable

    shm_before = set(glob.glob("/dev/shm/*"))
    x = torch.ones(1 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    fields = x.untyped_storage()._share_cuda_()
    y = torch.full((1 << 20,), 2, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    raw = cupy.cuda.runtime.ipcGetMemHandle(y.data_ptr())
    new = sorted(set(glob.glob("/dev/shm/*")) - shm_before)
    print(f"/dev/shm entries the exports created: {new}", flush=True)
    spec = json.dumps({"torch_args": [_jsonable(f) for f in fields], "raw": base64.b64encode(bytes(raw)).decode()})
    for keys in SETS:
        code = CHILD.format(root=str(ROOT), keys=keys, spec=spec)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
            line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-400:]])[-1]
        except subprocess.TimeoutExpired:
            line = "timed out"
        print(f"writable {'+'.join(keys)}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
