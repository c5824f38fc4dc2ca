"""HTTP clients that try to hold one of a server's threads: one that connects and sends nothing,
one that sends its request a byte at a time. Shared by the dashboard's and the exporter's tests."""

from __future__ import annotations

import socket
import time

#: A request line and headers, sent a byte at a time by the slow client (never complete).
SLOW_REQUEST = b"GET /" + b"a" * 200


def dropped(port: int, trickle: bytes = b"", every: float = 0.1, limit: float = 15.0) -> bool:
    """Connect to 127.0.0.1:``port``, send ``trickle`` one byte every ``every`` seconds (nothing
    when it is empty), and say whether the server closed the connection within ``limit``
    seconds (without a byte of reply)."""
    deadline = time.monotonic() + limit
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(every)
        sent = 0
        while time.monotonic() < deadline:
            try:
                return sock.recv(1024) == b""  # (a reply: the request was taken as complete)
            except TimeoutError:
                pass
            except ConnectionResetError:
                return True
            if sent < len(trickle):
                try:
                    sock.sendall(trickle[sent : sent + 1])
                except (BrokenPipeError, ConnectionResetError):
                    return True
                sent += 1
    return False
