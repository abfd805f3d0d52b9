"""The host's named (path) unix sockets, hidden from a candidate's runner.

Landlock up to ABI 7 does not check connect(2) on a path socket, a root candidate passes its file
modes, and a network namespace covers abstract sockets only: /run/docker.sock, systemd's
/run/systemd/private, a database's or an X server's socket would otherwise be one connect away.
So each candidate runner, before any candidate code and while it still has its capabilities,
moves into a mount namespace of its own (propagation private, recursively: nothing it mounts
reaches the host) and bind-mounts /dev/null over every named socket of the host it finds, but
those beneath the MPS pipe folder (CUDA's clients reach their daemon there) and the operator's
``PKB_SANDBOX_UNIX_ALLOW``. A connect to a covered path then meets a character device and is
refused (ECONNREFUSED); the cover cannot be lifted once the runner has dropped its capabilities
and put itself under Landlock (umount refused: EPERM), nor from a user namespace the candidate
makes (the covers are copied locked with the mounts beneath them).

Where the sockets are found (``find_host_sockets``, in the host's network namespace, i.e. before
the runner joins its group's):
- /proc/net/unix: every socket bound to an absolute path in this network namespace;
- a scan of the usual socket folders (/run, /tmp, /var/tmp, /dev; a few levels, one file system
  each): sockets bound from another network namespace (a container's, a service's private one),
  which /proc/net/unix of this one does not list;
- /proc/self/mountinfo: a socket bind-mounted onto a file elsewhere, and the other paths to a
  found socket through another mount of its file system (a folder bind-mounted elsewhere).
Not covered (architecture.md, "Named unix sockets"): a socket bound after the runner started, a
hard link to one outside the scanned folders, a socket that /proc/net/unix lists by a relative
name and that lives outside them. Abstract sockets belong to a network namespace: the group's own
has none of the host's.

Without root a runner that joined its group's user namespace holds CAP_SYS_ADMIN there, which is
enough; otherwise (no network namespace) it makes a user namespace of its own first.
"""

from __future__ import annotations

import ctypes
import os
import stat
from dataclasses import dataclass, field

from pkb_tui.engine import procs

SWITCH = "PKB_SANDBOX_UNIX"  # "0": leave the host's named sockets reachable (said in the notes)
ALLOW = "PKB_SANDBOX_UNIX_ALLOW"  # folders or sockets (":"-separated) a runner may still reach
RUNNER_FLAG = "PKB_HIDE_UNIX_SOCKETS"  # set by the judge in a candidate runner's environment
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"  # where CUDA's MPS clients look when CUDA_MPS_PIPE_DIRECTORY is unset
COVER = "/dev/null"
# (folder, levels scanned beneath it): where sockets usually live
SCAN = (("/run", 4), ("/tmp", 2), ("/var/tmp", 2), ("/dev", 2))
SCAN_MAX_ENTRIES = 20_000  # per folder: a huge /tmp is not walked to its end on every runner's start

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 1 << 18


def unrestricted_reason() -> str | None:
    """Why the host's named sockets stay reachable for this batch's candidates (None: hidden)."""
    if os.environ.get("PKB_SANDBOX", "1") == "0":
        return "PKB_SANDBOX=0"
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    return None


def runner_env() -> dict[str, str]:
    """What the judge adds to a candidate runner's environment (nothing when switched off)."""
    return {RUNNER_FLAG: "1"} if unrestricted_reason() is None else {}


def allowed_folders(env: dict[str, str] | None = None) -> list[str]:
    """Where a runner may still reach named sockets: the MPS pipe folder (its own or CUDA's
    default) and what ``PKB_SANDBOX_UNIX_ALLOW`` names."""
    env = dict(os.environ) if env is None else env
    folders = [env.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE]
    folders += [p for p in (env.get(ALLOW) or "").split(":") if p]
    return [_real(p) for p in folders]


@dataclass
class HostSockets:
    """The named sockets found, by real path, and how they were found (for the cost figures)."""

    paths: list[str] = field(default_factory=list)
    listed: int = 0      # distinct absolute paths in /proc/net/unix
    relative: int = 0    # names in /proc/net/unix that are not absolute (bound relative to a cwd)
    scanned: int = 0     # entries looked at by the folder scan


def find_host_sockets(allowed: list[str] | None = None) -> HostSockets:
    """The host's named sockets that a runner must not reach (those beneath ``allowed`` left
    out). Call it in the host's network namespace: /proc/net/unix lists the reader's."""
    allowed = allowed_folders() if allowed is None else allowed
    found = HostSockets()
    candidates: list[str] = []
    listed, found.relative = _listed_paths()
    found.listed = len(listed)
    candidates += listed
    for folder, depth in SCAN:
        paths, seen = _scan(folder, depth)
        candidates += paths
        found.scanned += seen
    mounts = _mountinfo()
    candidates += [m.point for m in mounts if _is_socket(m.point)]
    keys: dict[tuple[int, int], str] = {}
    real: dict[str, None] = {}
    for path in candidates:
        target = _real(path)
        if target in real or any(_within(target, a) for a in allowed):
            continue
        key = _socket_key(target)
        if key is not None:
            real[target] = None
            keys[key] = target
    for target in list(real):
        for alias in _aliases(target, mounts):
            if alias in real or any(_within(alias, a) for a in allowed):
                continue
            if _socket_key(alias) in keys:
                real[alias] = None
    found.paths = list(real)
    return found


def _socket_key(path: str) -> tuple[int, int] | None:
    """(device, inode) of the socket at ``path``; None when it is not one or cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def hide(sockets: HostSockets) -> tuple[int, str | None]:
    """In this (single-threaded) process: a mount namespace of its own, propagation private, and
    /dev/null bound over each of ``sockets``. (covered, None) when done; else the sentence for the
    run's notes ("named unix sockets reachable: ..."). Irreversible for the process."""
    threads = procs.threads_after_exits()
    if threads > 1:
        return 0, f"named unix sockets reachable: the runner already ran {threads} threads (unshare needs one)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(_CLONE_NEWNS)) != 0:
        first = os.strerror(ctypes.get_errno())
        why = _own_user_namespace(libc)
        if why is not None:
            return 0, f"named unix sockets reachable: unshare(CLONE_NEWNS) failed ({first}) and {why}"
    if libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None) != 0:
        errno = ctypes.get_errno()
        # Landlock refuses every mount to a process in a domain: a runner its (sandboxed) judge
        # started itself, not the fork server (PKB_FORKSERVER=0, or the server failed).
        hint = ("; a runner started by its sandboxed judge (PKB_FORKSERVER=0, or a failed fork server) is under "
                "Landlock, which refuses mounts") if errno == 1 else ""
        return 0, f"named unix sockets reachable: making the mounts private failed ({os.strerror(errno)}{hint})"
    covered = 0
    failed: list[str] = []
    for path in sockets.paths:
        if libc.mount(COVER.encode(), os.fsencode(path), None, ctypes.c_ulong(_MS_BIND), None) == 0:
            covered += 1
            continue
        errno = ctypes.get_errno()
        if errno in (2, 13):  # gone since it was found; or behind a folder this runner cannot enter anyway
            continue
        failed.append(f"{path}: {os.strerror(errno)}")
    if failed:
        return covered, (f"named unix sockets reachable: {len(failed)} of {len(sockets.paths)} could not be "
                         f"covered ({failed[0]})")
    return covered, None


def _own_user_namespace(libc: ctypes.CDLL) -> str | None:
    """Without CAP_SYS_ADMIN (no root, no group user namespace joined): a user namespace of this
    process's own, mapping only its ids, then the mount namespace. None when done."""
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNS)) != 0:
        return f"so did a user namespace's ({os.strerror(ctypes.get_errno())})"
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as exc:
        return f"mapping ids into a user namespace failed ({exc})"
    return None


def _listed_paths() -> tuple[list[str], int]:
    """Absolute paths of the sockets bound in this network namespace, and how many names were
    relative (bound against some process's working folder: not resolvable from here)."""
    paths: dict[str, None] = {}
    relative = 0
    try:
        with open("/proc/net/unix", "rb") as f:
            next(f, None)
            for line in f:
                fields = line.rstrip(b"\n").split(None, 7)
                if len(fields) < 8:
                    continue  # unbound (a socketpair, a client)
                name = fields[7]
                if name.startswith(b"@"):
                    continue  # abstract: the network namespace's business
                if name.startswith(b"/"):
                    paths[os.fsdecode(name)] = None
                else:
                    relative += 1
    except OSError:
        pass
    return list(paths), relative


def _scan(folder: str, depth: int) -> tuple[list[str], int]:
    """Sockets beneath ``folder`` (``depth`` levels, its own file system only), and the number of
    entries looked at."""
    found: list[str] = []
    seen = 0
    try:
        root_dev = os.stat(folder).st_dev
    except OSError:
        return found, seen
    stack = [(folder, 0)]
    while stack and seen < SCAN_MAX_ENTRIES:
        path, level = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and level + 1 < depth and st.st_dev == root_dev:
                stack.append((entry.path, level + 1))
    return found, seen


@dataclass(frozen=True)
class _Mount:
    dev: str    # major:minor of its file system
    root: str   # the folder of that file system it shows
    point: str  # where


def _mountinfo() -> list[_Mount]:
    mounts = []
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 5:
                    mounts.append(_Mount(fields[2].decode(), _unescape(fields[3]), _unescape(fields[4])))
    except OSError:
        pass
    return mounts


def _aliases(path: str, mounts: list[_Mount]) -> list[str]:
    """Other paths to ``path``'s file through the other mounts of its file system (a folder bound
    elsewhere): the file's path within its file system, seen from each mount that shows it."""
    holders = [m for m in mounts if _within(path, m.point)]
    if not holders:
        return []
    # The mount that shows it: the deepest mount point, the last mounted there.
    deepest = max(len(m.point) for m in holders)
    mount = [m for m in holders if len(m.point) == deepest][-1]
    inner = _join(mount.root, os.path.relpath(path, mount.point))
    aliases = []
    for other in mounts:
        if other.dev == mount.dev and other is not mount and _within(inner, other.root):
            alias = _join(other.point, os.path.relpath(inner, other.root))
            if alias != path:
                aliases.append(alias)
    return aliases


def _join(folder: str, relative: str) -> str:
    return os.path.normpath(folder if relative == "." else os.path.join(folder, relative))


def _unescape(field_bytes: bytes) -> str:
    """mountinfo's octal escapes (space, tab, newline, backslash)."""
    text = os.fsdecode(field_bytes)
    for code in ("\\040", "\\011", "\\012", "\\134"):
        text = text.replace(code, chr(int(code[1:], 8)))
    return text


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))
