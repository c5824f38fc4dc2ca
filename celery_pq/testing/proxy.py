"""TCP proxies on loopback for network faults: ``FaultProxy`` cuts, partitions, half-opens and
slows the connections between clients and Redis; ``DelayProxy`` delays one way (a replication
link that lags)."""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from contextlib import suppress

from .server import HOST


def _close(*socks):
    for s in socks:
        with suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            s.close()


class FaultProxy:
    """A TCP proxy on loopback that forwards both ways until told to fail.

    ``partition()``: nothing goes through either way and new connections never reach the target
    (the client's writes succeed, no reply ever comes); ``heal()`` ends it, closing the connections
    that lived through it so that clients reconnect; ``cut()`` closes every connection now.
    ``latency(low, high)``: every chunk waits a random ``low``..``high`` seconds in each direction
    (order kept); ``latency(0)`` ends it. ``silence()``: the connections open now go half-open for
    good (writes dropped, no reply, nothing closed), while new connections go through.
    """

    #: bytes still held from the target when it closes are dropped, not delivered
    lossy = False

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._links: list[dict] = []  # one per proxied connection: {"silent": bool}
        self._delay = (0.0, 0.0)
        self._rng = random.Random(13)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        self._open.wait()  # a connection made during a partition waits for the heal (and is closed by it)
        if self._closed.is_set() or client.fileno() < 0:
            return
        try:
            upstream = socket.create_connection((HOST, self.target_port), timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        link = {"silent": False}
        with self._lock:
            self._socks.append(upstream)
            self._links.append(link)
        for src, dst in ((client, upstream), (upstream, client)):
            held: queue.Queue = queue.Queue()
            back = src is upstream
            threading.Thread(target=self._pump, args=(src, link, held, back), daemon=True).start()
            threading.Thread(target=self._send_late, args=(held, src, dst, back and self.lossy), daemon=True).start()

    def _due(self, back: bool, due: float) -> float:
        """When a chunk read now may go on (``due``: the previous chunk's, to keep the order)."""
        low, high = self._delay
        return max(due, time.monotonic() + self._rng.uniform(low, high)) if high > 0 else 0.0

    def _pump(self, src, link, held, back):
        due = 0.0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._open.is_set() or link["silent"]:
                    continue  # partitioned or half-open: what is sent is lost
                due = self._due(back, due)
                held.put((due, data))
        except OSError:
            pass
        held.put(None)  # the sender closes both ends once what it holds is sent

    def _send_late(self, held, src, dst, lossy):
        while True:
            item = held.get()
            if item is None:
                break
            due, data = item
            time.sleep(max(0.0, due - time.monotonic()))
            if lossy and not held.empty() and held.queue[-1] is None:
                break  # the target died meanwhile: these bytes never arrive
            try:
                dst.sendall(data)
            except OSError:
                break
        _close(src, dst)

    def latency(self, low: float, high: float | None = None):
        self._delay = (low, low if high is None else high)

    def silence(self):
        with self._lock:
            for link in self._links:
                link["silent"] = True
            self._links = []

    def cut(self):
        with self._lock:
            socks, self._socks = self._socks, []
            self._links = []
        _close(*socks)

    def partition(self):
        self._open.clear()

    def heal(self):
        self.cut()
        self._open.set()

    def close(self):
        self._closed.set()
        self._open.set()
        _close(self._listener)
        self.cut()


class DelayProxy(FaultProxy):
    """``DelayProxy(target_port, delay)``: bytes from the client side to the target go through at
    once, bytes from the target back to the client wait ``delay`` seconds (order kept). A replica
    told to replicate from the proxy then receives the master's writes ``delay`` late, and
    whatever the proxy holds when the master dies never arrives: the writes a failover loses."""

    lossy = True

    def __init__(self, target_port: int, delay: float):
        self.delay = delay
        super().__init__(target_port)

    def _due(self, back: bool, due: float) -> float:
        return time.monotonic() + self.delay if back else 0.0
