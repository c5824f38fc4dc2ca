"""The wire: one script call as FCALL (EVALSHA where functions are refused) on a connection the
calling thread keeps, packed and read by hiredis straight on the socket, polling briefly for the
reply (``set_spin_wait``); the library loaded once per server and again when it is gone. Why:
docs/performance.md ("Where the speed comes from"); functions or EVALSHA: docs/deployments.md
("An ACL user"); a READONLY reply closes the connection: docs/cluster.md.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from functools import cache
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..storage import constants as C
from .assembly import library


class _Held:
    """One thread's own connections, ``{pool: (pid, connection)}``, closed and handed back when
    the thread ends (its thread-local storage goes, and this with it): a finished thread holds
    no slot of ``max_connections``."""

    def __init__(self):
        self.conns: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        weakref.finalize(self, _give_back_all, self.conns)  # also runs at exit


def _give_back_all(conns):
    for pool, (pid, conn) in list(conns.items()):
        _give_back(pool, pid, conn)


def _give_back(pool, pid, conn):
    conn.disconnect()
    if pid == os.getpid():
        pool.release(conn)


_pinned = threading.local()


@cache
def _plain_client(cls: type) -> bool:
    """A plain redis-py client class (not a pipeline, not a cluster client); cached per class,
    as ``issubclass`` against ``Pipeline`` is slow."""
    return issubclass(cls, redis.Redis) and not issubclass(cls, redis.client.Pipeline)


#: Bumped in a child after a fork: a connection kept under an older number is the parent's.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def own_connection(client):
    """This thread's own connection of ``client``'s pool (a new one after a fork), a reply still
    in flight on it read first; None for a pipeline or a cluster client. The last one used is
    checked first (``_pinned.last``): one consumer's calls go to one pool."""
    pool = getattr(client, "connection_pool", None)
    last = getattr(_pinned, "last", None)
    if last is not None and last[0] is pool and last[1] is type(client) and last[2] == _forks[0]:
        conn = last[3]
        if conn.__dict__.get("_pq_flight") is not None:
            conn._pq_flight.finish()
        return conn
    if pool is None or not _plain_client(client.__class__):
        return None
    held = getattr(_pinned, "held", None)
    if held is None:
        held = _pinned.held = _Held()
    mine = held.conns.get(pool)
    if mine is None or mine[0] != os.getpid():
        mine = held.conns[pool] = (os.getpid(), pool.get_connection())
    _pinned.last = (pool, type(client), _forks[0], mine[1])
    if mine[1].__dict__.get("_pq_flight") is not None:
        mine[1]._pq_flight.finish()
    return mine[1]


def drop_connection(client, conn):
    """A connection that failed: closed and handed back to its pool (it reconnects when used)."""
    _pinned.last = None
    held = getattr(_pinned, "held", None)
    if held is not None:
        held.conns.pop(client.connection_pool, None)
    _give_back(client.connection_pool, os.getpid(), conn)


#: Per pool: True once this process loaded the library there, False when the server cannot run
#: functions (no FUNCTION command, or the user may not load one).
_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _load_library(conn, pool) -> bool:
    """Load the library on ``conn``'s server; whether its functions can be called there. Any
    other refusal raises: the library itself is wrong."""
    try:
        conn.send_command("FUNCTION", "LOAD", library().text)
        conn.read_response()
    except redis.exceptions.OutOfMemoryError:  # type: ignore[attr-defined]  # (not in the type stubs)
        return False  # a full Redis: EVALSHA now, a later call loads
    except ResponseError as exc:
        text = str(exc)
        if "already exists" not in text:
            if not (
                "unknown command" in text
                or "unknown subcommand" in text
                or text.startswith("NOPERM")
                or "no permissions" in text
            ):
                raise
            _functions[pool] = False
            return False
    _functions[pool] = True
    return True


_pack: Callable[[tuple], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is optional
    _pack = None


def _packed(words: tuple) -> bytes | None:
    """The call packed by hiredis, or None (no hiredis, or an argument it will not pack: then
    redis-py's path, and its error)."""
    if _pack is None:
        return None
    try:
        return _pack(words)
    except TypeError:
        return None


def _send(conn, words: tuple) -> None:
    """Send one call on ``conn`` (packed by hiredis where it can be)."""
    packed = _packed(words)
    if packed is None:
        conn.send_command(*words)
    else:
        conn.send_packed_command([packed])


_HiredisParser: Any
try:  # redis-py's hiredis parser: replies read here go through its reader
    from redis._parsers import hiredis as _hiredis_parsers

    _HiredisParser = _hiredis_parsers._HiredisParser
    _NOT_ENOUGH = getattr(_hiredis_parsers, "NOT_ENOUGH_DATA", False)  # (False before redis-py 6)
except (ImportError, AttributeError):  # pragma: no cover - another redis-py layout
    _HiredisParser = None


_LINUX = sys.platform.startswith("linux")
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_clock = time.perf_counter_ns

#: Per pool: nanoseconds a call polls for its reply (``set_spin_wait``); else C.SPIN_WAIT_US.
_spin: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SPIN_DEFAULT = C.SPIN_WAIT_US * 1000


def set_spin_wait(pool, microseconds: float) -> None:
    """How long a script call on ``pool``'s connections polls for its reply before it sleeps
    (0: it sleeps at once, as redis-py does)."""
    _spin[pool] = int(microseconds * 1000)


def _spin_recv(conn, sock, buf, spin_ns: int) -> int:
    """The bytes the socket holds after polling up to ``spin_ns``, or 0 when none came in time
    (the caller then sleeps in recv; ``_backed_off``) or the server closed it (the blocking
    read then sees the close)."""
    skip = getattr(conn, "_pq_spin_skip", 0)
    if skip:
        conn._pq_spin_skip = skip - 1
        return 0
    deadline = _clock() + spin_ns
    while True:
        try:
            n = sock.recv_into(buf, 0, _DONTWAIT)
        except BlockingIOError:
            if _clock() < deadline:
                continue
            _backed_off(conn)
            return 0
        conn._pq_spin_misses = 0
        return n


def _backed_off(conn) -> None:
    """A missed poll: ``conn`` polls no more for the next 2, 4, .. C.SPIN_BACKOFF_MAX calls."""
    misses = conn._pq_spin_misses = getattr(conn, "_pq_spin_misses", 0) + 1
    conn._pq_spin_skip = min(1 << misses, C.SPIN_BACKOFF_MAX)


def _lean_io(conn):
    """``(socket, parser, buffer)`` for ``_roundtrip``, or None where redis-py's path is taken (no
    hiredis, not connected, TLS, not Linux). The socket blocks, its timeout kept by the kernel
    (SO_RCVTIMEO): Python's timeout mode polls before every send and read. redis-py may set its
    mode again; the next call puts it back."""
    parser = conn._parser
    sock = conn._sock
    if type(parser) is not _HiredisParser or _pack is None or type(sock) is not socket.socket or not _LINUX:
        return None
    if parser._reader is None:
        return None
    if sock.gettimeout() is not None:
        seconds = conn.socket_timeout
        if seconds is not None:
            timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        sock.settimeout(None)
    return sock, parser, parser._buffer


def _read_reply(conn, sock, parser, buf, flags: int):
    """The next reply on ``conn`` (push messages before it to redis-py's handlers). ``flags``
    _DONTWAIT: _NOT_ENOUGH when nothing more is there yet; 0: wait (the kernel's timeout). A
    closed connection raises redis-py's ConnectionError, a socket failure what it raised."""
    reader = parser._reader
    push = getattr(parser, "_hiredis_PushNotificationType", None)  # (RESP3; None with older hiredis)
    while True:
        reply = reader.gets()
        while reply is _NOT_ENOUGH:
            try:
                n = sock.recv_into(buf, 0, flags)
            except BlockingIOError:
                if flags:
                    return _NOT_ENOUGH
                raise
            if not n:
                raise RedisConnectionError(f"Connection closed by {conn.host}:{conn.port}")
            reader.feed(buf, 0, n)
            reply = reader.gets()
        if push is None or type(reply) is not push:
            return reply
        parser.handle_push_response(reply)


def _failure(conn, exc: BaseException) -> BaseException:
    """What a failed send or read on ``conn`` raises: redis-py's TimeoutError or ConnectionError
    for a timeout or socket error, else ``exc``; the connection is unusable after any."""
    if isinstance(exc, (TimeoutError, BlockingIOError)):
        return RedisTimeoutError(f"Timeout waiting for {conn.host}:{conn.port}")
    if isinstance(exc, OSError):
        return RedisConnectionError(f"Error talking to {conn.host}:{conn.port}: {exc}")
    return exc


def _roundtrip(conn, words: tuple, spin_ns: int = 0):
    """Send one call on ``conn`` and read its reply, as redis-py would (health check, hiredis,
    its errors) without its layers; poll ``spin_ns`` first. A failure disconnects ``conn`` and
    raises redis-py's ConnectionError or TimeoutError."""
    io = _lean_io(conn)
    packed = None if io is None else _packed(words)
    if packed is None:
        _send(conn, words)
        return conn.read_response()
    sock, parser, buf = io
    if conn.health_check_interval:
        conn.check_health()
    try:
        sock.sendall(packed)
        if spin_ns:
            n = _spin_recv(conn, sock, buf, spin_ns)
            if n:
                parser._reader.feed(buf, 0, n)
        reply = _read_reply(conn, sock, parser, buf, 0)
    except BaseException as exc:
        conn.disconnect()
        error = _failure(conn, exc)
        if error is exc:
            raise
        raise error from exc
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(reply, ResponseError):
        raise reply
    return reply


def function_missing(exc: Exception) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("Function not found")


def _readonly(exc: Exception) -> bool:
    """A READONLY reply (the server is a replica now)?"""
    return isinstance(exc, ReadOnlyError) or str(exc).startswith("READONLY")


def _demoted(conn, exc: Exception) -> RedisConnectionError:
    """The connection error a READONLY reply becomes (its connection already dropped)."""
    where = f" at {conn.host}:{conn.port}" if conn is not None and hasattr(conn, "host") else ""
    return RedisConnectionError(
        f"the Redis server{where} is a read-only replica now (a failover demoted it): "
        f"the connection is closed, the next call connects again ({exc})"
    )


def raise_if_demoted(client, conn, exc: Exception) -> None:
    """For a READONLY reply on ``conn``: drop it and raise the connection error; else nothing."""
    if _readonly(exc):
        drop_connection(client, conn)
        raise _demoted(conn, exc) from exc


def raise_if_pool_demoted(client, exc: Exception) -> None:
    """For a READONLY reply on ``client``'s pool: close its idle connections and raise the
    connection error; else nothing."""
    pool = getattr(client, "connection_pool", None)
    if _readonly(exc) and pool is not None:
        pool.disconnect(inuse_connections=False)
        raise _demoted(None, exc) from exc


def uses_functions(client) -> bool:
    """Has this process loaded the library on ``client``'s server?"""
    return bool(_functions.get(getattr(client, "connection_pool", None)))


def run_on(conn, pool, script, keys, args):
    """``script`` (a ``runner.LuaScript``) on ``conn``: FCALL (the library loaded when needed,
    and again when gone), else EVALSHA (the script loaded on NOSCRIPT)."""
    use = _functions.get(pool)
    if use is None:
        use = _load_library(conn, pool)
    if use:
        spin = _spin.get(pool, _SPIN_DEFAULT)
        try:
            return _roundtrip(conn, ("FCALL", script.function, len(keys), *keys, *args), spin)
        except ResponseError as exc:  # the library gone (a restart, FUNCTION FLUSH)?
            if not function_missing(exc) or not _load_library(conn, pool):
                raise
            return _roundtrip(conn, ("FCALL", script.function, len(keys), *keys, *args), spin)
    try:
        _send(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return conn.read_response()
    except NoScriptError:
        conn.send_command("SCRIPT", "LOAD", script.script)
        conn.read_response()
        _send(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return conn.read_response()


class Flight:
    """A script call sent without waiting for its reply (``send_nowait``). The connection carries
    it (``_pq_flight``) until read: the thread's next call on it reads it first, so replies
    never cross. A failed read drops the connection and ``result()`` raises it."""

    __slots__ = ("_buf", "_error", "_parser", "_reply", "_sock", "conn", "done")

    def __init__(self, conn, sock, parser, buf):
        self.conn = conn
        self._sock, self._parser, self._buf = sock, parser, buf
        self._reply: Any = None
        self._error: BaseException | None = None
        self.done = False

    def _land(self, reply=None, error: BaseException | None = None) -> None:
        self._reply, self._error, self.done = reply, error, True
        self.conn._pq_flight = None
        if error is not None:
            self.conn.disconnect()
        elif self.conn.health_check_interval:
            self.conn.next_health_check = time.monotonic() + self.conn.health_check_interval

    def _read(self, flags: int) -> bool:
        """Read (``flags``: _DONTWAIT, or 0 to wait); whether the reply or a failure is in."""
        try:
            reply = _read_reply(self.conn, self._sock, self._parser, self._buf, flags)
        except BaseException as exc:
            error = _failure(self.conn, exc)
            if error is not exc:
                error.__cause__ = exc
            self._land(error=error)
            return True
        if reply is _NOT_ENOUGH:
            return False
        self._land(reply=reply)
        return True

    def give_up(self) -> None:
        """No reply in the connection's timeout (a half-open connection): drop it; ``result``
        raises the timeout."""
        if not self.done:
            self._land(error=RedisTimeoutError(f"Timeout waiting for {self.conn.host}:{self.conn.port}"))

    def ready(self) -> bool:
        """Whether the reply is in (read now if the socket holds it; never blocks)."""
        return self.done or self._read(_DONTWAIT)

    def finish(self) -> None:
        """Read the reply, waiting for it (the connection's timeout bounds the wait)."""
        if not self.done:
            self._read(0)

    def result(self):
        """The reply (read first if need be); an error reply or a failure raised."""
        self.finish()
        if self._error is not None:
            raise self._error
        if isinstance(self._reply, ResponseError):
            raise self._reply
        return self._reply


def send_nowait(conn, pool, script, keys, args) -> Flight | None:
    """Send ``script`` as FCALL on ``conn`` and return its ``Flight`` at once; None, nothing sent,
    when the library is not known loaded there or without ``_lean_io``'s path."""
    if _functions.get(pool) is not True:
        return None
    io = _lean_io(conn)
    if io is None:
        return None
    packed = _packed(("FCALL", script.function, len(keys), *keys, *args))
    if packed is None:
        return None
    sock, parser, buf = io
    if conn.health_check_interval:
        conn.check_health()
    try:
        sock.sendall(packed)
    except OSError as exc:
        conn.disconnect()
        raise RedisConnectionError(f"Error talking to {conn.host}:{conn.port}: {exc}") from exc
    flight = Flight(conn, sock, parser, buf)
    conn._pq_flight = flight
    return flight
