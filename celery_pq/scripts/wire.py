"""The wire: one script call sent and its reply read, on a connection the calling thread keeps.

A single call runs as one FCALL (or EVALSHA) on a connection the calling thread keeps for
itself (taken from the client's pool once, handed back when the thread ends): redis-py's
command path around it (pool checkout and return, retry wrapper, response hooks) costs several
times the work of sending the command. The call is packed by hiredis and its reply read by
hiredis's reader straight from the socket (``_roundtrip``), polling for it a few microseconds
before sleeping in recv (``set_spin_wait``).

The library of functions (``assembly.library``) is loaded once per server and process
(``FUNCTION LOAD``), and again when FCALL finds it gone (a restart without persistence,
``FUNCTION FLUSH``). A server without functions, or a user not allowed to load them, gets the
same scripts by EVALSHA; NOSCRIPT loads the script and runs it again.

A server that answers READONLY (a master demoted by REPLICAOF: a failover behind a virtual IP
or a DNS name, or a sentinel's) gets its connection closed and the call fails with a connection
error, so the next call connects again (to the new master), as redis-py's sentinel connections
do for its own commands: a script's reply is read below them here.
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
    """One thread's own connections, ``{pool: (pid, connection)}``. When the thread ends, its
    thread-local storage goes and with it this object: each connection is closed and handed
    back to its pool, so a finished thread holds no socket and no slot of ``max_connections``.
    A connection whose pool went first is closed by redis-py (``Connection.__del__``)."""

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
    """A redis-py client class whose calls may go on a connection of its pool (not a pipeline,
    not a cluster client). Cached per class: ``isinstance`` against ``Pipeline`` is slow."""
    return issubclass(cls, redis.Redis) and not issubclass(cls, redis.client.Pipeline)


#: Bumped in a child process after a fork: a connection found in the thread's last-used slot
#: is this process's own only while the number it was kept with is the current one.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def own_connection(client):
    """This thread's own connection of ``client``'s pool (a new one after a fork), or None when
    the client is not a plain redis-py client (a pipeline, a cluster client). The last one used
    is kept in the thread's slot ``last`` as ``(pool, client class, fork number, connection)``,
    checked first: the calls of one consumer or producer go to one pool, call after call."""
    pool = getattr(client, "connection_pool", None)
    last = getattr(_pinned, "last", None)
    if last is not None and last[0] is pool and last[1] is type(client) and last[2] == _forks[0]:
        conn = last[3]
        if conn.__dict__.get("_pq_flight") is not None:
            conn._pq_flight.finish()  # a call sent without waiting: its reply first
        return conn
    if pool is None or not _plain_client(client.__class__):
        return None
    held = getattr(_pinned, "held", None)
    if held is None:
        held = _pinned.held = _Held()
    mine = held.conns.get(pool)
    if mine is None or mine[0] != os.getpid():
        mine = held.conns[pool] = (os.getpid(), pool.get_connection())  # kept until the thread ends, or it fails
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


#: Per connection pool (one server): True once this process loaded the library there, False
#: when the server cannot run functions (no FUNCTION command, or the user may not load one).
_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _load_library(conn, pool) -> bool:
    """Load the library on ``conn``'s server; whether its functions can be called there."""
    try:
        conn.send_command("FUNCTION", "LOAD", library().text)
        conn.read_response()
    except redis.exceptions.OutOfMemoryError:  # type: ignore[attr-defined]  # (not in the type stubs)
        # a full Redis loads nothing: this call goes by EVALSHA, a later one loads
        return False
    except ResponseError as exc:
        text = str(exc)
        if "already exists" not in text:
            if not (
                "unknown command" in text
                or "unknown subcommand" in text
                or text.startswith("NOPERM")
                or "no permissions" in text
            ):
                raise  # the library itself is wrong: a bug to see, not to run around
            _functions[pool] = False
            return False
    _functions[pool] = True
    return True


_pack: Callable[[tuple], bytes] | None
try:  # the protocol packer redis-py itself uses when hiredis is installed
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is optional
    _pack = None


def _packed(words: tuple) -> bytes | None:
    """The call packed by hiredis, or None (no hiredis, or an argument it will not pack: such a
    call takes redis-py's path, and its error). redis-py's own packer looks at every argument
    for bytearray and memoryview first, a third of the client's cost of a call of thirty
    arguments."""
    if _pack is None:
        return None
    try:
        return _pack(words)
    except TypeError:
        return None


def _send(conn, words: tuple) -> None:
    """Send one script call on ``conn`` (packed by hiredis where it can be)."""
    packed = _packed(words)
    if packed is None:
        conn.send_command(*words)
    else:
        conn.send_packed_command([packed])


_HiredisParser: Any
try:  # redis-py's hiredis parser: a reply read here goes through the same hiredis reader
    from redis._parsers import hiredis as _hiredis_parsers

    _HiredisParser = _hiredis_parsers._HiredisParser
    _NOT_ENOUGH = getattr(_hiredis_parsers, "NOT_ENOUGH_DATA", False)  # (False before redis-py 6)
except (ImportError, AttributeError):  # pragma: no cover - another redis-py layout
    _HiredisParser = None


_LINUX = sys.platform.startswith("linux")
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_clock = time.perf_counter_ns

#: Per connection pool: nanoseconds a call polls for its reply (``set_spin_wait``); the pools
#: not named here (a cluster's nodes, a client given to the queue API) take C.SPIN_WAIT_US.
_spin: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SPIN_DEFAULT = C.SPIN_WAIT_US * 1000


def set_spin_wait(pool, microseconds: float) -> None:
    """How long a script call on ``pool``'s connections polls for its reply before it sleeps
    (0: it sleeps at once, as redis-py does)."""
    _spin[pool] = int(microseconds * 1000)


def _spin_recv(conn, sock, buf, spin_ns: int) -> int:
    """Read what the socket holds, polling for up to ``spin_ns`` (the reply of a call just
    sent): the bytes read, or 0 when none came in time (the caller then sleeps in recv, and this
    connection polls no more for the next 2, 4, .. C.SPIN_BACKOFF_MAX calls: a far or busy
    server costs one wasted poll in that many). A polled socket that the server closed reads 0
    as well; the blocking read then sees the close."""
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
    """``(socket, parser, buffer)`` for a call sent and read by ``_roundtrip``, or None where
    redis-py's own path is taken: no hiredis, not connected, TLS, not Linux.

    The socket is put in blocking mode with the connection's timeout kept by the kernel
    (SO_RCVTIMEO, SO_SNDTIMEO): Python's timeout mode polls before every send and every read,
    two more system calls per call. redis-py sets its timeout mode again wherever it reads
    with a timeout of its own (then this puts it back on the next call)."""
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
    """The next reply on ``conn``, read from ``sock`` through hiredis's reader (a push message
    before it goes to redis-py's handlers). ``flags`` _DONTWAIT: _NOT_ENOUGH when the socket
    holds no more yet; 0: wait (the kernel's timeout bounds it). A closed connection raises
    redis-py's ConnectionError, a socket's failure what the socket raised (``_failure``)."""
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
    """What a failed send or read on ``conn`` raises: redis-py's TimeoutError for the kernel's
    timeout, its ConnectionError for a socket error, else ``exc`` itself (a protocol error, an
    interrupt mid-reply, a closed connection); the stream is unusable after any of them."""
    if isinstance(exc, (TimeoutError, BlockingIOError)):
        return RedisTimeoutError(f"Timeout waiting for {conn.host}:{conn.port}")
    if isinstance(exc, OSError):
        return RedisConnectionError(f"Error talking to {conn.host}:{conn.port}: {exc}")
    return exc


def _roundtrip(conn, words: tuple, spin_ns: int = 0):
    """Send one call on ``conn`` and read its reply: redis-py's send and read (health check,
    socket, hiredis reader, errors) without the layers around them, which cost as much as the
    system calls themselves. ``spin_ns``: poll for the reply that long before sleeping in recv
    (``_spin_recv``). A failure disconnects ``conn`` and raises redis-py's ConnectionError or
    TimeoutError, as its own path would."""
    io = _lean_io(conn)
    packed = None if io is None else _packed(words)
    if packed is None:
        _send(conn, words)
        return conn.read_response()
    sock, parser, buf = io
    if conn.health_check_interval:
        conn.check_health()  # (a PING after a long silence, as redis-py's send would)
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
    """Is ``exc`` a READONLY reply (the server is a replica now)?"""
    return isinstance(exc, ReadOnlyError) or str(exc).startswith("READONLY")


def _demoted(conn, exc: Exception) -> RedisConnectionError:
    """The connection error a READONLY reply becomes (its connection already dropped)."""
    where = f" at {conn.host}:{conn.port}" if conn is not None and hasattr(conn, "host") else ""
    return RedisConnectionError(
        f"the Redis server{where} is a read-only replica now (a failover demoted it): "
        f"the connection is closed, the next call connects again ({exc})"
    )


def raise_if_demoted(client, conn, exc: Exception) -> None:
    """For a READONLY reply on ``conn`` (of ``client``'s pool): the connection dropped and the
    connection error it becomes raised; nothing for any other error."""
    if _readonly(exc):
        drop_connection(client, conn)
        raise _demoted(conn, exc) from exc


def raise_if_pool_demoted(client, exc: Exception) -> None:
    """For a READONLY reply to a call redis-py made on ``client``'s pool: the pool's idle
    connections (to the demoted server) closed and the connection error it becomes raised."""
    pool = getattr(client, "connection_pool", None)
    if _readonly(exc) and pool is not None:
        pool.disconnect(inuse_connections=False)
        raise _demoted(None, exc) from exc


def uses_functions(client) -> bool:
    """Does this process call the library's functions on ``client``'s server (loaded there)?"""
    return bool(_functions.get(getattr(client, "connection_pool", None)))


def run_on(conn, pool, script, keys, args):
    """``script`` (a ``runner.LuaScript``: its ``function``, ``sha`` and text ``script``) on ``conn``:
    FCALL (the library loaded first when needed), else EVALSHA."""
    use = _functions.get(pool)
    if use is None:
        use = _load_library(conn, pool)
    if use:
        spin = _spin.get(pool, _SPIN_DEFAULT)
        try:
            return _roundtrip(conn, ("FCALL", script.function, len(keys), *keys, *args), spin)
        except ResponseError as exc:  # the library is gone (restart, FUNCTION FLUSH): load it
            if not function_missing(exc) or not _load_library(conn, pool):
                raise
            return _roundtrip(conn, ("FCALL", script.function, len(keys), *keys, *args), spin)
    try:
        _send(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return conn.read_response()
    except NoScriptError:  # Redis restarted or flushed its scripts: load, run again
        conn.send_command("SCRIPT", "LOAD", script.script)
        conn.read_response()
        _send(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
        return conn.read_response()


class Flight:
    """A script call sent on a connection without waiting for its reply (``send_nowait``).

    Until its reply is read the connection carries it (``_pq_flight``): the thread's next call
    on that connection (``own_connection``) reads it first (``finish``), so replies never cross.
    ``ready()`` reads what the socket holds without blocking; ``result()`` gives the reply, or
    raises what reading it raised (the connection then dropped, as ``_roundtrip`` does)."""

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
        """Read what the socket gives (``flags``: _DONTWAIT, or 0 to wait); whether the reply
        (or a failure) is in."""
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
        """No reply came in the connection's timeout (a silent, half-open connection): the
        connection dropped, and ``result`` raises the timeout, as a waiting call's read would."""
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
        """The reply (read first if need be); a script's error reply or a failure raised."""
        self.finish()
        if self._error is not None:
            raise self._error
        if isinstance(self._reply, ResponseError):
            raise self._reply
        return self._reply


def send_nowait(conn, pool, script, keys, args) -> Flight | None:
    """Send ``script`` as FCALL on ``conn`` and return at once: its ``Flight``. None (nothing
    sent) where only a waiting call can be made: the library not known to be loaded there, or
    not ``_roundtrip``'s lean path (no hiredis, TLS, not Linux, not connected)."""
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
