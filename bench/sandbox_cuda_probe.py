"""Which files must a runner (the process that imports candidate code) be able to write for CUDA,
NCCL, CuPy and Triton to work under the Landlock write sandbox? (GPU box only.)

Each attempt runs in a fresh process: the runner's sandbox (pkb_tui.engine.sandbox) over its own
scratch folder (TMPDIR) and JIT cache (jit_env), plus one candidate set of device and /proc paths,
capabilities dropped; then CUDA init, a tensor, NCCL at world size 1, a CuPy kernel (compiled into
the JIT cache) and a Triton kernel. Prints one line per attempt, the first failing step if any, and
which of /dev/shm, another process's /proc entry and /proc/sys each set leaves writable.

    python bench/sandbox_cuda_probe.py             # both parts
    python bench/sandbox_cuda_probe.py --readnet   # only the second
    python bench/sandbox_cuda_probe.py --unix      # only the named-socket check (no GPU needed)

Second part (issue 13: reads and network): runners exactly as a candidate's (engine.runner's
set-up: its group's network namespace joined first, Landlock over writes AND reads, capabilities
dropped) at one rank (NCCL), two ranks sharing GPU 0 (NCCL, then gloo as shared-gpu mode runs),
and two ranks on two GPUs where there are two. Each rank checks that a secret in the home, a
database, another model's folder and the project's README are refused and that a listener on the
host's 127.0.0.1 cannot be reached, then starts CUDA, forms its group at 127.0.0.1 inside the
namespace, all-reduces, compiles and runs a CuPy and a Triton kernel into its JIT cache. NCCL's
INFO lines say which transport each pair used (P2P/SHM on one host: they must not care about the
namespace). One table row per rank.

The confined ranks also hide the host's named unix sockets as a candidate's runner does
(engine.unix_sockets: found in the host's network namespace, then a mount namespace of their own
with /dev/null over each, after joining the group's namespace), and check that a listener this
probe binds at a path cannot be reached. Where nvidia-cuda-mps-control is on PATH a shared-gpu
case runs its two ranks under a private MPS daemon (engine.mps): its pipe folder is left
reachable, and the daemon must list a server afterwards (a client reached it through the covers).
--unix runs only that named-socket check, in a fresh process, without CUDA (any box).
"""

from __future__ import annotations

import os
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


READNET_RANK = r"""
import json, os, socket, sys, tempfile, time
from pathlib import Path
cfg = json.loads(os.environ["PKB_PROBE"])
sys.path.insert(0, cfg["root"])
from pkb_tui.engine import sandbox
rows = {"rank": cfg["rank"]}
t0 = time.monotonic()
step = "netns"
def out():
    rows["s"] = round(time.monotonic() - t0, 1)
    print("ROW " + json.dumps(rows), flush=True)
try:
    scratch, jit, model = Path(cfg["scratch"]), Path(cfg["jit"]), Path(cfg["model"])
    env = sandbox.jit_env(jit); os.environ.update(env, TMPDIR=str(scratch)); tempfile.tempdir = None
    for v in env.values(): Path(v).mkdir(parents=True, exist_ok=True)
    if cfg["confined"]:  # else the control: the same steps, no namespace, no sandbox
        from pkb_tui.engine import unix_sockets
        found = unix_sockets.find_host_sockets()  # in the host's network namespace, as a runner does
        fds = [int(v) for v in cfg["netns_fds"]]
        why = sandbox.join_net_namespace(fds[-1], fds[0] if len(fds) > 1 else None)
        assert why is None, why
        rows["netns"] = "joined"
        step = "unix sockets"
        covered, why = unix_sockets.hide(found)
        assert why is None, why
        rows["unix"] = f"{covered} of {len(found.paths)} hidden"
        step = "sandbox"
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = "lo"
        denials = sandbox.candidate_read_denials(Path(cfg["batch"]), Path(cfg["db"]), Path(cfg["root"]), [cfg["other"]])
        needs, own = sandbox.runner_needs(scratch, jit, model)
        rules = sandbox.read_rules(denials, needs, own)
        writable = sandbox.runner_writable(scratch, jit, "cuda")
        note = sandbox.restrict_writes(writable, scope_signals=True, readable=rules)
        kept = sandbox.drop_capabilities()
        assert note is None and kept is None, (note, kept)
        rows["sandbox"] = f"{len(rules)} read rules"
        step = "reads"
        leaked = []
        for what in ("secret", "db", "other_file", "readme"):
            try:
                open(cfg[what], "rb").close(); leaked.append(what)
            except OSError:
                pass
        rows["reads"] = "refused" if not leaked else "LEAKED " + ",".join(leaked)
        step = "listener"
        try:
            socket.create_connection(("127.0.0.1", cfg["listener"]), timeout=2).close(); rows["host listener"] = "REACHED"
        except OSError:
            rows["host listener"] = "unreachable"
        try:
            with socket.socket(socket.AF_UNIX) as u:
                u.settimeout(2); u.connect(cfg["unix_listener"])
            rows["host unix socket"] = "REACHED"
        except OSError:
            rows["host unix socket"] = "unreachable"
    else:
        rows["netns"] = rows["sandbox"] = "none (control)"
    step = "cuda init"
    import torch
    dev = torch.device("cuda", cfg["device"]); torch.cuda.set_device(dev); x = torch.ones(1 << 20, device=dev)
    rows["cuda"] = "ok"
    step = "group"
    import torch.distributed as dist
    from datetime import timedelta
    dist.init_process_group(cfg["backend"], init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=cfg["rank"],
                            world_size=cfg["ws"], timeout=timedelta(seconds=90))
    dist.all_reduce(x); torch.cuda.synchronize()
    assert float(x[0]) == cfg["ws"], float(x[0])
    rows[cfg["backend"]] = f"all_reduce ok x{cfg['ws']}"
    dist.destroy_process_group()
    step = "cupy"; import cupy
    k = cupy.RawKernel('extern "C" __global__ void k(float* a) { a[threadIdx.x] += %d.0f; }' % cfg["salt"], "k")
    with cupy.cuda.Device(cfg["device"]):
        a = cupy.zeros(32, dtype=cupy.float32); k((1,), (32,), (a,)); assert float(a.sum()) == 32 * cfg["salt"]
    rows["cupy"] = "ok"
    step = "triton"; import importlib.util
    source = scratch / "probe_triton.py"
    source.write_text("import triton, triton.language as tl\n@triton.jit\ndef add(p, n: tl.constexpr):\n"
                      f"    i = tl.arange(0, n); tl.store(p + i, tl.load(p + i) + {cfg['salt']})\n")
    spec = importlib.util.spec_from_file_location("probe_triton", source); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = torch.zeros(64, device=dev); mod.add[(1,)](t, 64); torch.cuda.synchronize(); assert float(t.sum()) == 64 * cfg["salt"]
    rows["triton"] = "ok"
    rows["jit cache"] = ",".join(sorted(p.name for p in jit.iterdir() if any(p.rglob("*"))))
except BaseException as exc:
    rows["failed"] = f"{step}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
out()
"""

READNET_COLUMNS = ("case", "rank", "netns", "unix", "sandbox", "reads", "host listener", "host unix socket", "cuda", "nccl", "gloo", "cupy", "triton",
                   "jit cache", "s", "failed")


def readnet() -> int:
    """The second part: one table row per rank, then NCCL's transports per case."""
    import json
    import shutil
    import socket
    import tempfile

    sys.path.insert(0, str(ROOT))
    import torch

    from pkb_tui.engine import sandbox

    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if gpus else '-'}, {gpus} GPU(s), "
          f"Landlock ABI {sandbox.landlock_abi()}, uid {os.getuid()}")
    # The unconfined control tells a limit of NCCL (two ranks on one GPU) from one of the sandbox.
    cases = [("nccl x1", 1, "nccl", [0], True), ("nccl x2, one GPU", 2, "nccl", [0, 0], True),
             ("nccl x2, one GPU, control", 2, "nccl", [0, 0], False),
             ("gloo x2, one GPU (shared-gpu)", 2, "gloo", [0, 0], True)]
    if gpus >= 2:
        cases.append(("nccl x2, two GPUs", 2, "nccl", [0, 1], True))
    from pkb_tui.engine.mps import MpsDaemon

    mps = MpsDaemon()
    if mps.start():  # shared-gpu mode as the launcher runs it: the ranks are the private daemon's clients
        cases.append(("gloo x2, one GPU, MPS (shared-gpu)", 2, "gloo", [0, 0], True))
    else:
        print(f"no MPS case: {mps.reason}")
    work = Path(tempfile.mkdtemp(prefix="probe-readnet-"))
    secret = Path.home() / ".pkb-probe-secret"
    secret.write_text("API_KEY=probe")
    db = work / "runs.db"
    db.write_text("db")
    other = work / "models" / "other"
    other.mkdir(parents=True)
    (other / "all_reduce.py").write_text("# another model's")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    unix_dir = Path(tempfile.mkdtemp(prefix="probe-unix-"))  # outside every allowed folder
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(str(unix_dir / "host.sock"))
    unix_listener.listen(8)
    unix_listener.setblocking(False)
    mps_servers = "no MPS case"
    rows: list[dict[str, object]] = []
    transports: dict[str, list[str]] = {}
    try:
        for index, (case, ws, backend, devices, confined) in enumerate(cases):
            made = sandbox.make_net_namespace()
            if isinstance(made, str):
                rows.append({"case": case, "failed": f"no namespace: {made}"})
                continue
            procs = []
            for rank in range(ws):
                batch = work / f"batch{index}"
                scratch = batch / "scratch" / f"rank{rank}"
                jit = work / f"jit{index}.{rank}"
                scratch.mkdir(parents=True)
                jit.mkdir(parents=True)
                cfg = {"root": str(ROOT), "rank": rank, "ws": ws, "backend": backend, "device": devices[rank],
                       "confined": confined,
                       "port": 29600 + index, "salt": index + 1, "netns_fds": [str(fd) for fd in made.fds()],
                       "scratch": str(scratch), "jit": str(jit), "model": str(work / "models" / "mine"),
                       "batch": str(batch), "db": str(db), "other": str(other), "other_file": str(other / "all_reduce.py"),
                       "secret": str(secret), "readme": str(ROOT / "README.md"), "listener": listener.getsockname()[1],
                       "unix_listener": str(unix_dir / "host.sock")}
                (work / "models" / "mine").mkdir(exist_ok=True)
                env = {**os.environ, "PKB_PROBE": json.dumps(cfg), "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "0",
                       **(mps.env if "MPS" in case else {})}
                procs.append(subprocess.Popen([sys.executable, "-c", READNET_RANK], env=env, pass_fds=made.fds(),
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            made.close()
            for rank, proc in enumerate(procs):
                try:
                    text, _ = proc.communicate(timeout=300)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    text, _ = proc.communicate()
                    text += "\nROW " + json.dumps({"rank": rank, "failed": "timed out"})
                found = [json.loads(line[4:]) for line in text.splitlines() if line.startswith("ROW ")]
                row = found[-1] if found else {"rank": rank, "failed": (text.strip().splitlines() or ["no output"])[-1][:200]}
                rows.append({"case": case, **row})
                transports.setdefault(case, []).extend(
                    line.split("NCCL INFO ", 1)[1] for line in text.splitlines() if " via " in line and "NCCL INFO" in line)
            if "MPS" in case:  # a server exists only once a client reached the control daemon
                listed = mps._control([], stdin="get_server_list\n", timeout_s=10).stdout.split()
                mps_servers = f"MPS servers after the case: {listed or 'NONE (the ranks did not reach the daemon)'}"
        try:
            listener.accept()
            arrived = "a connection ARRIVED at the host listener"
        except BlockingIOError:
            arrived = "nothing arrived at the host listener"
        try:
            unix_listener.accept()
            arrived += "; a connection ARRIVED at the host unix socket"
        except BlockingIOError:
            arrived += "; nothing arrived at the host unix socket"
    finally:
        listener.close()
        unix_listener.close()
        shutil.rmtree(unix_dir, ignore_errors=True)
        mps.stop()
        secret.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in READNET_COLUMNS}
    print(" | ".join(c.ljust(widths[c]) for c in READNET_COLUMNS))
    for r in rows:
        print(" | ".join(str(r.get(c, "")).ljust(widths[c]) for c in READNET_COLUMNS))
    print(arrived)
    print(mps_servers)
    for case, lines in transports.items():
        print(f"{case}: NCCL transports: " + ("; ".join(sorted(set(lines))[:6]) or "(none printed)"))
    confined_rows = [r for r in rows if not str(r.get("case", "")).endswith("control")]
    # A confined case that fails where its unconfined control fails the same way is the platform's
    # (NCCL refuses two ranks on one GPU), not the sandbox's: said, not counted.
    control_failed = {str(r["case"]).removesuffix(", control"): ":".join(str(r["failed"]).split(":")[:2])
                      for r in rows if str(r.get("case", "")).endswith("control") and r.get("failed")}
    excused = [r for r in confined_rows if r.get("failed") and control_failed.get(str(r["case"])) == ":".join(str(r["failed"]).split(":")[:2])]
    for r in excused:
        print(f"{r['case']} rank {r.get('rank')}: fails as its unconfined control does ({str(r['failed'])[:120]})")
    confined_rows = [r for r in confined_rows if r not in excused]
    ok = all("failed" not in r for r in confined_rows) and "ARRIVED" not in arrived and "NONE" not in mps_servers and all(
        r.get("reads") == "refused" and r.get("host listener") == "unreachable" and r.get("host unix socket") == "unreachable"
        for r in confined_rows)
    print("readnet: " + ("every rank ran with reads, network and named unix sockets confined" if ok
                         else "SOME RANK FAILED (see the table)"))
    return 0 if ok else 1


UNIX_CHECK = r"""
import ctypes, json, os, socket, sys
sys.path.insert(0, sys.argv[1])
from pkb_tui.engine import sandbox, unix_sockets
cfg = json.loads(sys.argv[2])
found = unix_sockets.find_host_sockets()
covered, why = unix_sockets.hide(found)
said = {"found": len(found.paths), "listed": found.listed, "covered": covered, "hide": why,
        "landlock": sandbox.restrict_writes(["/dev/null"], scope_signals=True), "caps": sandbox.drop_capabilities()}
for what, path in cfg["targets"].items():
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2); s.connect(path); s.sendall(what.encode())
        said[what] = "reached"
    except OSError as exc:
        said[what] = f"refused ({type(exc).__name__})"
said["umount"] = "LIFTED" if ctypes.CDLL(None, use_errno=True).umount2(cfg["targets"]["host"].encode(), 2) == 0 else "refused"
print(json.dumps(said))
"""


def unix_check() -> int:
    """Without CUDA: a fresh process hides the host's named sockets as a runner does; a socket this
    probe binds in a temp folder is refused, one in the MPS pipe folder (CUDA_MPS_PIPE_DIRECTORY
    pointed at a temp folder) is reached."""
    import json
    import shutil
    import socket
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="probe-unix-"))
    (work / "mps").mkdir()
    listeners = {}
    try:
        for what, path in (("host", work / "host.sock"), ("mps", work / "mps" / "control")):
            listeners[what] = socket.socket(socket.AF_UNIX)
            listeners[what].bind(str(path))
            listeners[what].listen(4)
            listeners[what].setblocking(False)
        cfg = {"targets": {"host": str(work / "host.sock"), "mps": str(work / "mps" / "control")}}
        out = subprocess.run([sys.executable, "-c", UNIX_CHECK, str(ROOT), json.dumps(cfg)], capture_output=True,
                             text=True, timeout=120, env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(work / "mps")})
        line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
        arrived = []
        for what, listener in listeners.items():
            try:
                listener.accept()
                arrived.append(what)
            except BlockingIOError:
                pass
    finally:
        for listener in listeners.values():
            listener.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"unix: {line}")
    print(f"unix: connections arrived at: {arrived or 'none'}")
    try:
        said = json.loads(line)
    except ValueError:
        return 1
    ok = (said["hide"] is None and said["host"].startswith("refused") and said["mps"] == "reached"
          and said["umount"] == "refused" and arrived == ["mps"])
    print("unix: " + ("the host's named sockets hidden, the MPS folder's reached" if ok else "FAILED"))
    return 0 if ok else 1


def main() -> int:
    if "--help" in sys.argv[1:] or "-h" in sys.argv[1:]:
        print(__doc__)
        return 0
    if "--unix" in sys.argv[1:]:
        return unix_check()
    if "--readnet" in sys.argv[1:]:
        return readnet()
    for index, keys in enumerate(SETS):
        code = ATTEMPT.format(root=str(ROOT), keys=keys, port=str(29577 + index), salt=index + 1)
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            line = (out.stdout.strip().splitlines() or [out.stderr.strip()[-300:]])[-1]
        except subprocess.TimeoutExpired:
            line = "timed out"
        print(f"writable {'+'.join(keys)}: {line}", flush=True)
    return readnet()


if __name__ == "__main__":
    sys.exit(main())
