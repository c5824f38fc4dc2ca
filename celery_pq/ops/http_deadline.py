"""A deadline on a client's whole request for the two HTTP servers (a thread per connection):
``DeadlineHandler`` drops a client whose request has not arrived within the server's
``request_timeout`` seconds however it trickles in; each write waits as long at most."""

from __future__ import annotations

import io
import socket
import socketserver
import time

#: Seconds a client has to send its whole request (line, headers, body), and for each write of
#: the reply: a client that sends nothing, or a byte at a time, holds a thread no longer.
REQUEST_TIMEOUT_SECONDS = 10.0


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read waiting only until ``deadline`` (monotonic); then TimeoutError."""

    def __init__(self, connection: socket.socket, deadline: float, timeout: float):
        self._connection = connection
        self._deadline = deadline
        self._timeout = timeout  # restored after each read (for the reply's writes)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._connection.settimeout(left)
        try:
            return self._connection.recv_into(buffer)
        finally:
            self._connection.settimeout(self._timeout)


class DeadlineHandler(socketserver.StreamRequestHandler):
    """The first base of a handler whose server has ``request_timeout`` (seconds)."""

    def setup(self) -> None:
        timeout = float(self.server.request_timeout)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        super().setup()
        self.connection.settimeout(timeout)
        made = self.rfile
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline, timeout))
        made.close()  # (it holds the socket until closed)
