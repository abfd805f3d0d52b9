"""Where a rank process may write: Linux Landlock, unprivileged, applied by each rank to itself
before any candidate is imported.

Candidates are untrusted code and run in runner processes of their own (engine.runner); a runner
may create, write, truncate, rename or remove files only beneath ``runner_writable``: its scratch
folder, its model's JIT caches, a few device files and its own /proc entry. Reading and executing
stay open (they need torch, CUDA, their own folder). The judges (trusted, engine.worker) write
beneath ``default_writable``: the batch folder, temp folders, /dev, /proc, MPS and the JIT caches'
root. Everything else — the project (tasks/, pkb_tui/, solutions/), the database, the rest of the
home folder — cannot be changed by a rank.

``restrict_writes`` returns None when the rule is in force, else one sentence saying why not
(a kernel without Landlock, seccomp refusing the calls); the run then says so in its notes.
Files opened before the call stay writable, as Landlock intends.
"""

from __future__ import annotations

import ctypes
import glob
import os
import stat
from pathlib import Path
from typing import Iterable

# Syscall numbers are the same on x86-64 and aarch64 (Landlock came after the tables unified).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* rights that change the file system, by the ABI version that added them.
_WRITE_RIGHTS_ABI1 = (
    (1 << 1)     # WRITE_FILE
    | (1 << 4)   # REMOVE_DIR
    | (1 << 5)   # REMOVE_FILE
    | (1 << 6)   # MAKE_CHAR
    | (1 << 7)   # MAKE_DIR
    | (1 << 8)   # MAKE_REG
    | (1 << 9)   # MAKE_SOCK
    | (1 << 10)  # MAKE_FIFO
    | (1 << 11)  # MAKE_BLOCK
    | (1 << 12)  # MAKE_SYM
)
_REFER = 1 << 13     # ABI 2: link or rename across folders
_TRUNCATE = 1 << 14  # ABI 3
_FILE_RIGHTS = (1 << 1) | _TRUNCATE  # WRITE_FILE, TRUNCATE: the write rights that apply to a file


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _ScopedRulesetAttr(ctypes.Structure):
    # ABI 6: scoped = which IPC may not reach processes outside this domain.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (or it is switched off)."""
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return int(version) if version > 0 else 0


def write_rights(abi: int) -> int:
    rights = _WRITE_RIGHTS_ABI1
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    return rights


def default_writable(batch_dir: Path, extra: Iterable[str | Path] = ()) -> list[Path]:
    """The folders a rank needs to write to (created where a cache folder is missing, so a JIT
    cache's first use does not fail on a folder it may no longer create)."""
    home = Path.home()
    caches = _jit_caches([home / ".cache", home / ".nv", home / ".cupy", home / ".triton"], "XDG_CACHE_HOME")
    temp = {Path(os.environ.get("TMPDIR") or "/tmp"), Path("/tmp"), Path("/var/tmp")}
    mps = [Path(os.environ[e]) for e in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY") if os.environ.get(e)]
    # /proc: the CUDA driver writes there while it starts (cudaGetDeviceCount fails with error 304
    # otherwise; measured on the H200 by bench/sandbox_cuda_probe.py). Landlock also confines
    # ptrace, so a sandboxed rank still cannot write another process's /proc/PID/mem.
    jit_root = jit_cache_dir("")  # the runners' own JIT caches are made by their judge
    return [Path(batch_dir), *sorted(temp), Path("/dev"), Path("/proc"), *mps, *caches, jit_root,
            *(Path(p) for p in extra)]


def restrict_writes(writable: Iterable[str | Path], *, scope_signals: bool = False) -> str | None:
    """Limit this process (and what it starts) to writing beneath ``writable``; None if done,
    else why not. Irreversible for the process.

    ``scope_signals`` (a runner): on Landlock ABI 6+, also refuse signals
    to processes outside this domain, so a candidate cannot stop or kill its judge."""
    abi = landlock_abi()
    if abi <= 0:
        return "no write sandbox: this kernel has no Landlock (Linux 5.13+ with landlock in its LSM list)"
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    rights = write_rights(abi)
    attr: ctypes.Structure
    if scope_signals and abi >= 6:
        attr = _ScopedRulesetAttr(rights, 0, _SCOPE_SIGNAL)  # not unix sockets: sibling runners (NCCL) use them
    else:
        attr = _RulesetAttr(rights)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"no write sandbox: landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        for folder in dict.fromkeys(Path(p) for p in writable):
            try:
                fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a folder that does not exist needs no rule
            try:
                # A file (a device such as /dev/null) takes only the rights a file can have.
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                rule = _PathBeneathAttr(rights if is_dir else rights & _FILE_RIGHTS, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    return f"no write sandbox: landlock_add_rule({folder}) failed ({os.strerror(ctypes.get_errno())})"
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"no write sandbox: prctl(NO_NEW_PRIVS) failed ({os.strerror(ctypes.get_errno())})"
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            return f"no write sandbox: landlock_restrict_self failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return None


def runner_writable(scratch_dir: Path, jit_dir: Path, device_type: str, pid: int | None = None) -> list[Path]:
    """Where a runner (the process that imports candidate code) may write: its own scratch folder
    (TMPDIR points there), its model's own JIT caches (jit_env), the null, zero and full devices
    and its own /proc entry; nothing shared with another model. Not the batch folder (events,
    logs, other runs), not /tmp or /var/tmp, not the project or the database, not /proc/sys or
    another process's /proc entry.

    On a GPU also the NVIDIA device files, the MPS folders and /dev/shm. Measured on the H200
    (bench/sandbox_cuda_probe.py, bench/ipc_sandbox_probe.py): CUDA's start, NCCL at one rank, a
    CuPy and a Triton kernel compiled into the JIT cache work without /dev/shm, but opening the
    judge's arena through torch's CUDA IPC does not ("mapping of buffer object failed"): the
    export leaves a reference-count file (torch_<pid>_*) and the driver's cuda.shm.<uid>.<pid>
    in /dev/shm, which the importer opens for writing. NCCL between ranks keeps its segments
    there too. So a CUDA runner can write /dev/shm (stated in architecture.md, "sandbox")."""
    own = Path(f"/proc/{pid if pid is not None else os.getpid()}")
    folders = [Path(scratch_dir), jit_dir, Path("/dev/null"), Path("/dev/zero"), Path("/dev/full"), own]
    if device_type != "cuda":
        return folders
    devices = sorted(Path(p) for pattern in ("/dev/nvidia*", "/dev/dri/*") for p in glob.glob(pattern))
    mps = [Path(os.environ[e]) for e in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY") if os.environ.get(e)]
    return [*folders, *devices, *mps, Path("/dev/shm")]


def jit_cache_dir(model_key: str) -> Path:
    """One model's JIT caches (torch extensions, CuPy, Triton, CUDA's, Inductor's): kept between
    batches, so a model compiles once, and never shared, so one model cannot plant a build that
    another loads. PKB_JIT_CACHE moves the root."""
    root = Path(os.environ.get("PKB_JIT_CACHE") or Path.home() / ".cache" / "pkb-tui" / "jit")
    return root / model_key


def jit_env(jit_dir: Path) -> dict[str, str]:
    """A runner's environment pointing every JIT cache it may write at ``jit_dir``."""
    return {
        "TORCH_EXTENSIONS_DIR": str(jit_dir / "torch_extensions"), "CUPY_CACHE_DIR": str(jit_dir / "cupy"),
        "TRITON_CACHE_DIR": str(jit_dir / "triton"), "CUDA_CACHE_PATH": str(jit_dir / "nv"),
        "TORCHINDUCTOR_CACHE_DIR": str(jit_dir / "inductor"), "XDG_CACHE_HOME": str(jit_dir / "xdg"),
    }


_PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 23, 24, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> str | None:
    """Give up every capability for good (bounding set, ambient, effective, permitted): a root
    candidate can then not load kernel modules, trace or signal others, mount, or override file
    permissions. None when done, else why not. For the calling thread and what it starts, so
    called before a runner starts any thread of its own."""
    libc = _libc()
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_READ, cap, 0, 0, 0) < 0:
            break  # past the kernel's last capability
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # refused without CAP_SETPCAP: nothing to drop then
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    try:
        if libc.capset(ctypes.byref(header), data) != 0:
            return f"capabilities kept: capset failed ({os.strerror(ctypes.get_errno())})"
    except AttributeError:
        return "capabilities kept: this C library has no capset"
    return None


def _jit_caches(folders: list[Path], *extra_env: str) -> list[Path]:
    """The JIT caches' folders (and those the environment names), created where missing, so a
    cache's first use does not fail on a folder the sandbox no longer lets it create."""
    for env in ("CUPY_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH", *extra_env):
        if os.environ.get(env):
            folders.append(Path(os.environ[env]))
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
    return folders
