"""The narrow interface between a judge (a torchrun rank) and the runner process that calls a
solution for it (engine.runner).

Messages are length-prefixed JSON both ways over two pipes, so the judge never unpickles anything a
candidate process wrote. Tensors never travel in messages: they live in an *arena* the judge owns,
a block of shared memory (a memfd on CPU, a CUDA allocation shared through a CUDA IPC handle on a
GPU), which the runner maps once. A *layout* names where each tensor of a value sits in the arena
(offset, dtype, shape) and carries the non-tensor leaves as JSON values, so the same description
rebuilds the value on both sides. The judge writes inputs there and reads outputs back from there,
in its own process, after the runner says it is done; what the candidate did in between can change
bytes in the arena and nothing else of the judge.
"""

from __future__ import annotations

import base64
import json
import mmap
import os
import select
import struct
import time
from typing import Any

import torch

from pkb_tui.errors import PkbError

MAX_MESSAGE_BYTES = 8 * 2**20  # a runner's reply larger than this is a protocol breach
ALIGN_BYTES = 256

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "float64", torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.complex64: "complex64", torch.complex128: "complex128", torch.int64: "int64", torch.int32: "int32",
    torch.int16: "int16", torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
}
DTYPES_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}


class ChannelError(Exception):
    """The other end broke the protocol, went away or did not answer in time."""


# ---------------------------------------------------------------------------------------- framing
def send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    payload = struct.pack(">I", len(data)) + data
    view = memoryview(payload)
    while view:
        try:
            written = os.write(fd, view)
        except BrokenPipeError as exc:
            raise ChannelError("the other end closed the channel") from exc
        view = view[written:]


def _read_exact(fd: int, count: int, deadline: float | None) -> bytes:
    chunks: list[bytes] = []
    while count > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelError("no answer before the deadline")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise ChannelError("no answer before the deadline")
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            raise ChannelError("the other end closed the channel")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def spin_until_readable(fd: int, spin_s: float) -> bool:
    """Poll ``fd`` without sleeping for up to ``spin_s``; True once it has data."""
    end = time.monotonic() + spin_s
    while time.monotonic() < end:
        if select.select([fd], [], [], 0)[0]:
            return True
    return False


def receive(fd: int, deadline: float | None = None, spin_s: float = 0.0) -> dict[str, Any]:
    """One message; ChannelError on a closed pipe, a deadline passed, or anything malformed.
    ``spin_s``: first poll that long without sleeping (an answer expected within it)."""
    if spin_s > 0:
        spin_until_readable(fd, spin_s)
    (length,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
    if length > MAX_MESSAGE_BYTES:
        raise ChannelError(f"a message of {length} bytes (the limit is {MAX_MESSAGE_BYTES})")
    try:
        message = json.loads(_read_exact(fd, length, deadline))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ChannelError(f"a message that is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ChannelError("a message that is not a JSON object")
    return message


def sealed_memfd(name: str, nbytes: int, *, may_grow: bool = False) -> int:
    """A memfd of ``nbytes`` that nobody can shrink: the runner holds the fd too, and a file shrunk
    under the judge's mapping would kill the judge with SIGBUS on its next access. F_SEAL_SEAL:
    no seal can be added later either (F_SEAL_GROW or F_SEAL_FUTURE_WRITE by the runner would make
    the judge's growing of the CPU arena fail)."""
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    try:
        import fcntl

        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL | (0 if may_grow else fcntl.F_SEAL_GROW)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except (ImportError, AttributeError, OSError):
        pass  # a kernel without seals: the mapping stays shrinkable (noted in docs/architecture.md)
    return fd


# ---------------------------------------------------------------------------------------- bell
BELL_BYTES = 1 << 16  # a message each way; a larger answer goes over the pipe
_BELL_HEADER = 64  # per direction: sequence number (8 bytes), length (4); the message after the header
TO_RUNNER, TO_JUDGE = 0, 1


def bell_supported() -> bool:
    """x86-64 only: there a store is seen by another core in program order (TSO), so a message
    written before its sequence number is complete when the number changes. Elsewhere (aarch64)
    Python has no fence to order them: the pipe is used."""
    return os.uname().machine in ("x86_64", "amd64", "AMD64")


class Bell:
    """A shared page for the timed command and its answer between two spinning processes: a
    message is written, then its length, then the direction's sequence number; the other side
    spins reading that number from memory. No system call on the way (a pipe hand-off cost
    ~63 us in and ~73 us out on the H200 VM, inside the judge's window). The judge creates it (a
    memfd) and hands the fd to the runner. What the runner writes there is as untrusted as what it
    writes on the pipe: bounded, JSON, an object, read as a copy."""

    SIZE = 2 * (_BELL_HEADER + BELL_BYTES)

    def __init__(self, fd: int | None = None) -> None:
        if fd is None:
            fd = sealed_memfd("pkb-bell", self.SIZE)
        self.fd = fd
        self._map = mmap.mmap(fd, self.SIZE)

    def seq(self, direction: int) -> int:
        return int(struct.unpack_from("<Q", self._map, direction * (_BELL_HEADER + BELL_BYTES))[0])

    def post(self, direction: int, message: dict[str, Any]) -> bool:
        """Ring with ``message``; False (nothing written) when it does not fit."""
        data = json.dumps(message, separators=(",", ":")).encode()
        if len(data) > BELL_BYTES:
            return False
        base = direction * (_BELL_HEADER + BELL_BYTES)
        self._map[base + _BELL_HEADER: base + _BELL_HEADER + len(data)] = data
        struct.pack_into("<I", self._map, base + 8, len(data))
        struct.pack_into("<Q", self._map, base, (self.seq(direction) + 1) % 2**64)
        return True

    def take(self, direction: int, last: int) -> dict[str, Any] | None:
        """The message rung since sequence number ``last``, or None; ChannelError when it is not a
        bounded JSON object."""
        base = direction * (_BELL_HEADER + BELL_BYTES)
        if self.seq(direction) == last:
            return None
        (length,) = struct.unpack_from("<I", self._map, base + 8)
        if length > BELL_BYTES:
            raise ChannelError(f"a message of {length} bytes on the bell (the limit is {BELL_BYTES})")
        data = bytes(self._map[base + _BELL_HEADER: base + _BELL_HEADER + length])
        try:
            message = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ChannelError(f"a message on the bell that is not JSON: {exc}") from exc
        if not isinstance(message, dict):
            raise ChannelError("a message on the bell that is not a JSON object")
        return message

    def close(self) -> None:
        try:
            self._map.close()
        except (BufferError, ValueError):
            pass
        try:
            os.close(self.fd)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------- arena
class Arena:
    """Judge side: shared memory the runner maps. Grows by replacement (the runner is told)."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = device
        self.nbytes = max(ALIGN_BYTES, _align(nbytes))
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        if device.type == "cuda":
            self.tensor = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        else:
            self._fd = sealed_memfd("pkb-arena", self.nbytes, may_grow=True)  # grown in place (grown())
            self._map = mmap.mmap(self._fd, self.nbytes)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)

    @property
    def fd(self) -> int | None:
        return self._fd

    def export(self) -> dict[str, Any]:
        """What the runner needs to map this arena (the memfd itself is passed as an open fd)."""
        if self.device.type == "cuda":
            fields = self.tensor.untyped_storage()._share_cuda_()
            return {"kind": "cuda_ipc", "nbytes": self.nbytes, "args": [_jsonable(f) for f in fields],
                    "offset": self.tensor.storage_offset()}
        return {"kind": "memfd", "nbytes": self.nbytes}

    def grown(self, nbytes: int) -> Arena:
        """An arena of at least ``nbytes``: on CPU the same memfd made longer and mapped again (the
        runner keeps its descriptor and maps it again when told), on a GPU a new allocation."""
        if self._fd is None:
            return Arena(self.device, nbytes)
        bigger = Arena.__new__(Arena)
        bigger.device, bigger.nbytes = self.device, _align(nbytes)
        os.ftruncate(self._fd, bigger.nbytes)
        bigger._fd, bigger._map = self._fd, mmap.mmap(self._fd, bigger.nbytes)
        bigger.tensor = torch.frombuffer(bigger._map, dtype=torch.uint8)
        self._fd = None  # the descriptor now belongs to the bigger arena
        self.tensor = torch.empty(0, dtype=torch.uint8)
        return bigger

    def view(self, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return view(self.tensor, offset, dtype, shape)

    def close(self) -> None:
        self.tensor = torch.empty(0, dtype=torch.uint8)
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views still alive somewhere: the mapping goes with them
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def attach(export: dict[str, Any], fd: int | None, device: torch.device) -> torch.Tensor:
    """Runner side: the judge's arena as a uint8 tensor."""
    nbytes = int(export["nbytes"])
    if export["kind"] == "memfd":
        if fd is None:
            raise ChannelError("a CPU arena without its file descriptor")
        mapping = mmap.mmap(fd, nbytes)
        return torch.frombuffer(mapping, dtype=torch.uint8)
    args = [_unjsonable(a) for a in export["args"]]
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(*args)
    whole = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
    offset = int(export.get("offset", 0))
    return whole[offset:offset + nbytes]


def view(arena: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    itemsize = torch.empty(0, dtype=dtype).element_size()
    count = 1
    for dim in shape:
        count *= dim
    nbytes = count * itemsize
    if offset < 0 or offset + nbytes > arena.numel() or offset % ALIGN_BYTES:
        raise ChannelError(f"a tensor at offset {offset} of {nbytes} bytes does not fit the arena")
    return arena[offset:offset + nbytes].view(dtype).view(shape)


def _align(n: int) -> int:
    return (n + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    return value


def _unjsonable(value: Any) -> Any:
    if isinstance(value, dict) and "b64" in value:
        return base64.b64decode(value["b64"])
    return value


# ---------------------------------------------------------------------------------------- layouts
class Layout:
    """Where the tensors of several values sit in an arena, built on the judge's side."""

    def __init__(self, start: int = 0) -> None:
        self.end = _align(start)

    def place(self, value: Any) -> Any:
        """The JSON description of ``value`` with room reserved for each tensor (contiguous)."""
        if isinstance(value, torch.Tensor):
            if value.dtype not in DTYPE_NAMES:
                raise PkbError(f"tensors of dtype {value.dtype} cannot cross to the runner")
            offset = self.end
            self.end = _align(offset + value.numel() * value.element_size())
            return {"t": [offset, DTYPE_NAMES[value.dtype], list(value.shape)]}
        if isinstance(value, tuple):
            return {"tuple": [self.place(v) for v in value]}
        if isinstance(value, list):
            return {"list": [self.place(v) for v in value]}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise PkbError("only dicts with string keys cross to the runner")
            return {"dict": [[k, self.place(v)] for k, v in value.items()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"v": value}
        if isinstance(value, torch.dtype):
            return {"dtype": DTYPE_NAMES[value]}
        raise PkbError(f"a value of type {type(value).__name__} cannot cross to the runner")


def build(spec: Any, arena: torch.Tensor) -> Any:
    """The value a description names, its tensors as views of ``arena``."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ChannelError("a malformed value description")
    ((kind, body),) = spec.items()
    if kind == "t":
        offset, dtype_name, shape = body
        if dtype_name not in DTYPES_BY_NAME:
            raise ChannelError(f"unknown dtype {dtype_name!r}")
        return view(arena, int(offset), DTYPES_BY_NAME[dtype_name], tuple(int(d) for d in shape))
    if kind == "tuple":
        return tuple(build(s, arena) for s in body)
    if kind == "list":
        return [build(s, arena) for s in body]
    if kind == "dict":
        return {str(k): build(s, arena) for k, s in body}
    if kind == "v":
        return body
    if kind == "dtype":
        return DTYPES_BY_NAME[body]
    raise ChannelError(f"unknown value kind {kind!r}")


def write(value: Any, spec: Any, arena: torch.Tensor) -> None:
    """Copy the tensors of ``value`` into their places (judge side: inputs)."""
    kind, body = next(iter(spec.items()))
    if kind == "t":
        build(spec, arena).copy_(value)
    elif kind in ("tuple", "list"):
        for v, s in zip(value, body):
            write(v, s, arena)
    elif kind == "dict":
        for k, s in body:
            write(value[k], s, arena)
