"""A listening socket that keeps whatever arrives (what a sandboxed candidate must not reach)."""

from __future__ import annotations

import socket
import threading


class Listener:
    """Accepts on ``sock`` (bound and listening) in a thread of its own; ``received`` holds each
    connection's first bytes, or b"(connected)" for one that sent nothing."""

    def __init__(self, sock: socket.socket, accept_timeout_s: float = 0.5) -> None:
        self.sock = sock
        self.sock.settimeout(accept_timeout_s)
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(4096) or b"(connected)")
                except OSError:
                    self.received.append(b"(connected)")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
