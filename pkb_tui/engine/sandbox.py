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
import pwd
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

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
_READ_FILE, _READ_DIR = 1 << 2, 1 << 3  # ABI 1: the read rights (a runner's reads, engine.runner)
_FILE_RIGHTS = (1 << 1) | _TRUNCATE | _READ_FILE  # the rights that apply to a file (not a folder)
READ_ALL = _READ_FILE | _READ_DIR
LIST_ONLY = _READ_DIR  # list a folder's (and its subfolders') names, read no file


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


def restrict_writes(writable: Iterable[str | Path], *, scope_signals: bool = False,
                    readable: dict[Path, int] | None = None) -> str | None:
    """Limit this process (and what it starts) to writing beneath ``writable``; None if done,
    else why not. Irreversible for the process.

    ``scope_signals`` (a runner): on Landlock ABI 6+, also refuse signals
    to processes outside this domain, so a candidate cannot stop or kill its judge.
    ``readable`` (a candidate's runner, from ``read_rules``): reads too are refused but beneath
    these paths (each with READ_ALL or LIST_ONLY) and the writable ones."""
    abi = landlock_abi()
    if abi <= 0:
        return ("no write sandbox: this kernel has no Landlock (Linux 5.13+ with landlock in its LSM list)"
                + ("; reads not restricted" if readable is not None else ""))
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    rights = write_rights(abi) | (READ_ALL if readable is not None else 0)
    attr: ctypes.Structure
    if scope_signals and abi >= 6:
        attr = _ScopedRulesetAttr(rights, 0, _SCOPE_SIGNAL)  # not unix sockets: sibling runners (NCCL) use them
    else:
        attr = _RulesetAttr(rights)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"no write sandbox: landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        rules = {Path(p): rights for p in writable}
        for path, granted in (readable or {}).items():
            rules.setdefault(path, granted)
        for folder, granted in rules.items():
            try:
                fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a folder that does not exist needs no rule
            try:
                # A file (a device such as /dev/null) takes only the rights a file can have.
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                allowed = granted if is_dir else granted & _FILE_RIGHTS
                if not allowed:
                    continue  # LIST_ONLY on a file: nothing to grant
                rule = _PathBeneathAttr(allowed, fd)
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


# ---------------------------------------------------------------------------------------- reads
# Landlock grants, it cannot deny: a rule on a folder opens everything beneath it. "Everything but
# P" is therefore built by walking from / towards each denied path and granting, at every level,
# the siblings on the way (a folder with nothing denied beneath it takes one rule). What is created
# later in a folder that was walked through (a database's -wal, a new file in /tmp) matches no rule
# and cannot be read; the runner's own folders are made before it sandboxes itself.
_SYSTEM_READS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys",
                 "/dev", "/run")
CODE_FOLDERS = ("pkb_tui", "collectors", "tasks")  # what a candidate may still import from the project


@dataclass(frozen=True)
class ReadDenials:
    """What a candidate's runner may not read. ``hard``: never, whatever else says so (the database
    and its sidecars, the batch folder, other models' folders); only the runner's own folders
    beneath them are granted. ``soft``: not, but what the runner needs beneath them is granted
    back (the homes, where a virtualenv may live; the project, whose code folders stay importable)."""

    hard: tuple[str, ...]
    soft: tuple[str, ...]
    project_root: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"hard": list(self.hard), "soft": list(self.soft), "project_root": self.project_root}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReadDenials:
        return cls(tuple(data.get("hard") or ()), tuple(data.get("soft") or ()), data.get("project_root"))


def homes() -> list[Path]:
    """The user's home folders: $HOME, the account's, /root, and sudo's caller's."""
    found = [Path.home(), Path("/root")]
    for uid_or_name in (os.getuid(), os.environ.get("SUDO_USER")):
        if uid_or_name is None:
            continue
        try:
            entry = pwd.getpwuid(uid_or_name) if isinstance(uid_or_name, int) else pwd.getpwnam(uid_or_name)
            found.append(Path(entry.pw_dir))
        except (KeyError, OSError):
            pass
    return list(dict.fromkeys(found))


def candidate_read_denials(batch_dir: Path, db_path: Path | None, project_root: Path | None,
                           other_model_dirs: Iterable[str | Path], shared_dirs: Iterable[str | Path] = ()) -> ReadDenials:
    """The judge's half: what a candidate of this batch may not read (engine.worker).
    ``shared_dirs`` (the runs folder: other batches; the JIT caches' root: other models') are
    soft: a sys.path entry beneath them stays readable (a --runs-dir that holds the virtualenv)."""
    hard: list[Path] = [Path(batch_dir), *(Path(p) for p in other_model_dirs)]
    if db_path is not None:
        db = Path(db_path)
        hard += [db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal"))]
        hard += sorted(db.parent.glob(f"{glob.escape(db.stem)}.recovery-*.jsonl"))
    soft = [*homes(), *(Path(p) for p in shared_dirs)]
    project = None
    # A source checkout only: an installed package's "project root" is site-packages.
    if project_root is not None and (Path(project_root) / "pyproject.toml").is_file():
        project = Path(project_root)
        soft.append(project)
    return ReadDenials(tuple(real_path(p) for p in hard), tuple(real_path(p) for p in soft),
                       real_path(project) if project is not None else None)


def runner_needs(scratch_dir: Path, jit_dir: Path, model_dir: str | Path | None) -> tuple[list[Path], list[Path]]:
    """The runner's half: (what it needs to read, its own folders). Python's prefixes and every
    sys.path entry, CUDA, the MPS folders, the PKB clone; its scratch, JIT cache and model folder."""
    needs = [Path(p) for p in _SYSTEM_READS]
    needs += [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)]
    needs += [Path(p) for p in sys.path if p]
    needs += [Path(os.environ[e]) for e in ("CUDA_HOME", "CUDA_PATH", "CUDA_MPS_PIPE_DIRECTORY",
                                            "CUDA_MPS_LOG_DIRECTORY", "PKB_ROOT") if os.environ.get(e)]
    needs += [Path(p) for p in glob.glob("/usr/local/cuda*")]
    own = [Path(scratch_dir), Path(jit_dir), *([Path(model_dir)] if model_dir else [])]
    return needs, own


def read_rules(denials: ReadDenials, needs: Iterable[Path], own: Iterable[Path]) -> dict[Path, int]:
    """The Landlock read rules (path -> rights) for "everything but ``denials``, and ``needs``
    and ``own`` even beneath a soft denial". Paths are compared as real-path strings (fast: a
    /tmp of hundreds of entries is walked on every runner's start)."""
    hard = set(denials.hard)
    soft = set(denials.soft)
    project = denials.project_root
    rules: dict[str, int] = {}

    def grant(path: str, denied: set[str]) -> None:
        prefix = path.rstrip("/") + "/"
        if not any(d.startswith(prefix) for d in denied):
            rules[path] = rules.get(path, 0) | READ_ALL
            return
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:
            # A link is reached through where it points (Landlock checks the real path).
            if entry.is_symlink() or any(_within(entry.path, d) for d in denied):
                continue
            grant(entry.path, denied)

    everything = hard | soft
    if not any(_within("/", d) for d in everything):  # a home that is / denies it all: only needs then
        grant("/", everything)
    if project is not None:
        needs = [*needs, *(Path(project) / name for name in CODE_FOLDERS)]
    for raw in needs:
        path = real_path(raw)
        if not os.path.exists(path) or any(_within(path, d) for d in hard):
            continue
        # Beneath a soft denial (a virtualenv in the home): granted back, what is denied beneath stays.
        denied = hard | {d for d in soft if d == path or not _within(path, d)}
        if any(_within(path, d) for d in denied):
            # The project itself on sys.path: its names may be listed (imports scan the folder),
            # none of its files read but the code folders'.
            if path == project:
                rules[path] = rules.get(path, 0) | LIST_ONLY
            continue
        grant(path, denied)
    for raw in own:
        path = real_path(raw)
        if os.path.exists(path):
            grant(path, {d for d in everything if not _within(path, d)})
    return {Path(p): rights for p, rights in rules.items()}


def _within(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or beneath it (real-path strings)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def real_path(path: str | Path) -> str:
    return os.path.realpath(os.path.abspath(path))


# -------------------------------------------------------------------------------------- network
# One network namespace per candidate group on a host: only loopback, brought up. The group's
# runners join it before they sandbox themselves, so their rendezvous (the TCPStore of runner 0 at
# 127.0.0.1) and NCCL's and gloo's own sockets reach each other and nothing else: not the judges'
# store, not a listener on the host's 127.0.0.1, not the outside. A namespace needs no process to
# live: its descriptor (or a member) keeps it. It is made by a short helper process, as root with
# unshare(CLONE_NEWNET), unprivileged inside a user namespace of its own (where the kernel allows
# one); the helper hands back the descriptors and exits.
_CLONE_NEWNET, _CLONE_NEWUSER = 0x40000000, 0x10000000
_NETNS_HELPER = r"""
import ctypes, fcntl, json, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
sock = socket.socket(fileno=int(sys.argv[1]))
uid, gid = os.geteuid(), os.getegid()
fds, user = [], False
try:
    if sys.argv[2] == "user" or libc.unshare(0x40000000) != 0:
        first = "skipped" if sys.argv[2] == "user" else os.strerror(ctypes.get_errno())
        if libc.unshare(0x10000000 | 0x40000000) != 0:
            raise OSError(f"unshare(CLONE_NEWNET) failed ({first}) and so did a user namespace's "
                          f"({os.strerror(ctypes.get_errno())})")
        user = True
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # loopback up: SIOCGIFFLAGS, SIOCSIFFLAGS
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))
    if user:
        fds.append(os.open("/proc/self/ns/user", os.O_RDONLY))
    fds.append(os.open("/proc/self/ns/net", os.O_RDONLY))
    socket.send_fds(sock, [json.dumps({"user": user}).encode()], fds)
except Exception as exc:
    sock.sendall(json.dumps({"error": str(exc)}).encode())
"""


@dataclass
class NetNamespace:
    """A candidate group's network namespace: its descriptor (and its user namespace's, when made
    without root). ``close`` drops this process's hold; members keep it alive."""

    net_fd: int
    user_fd: int | None = None

    def fds(self) -> list[int]:
        return [fd for fd in (self.user_fd, self.net_fd) if fd is not None]

    def close(self) -> None:
        for fd in self.fds():
            try:
                os.close(fd)
            except OSError:
                pass


def make_net_namespace(timeout_s: float = 30.0) -> NetNamespace | str:
    """A new network namespace with only loopback up, or one sentence saying why none was made.
    With CAP_SYS_ADMIN (root) a thread of this process makes it (unshare moves only that thread,
    which then ends: ~1 ms); otherwise a helper process, in a user namespace of its own (unshare
    of a user namespace wants a process with one thread)."""
    made = _net_namespace_in_thread()
    if isinstance(made, NetNamespace):
        return made
    return _net_namespace_by_helper(timeout_s)


def _net_namespace_in_thread() -> NetNamespace | str:
    import fcntl
    import socket
    import struct
    import threading

    result: list[NetNamespace | str] = []

    def work() -> None:
        libc = _libc()
        if libc.unshare(ctypes.c_int(_CLONE_NEWNET)) != 0:
            result.append(f"unshare(CLONE_NEWNET) failed ({os.strerror(ctypes.get_errno())})")
            return
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # loopback up: SIOCGIFFLAGS, SIOCSIFFLAGS
                flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
                fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))
            result.append(NetNamespace(os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)))
        except OSError as exc:
            result.append(f"bringing loopback up failed ({exc})")

    # A thread of its own, which ends with the namespace it moved into: no other thread moves.
    thread = threading.Thread(target=work, name="pkb-netns")
    thread.start()
    thread.join()
    return result[0] if result else "the namespace thread failed"


def _net_namespace_by_helper(timeout_s: float, *, user: bool = False) -> NetNamespace | str:
    """``user``: straight to a user namespace (what an unprivileged judge gets; tests)."""
    import json
    import select
    import socket
    import subprocess

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _NETNS_HELPER, str(theirs.fileno()),
                                 "user" if user else "any"],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={})
    except OSError as exc:
        ours.close()
        return f"the namespace helper did not start ({exc})"
    finally:
        theirs.close()
    try:
        if not select.select([ours], [], [], timeout_s)[0]:
            return f"the namespace helper did not answer within {timeout_s:g} s"
        data, fds, _, _ = socket.recv_fds(ours, 4096, 2)
        reply = json.loads(data or b"{}")
        if "error" in reply or len(fds) != (2 if reply.get("user") else 1):
            for fd in fds:
                os.close(fd)
            return str(reply.get("error") or "the namespace helper broke its protocol")
        return NetNamespace(net_fd=fds[-1], user_fd=fds[0] if reply.get("user") else None)
    except (OSError, ValueError) as exc:
        return f"the namespace helper failed ({exc})"
    finally:
        ours.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


def join_net_namespace(net_fd: int, user_fd: int | None = None) -> str | None:
    """Move this process into a candidate group's namespace (before the sandbox and the capability
    drop: setns needs CAP_SYS_ADMIN there). None when done, else why not. Both calls act on the
    calling thread only, so a process that already runs other threads is refused."""
    from pkb_tui.engine.procs import threads_after_exits

    threads = threads_after_exits()
    if threads > 1:
        return f"it already ran {threads} threads (setns moves only the calling one)"
    libc = _libc()
    if user_fd is not None and libc.setns(ctypes.c_int(user_fd), ctypes.c_int(_CLONE_NEWUSER)) != 0:
        return f"setns(user namespace) failed ({os.strerror(ctypes.get_errno())})"
    if libc.setns(ctypes.c_int(net_fd), ctypes.c_int(_CLONE_NEWNET)) != 0:
        return f"setns(network namespace) failed ({os.strerror(ctypes.get_errno())})"
    return None
