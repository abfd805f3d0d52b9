"""The channel from the judges and the node agents to the launcher: authenticated JSON lines on TCP.

One code path for one box and for many: judge 0 connects to the launcher's server (127.0.0.1 on a
single node, the head's address across nodes) and sends the worker events on it; each node's agent
(engine.agent) connects to the same server for its launch orders, heartbeats both ways, clock
pings and telemetry. What crosses is never unpickled.

Handshake (mutual): the server sends a nonce; the client answers with its role, its own nonce and a
MAC of both under the role's key (an agent: the batch's join key; a judge: the launch's event key);
the server checks it and confirms under the session key HMAC(role key, nonces). Every later line is
``HMAC(session key, direction + seq + json) json`` with a sequence number per direction, so a line
cannot be forged without the key, replayed on another connection, reflected, dropped or reordered
without the connection being cut. A stranger (a candidate that found the port) gets nowhere: no key,
no session; its connection is closed after HELLO_TIMEOUT_S or its first bad line.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

MAX_LINE_BYTES = 64 * 2**20  # a Timing event with many rounds, a batch of samples
MAX_HELLO_BYTES = 4096
HELLO_TIMEOUT_S = 5.0
# Connections still to say hello: past this many the oldest is closed, so a local process that
# opens sockets by the thousand (a candidate that found the port) cannot run the launcher out of
# file descriptors; the judges and agents say hello at once.
MAX_PENDING_HELLOS = 32


class UplinkError(Exception):
    """The connection is gone or broke the protocol."""


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A key for one purpose (a launch's event key) from the batch's join key."""
    return hmac.new(secret, purpose.encode(), hashlib.sha256).digest()


class _Session:
    """Framing, signing and checking of one connection's lines (both ends use it)."""

    def __init__(self, key: bytes, sending: str, receiving: str) -> None:
        self.key = key
        self.sending, self.receiving = sending, receiving
        self.sent = 0
        self.received = 0

    def seal(self, message: dict[str, Any]) -> bytes:
        body = json.dumps(message, separators=(",", ":"), default=str)
        line = _mac(self.key, f"{self.sending}{self.sent} {body}") + " " + body + "\n"
        self.sent += 1
        return line.encode()

    def open(self, line: bytes) -> dict[str, Any]:
        text = line.decode(errors="replace")
        mac, _, body = text.partition(" ")
        expected = _mac(self.key, f"{self.receiving}{self.received} {body}")
        if not hmac.compare_digest(mac, expected):
            raise UplinkError("a line that is not signed with this connection's key (forged, replayed or out of order)")
        self.received += 1
        try:
            message = json.loads(body)
        except json.JSONDecodeError as exc:
            raise UplinkError(f"a signed line that is not JSON: {exc}") from exc
        if not isinstance(message, dict):
            raise UplinkError("a signed line that is not a JSON object")
        return message


def _session_key(key: bytes, server_nonce: str, client_nonce: str) -> bytes:
    return hmac.new(key, f"session {server_nonce} {client_nonce}".encode(), hashlib.sha256).digest()


# ---------------------------------------------------------------------------------------- server
@dataclass
class Peer:
    """One authenticated connection to the server."""

    id: int
    role: str  # "judge" or "agent"
    hello: dict[str, Any]  # what it said about itself (node rank, host, pid)
    address: str
    connected_at: float
    last_heard: float
    closed: bool = False
    why_closed: str | None = None


@dataclass
class Message:
    peer: Peer
    body: dict[str, Any]  # a "closed" body ({"t": "closed", "why": ...}) when the peer went away


@dataclass
class _Conn:
    id: int
    sock: socket.socket
    address: str
    nonce: str
    opened: float
    buffer: bytearray = field(default_factory=bytearray)
    session: _Session | None = None
    peer: Peer | None = None


class UplinkServer:
    """The launcher's end: ``poll(timeout)`` returns the messages of authenticated peers; a peer
    that closes or breaks the protocol yields one ``{"t": "closed"}`` message. ``keys`` maps a role
    to the key its clients must know; ``set_key`` changes one (a new launch's event key)."""

    def __init__(self, keys: dict[str, bytes], host: str = "127.0.0.1", port: int = 0) -> None:
        self.keys = dict(keys)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._conns: dict[int, _Conn] = {}
        self._next_id = 0
        self.rejected = 0  # connections closed for a bad hello or a bad line (strangers, forgeries)
        self.bytes_received = 0

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def set_key(self, role: str, key: bytes) -> None:
        self.keys[role] = key

    def peers(self, role: str | None = None) -> list[Peer]:
        return [c.peer for c in self._conns.values() if c.peer is not None and (role is None or c.peer.role == role)]

    def poll(self, timeout_s: float) -> list[Message]:
        out: list[Message] = []
        for key, _ in self._selector.select(max(0.0, timeout_s)):
            if key.data is None:
                self._accept()
                continue
            conn: _Conn = key.data
            try:
                data = conn.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                self._close(conn, f"connection error: {exc}", out)
                continue
            if not data:
                self._close(conn, "the connection was closed", out)
                continue
            self.bytes_received += len(data)
            conn.buffer += data
            self._lines(conn, out)
        now = time.monotonic()
        for conn in list(self._conns.values()):
            if conn.session is None and now - conn.opened > HELLO_TIMEOUT_S:
                self._close(conn, "no valid hello in time", out)
        return out

    def send(self, peer: Peer, message: dict[str, Any]) -> bool:
        """Send to a peer (blocking while its socket buffer is full); False when it is gone."""
        conn = self._conns.get(peer.id)
        if conn is None or conn.session is None:
            return False
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(5.0)
            conn.sock.sendall(conn.session.seal(message))
        except OSError:
            return False
        finally:
            try:
                conn.sock.setblocking(False)
            except OSError:
                pass
        return True

    def drop(self, peer: Peer, why: str) -> None:
        conn = self._conns.get(peer.id)
        if conn is not None:
            self._close(conn, why, [])

    def close(self) -> None:
        for conn in list(self._conns.values()):
            self._close(conn, "the launcher closed the channel", [])
        try:
            self._selector.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._selector.close()

    # -------------------------------------------------------------- internals
    def _accept(self) -> None:
        try:
            sock, address = self._listener.accept()
        except OSError:  # nothing to accept after all, or out of descriptors: the next poll tries again
            return
        waiting = [c for c in self._conns.values() if c.session is None]
        if len(waiting) >= MAX_PENDING_HELLOS:
            self.rejected += 1
            self._close(min(waiting, key=lambda c: c.opened), "too many connections waiting to say hello", [])
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._next_id += 1
        conn = _Conn(self._next_id, sock, f"{address[0]}:{address[1]}", secrets.token_hex(16), time.monotonic())
        self._conns[self._next_id] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        try:
            sock.sendall((json.dumps({"nonce": conn.nonce}) + "\n").encode())
        except OSError:
            self._close(conn, "could not greet", [])

    def _lines(self, conn: _Conn, out: list[Message]) -> None:
        while True:
            end = conn.buffer.find(b"\n")
            limit = MAX_HELLO_BYTES if conn.session is None else MAX_LINE_BYTES
            if end < 0:
                if len(conn.buffer) > limit:
                    self._reject(conn, "a line longer than allowed", out)
                return
            line, conn.buffer = bytes(conn.buffer[:end]), conn.buffer[end + 1:]
            if end > limit:
                self._reject(conn, "a line longer than allowed", out)
                return
            try:
                if conn.session is None:
                    self._hello(conn, line)
                    continue
                body = conn.session.open(line)
            except UplinkError as exc:
                self._reject(conn, str(exc), out)
                return
            assert conn.peer is not None
            conn.peer.last_heard = time.monotonic()
            out.append(Message(conn.peer, body))

    def _hello(self, conn: _Conn, line: bytes) -> None:
        text = line.decode(errors="replace")
        mac, _, body = text.partition(" ")
        try:
            hello = json.loads(body)
            role, client_nonce = str(hello["role"]), str(hello["nonce"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UplinkError("a hello that is not ours") from exc
        key = self.keys.get(role)
        if key is None or not hmac.compare_digest(mac, _mac(key, f"hello {conn.nonce} {body}")):
            raise UplinkError(f"a hello for role {role!r} not signed with its key")
        session_key = _session_key(key, conn.nonce, client_nonce)
        conn.session = _Session(session_key, sending="s", receiving="c")
        now = time.monotonic()
        conn.peer = Peer(conn.id, role, hello.get("about") or {}, conn.address, now, now)
        conn.sock.setblocking(True)
        try:
            conn.sock.sendall(conn.session.seal({"t": "welcome"}))
        finally:
            conn.sock.setblocking(False)

    def _reject(self, conn: _Conn, why: str, out: list[Message]) -> None:
        self.rejected += 1
        self._close(conn, why, out)

    def _close(self, conn: _Conn, why: str, out: list[Message]) -> None:
        if self._conns.pop(conn.id, None) is None:
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        if conn.peer is not None:
            conn.peer.closed, conn.peer.why_closed = True, why
            out.append(Message(conn.peer, {"t": "closed", "why": why}))


# ---------------------------------------------------------------------------------------- client
class Uplink:
    """The client's end (judge 0, a node agent). ``send`` is thread-safe; ``receive`` reads."""

    def __init__(self, address: tuple[str, int], key: bytes, role: str, about: dict[str, Any] | None = None,
                 timeout_s: float = 30.0) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
        self._buffer = bytearray()
        try:
            greeting = json.loads(self._line(time.monotonic() + timeout_s, MAX_HELLO_BYTES) or b"null")
            server_nonce = str(greeting["nonce"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            self.sock.close()
            raise UplinkError("the launcher's greeting is not ours") from exc
        client_nonce = secrets.token_hex(16)
        body = json.dumps({"role": role, "nonce": client_nonce, "about": about or {}}, separators=(",", ":"))
        self.sock.sendall(f"{_mac(key, f'hello {server_nonce} {body}')} {body}\n".encode())
        self.session = _Session(_session_key(key, server_nonce, client_nonce), sending="c", receiving="s")
        welcome = self.receive(timeout_s)  # signed with the session key: the launcher knows the key too
        if welcome is None or welcome.get("t") != "welcome":
            self.sock.close()
            raise UplinkError("the launcher did not welcome this connection")
        self.sock.settimeout(None)

    def send(self, message: dict[str, Any]) -> None:
        with self._send_lock:
            try:
                self.sock.sendall(self.session.seal(message))
            except OSError as exc:
                raise UplinkError(f"the launcher's channel is gone: {exc}") from exc

    def receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, None when none came in time; UplinkError when the channel is gone."""
        line = self._line(time.monotonic() + timeout_s, MAX_LINE_BYTES)
        return None if line is None else self.session.open(line)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _line(self, deadline: float, limit: int) -> bytes | None:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                return line
            if len(self._buffer) > limit:
                raise UplinkError("a line longer than allowed")
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                return None
            except OSError as exc:
                raise UplinkError(f"the launcher's channel is gone: {exc}") from exc
            if not data:
                raise UplinkError("the launcher closed the channel")
            self._buffer += data


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """HOST:PORT (or [v6]:PORT) to a pair; a user's mistake is a ValueError with a sentence."""
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_port is None:
            raise ValueError(f"{text!r} is not HOST:PORT")
        host, port = text, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host, int(port)
