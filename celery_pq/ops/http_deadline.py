"""A deadline on a client's request, for the two HTTP servers of celery-pq (the dashboard,
``dashboard/server.py``, and the metrics exporter, ``metrics.py``): both serve each connection in a
thread of its own, and without a deadline a client that connects and sends nothing, or sends a
byte every few seconds, holds its thread for as long as it likes.

``DeadlineHandler`` goes first among a request handler's bases: the request (its line, its headers and its body) must arrive within the
server's ``request_timeout`` seconds of the connection, however it trickles in; the reply is
written with that timeout on each send. A client too late is dropped (its connection closed)."""

from __future__ import annotations

import io
import logging
import socket
import socketserver
import time

logger = logging.getLogger("celery_pq.http")


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read waiting only for what is left until ``deadline`` (a
    ``time.monotonic()``); TimeoutError after it."""

    def __init__(self, connection: socket.socket, deadline: float, timeout: float):
        self._connection = connection
        self._deadline = deadline
        self._timeout = timeout  # the socket's timeout again after each read (the reply's writes)

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
    """A request handler whose server has ``request_timeout`` (seconds): the request must arrive
    within it; each write of the reply waits at most as long. A handler of http.server or wsgiref
    takes it as its first base (``class Handler(DeadlineHandler, BaseHTTPRequestHandler)``)."""

    def setup(self) -> None:
        timeout = float(self.server.request_timeout)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        super().setup()
        self.connection.settimeout(timeout)
        made = self.rfile
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline, timeout))
        made.close()  # (it holds a reference to the connection's socket until closed)

    def handle(self) -> None:
        try:
            super().handle()
        except TimeoutError as exc:  # (http.server's own handler catches it itself; wsgiref's not)
            logger.debug("http: a client was too slow (%s); its connection is closed", exc)
