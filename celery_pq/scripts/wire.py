"""The wire, on redis-py's public connection methods: a script call on the calling thread's own
connection (``Line``), its reply polled for briefly before the thread sleeps; a call read later
(``Flight``); calls streamed on a pooled connection (``CallStream``). Why: docs/performance.md
("Where the speed comes from"); FCALL or EVALSHA: docs/deployments.md ("An ACL user"); a
READONLY reply closes the connection: docs/cluster.md.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from functools import cache
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..storage import constants as C
from .assembly import library

#: What a lost connection raises while sending or reading.
LOST = (RedisConnectionError, RedisTimeoutError, OSError)

#: Per pool: True once this process loaded the library there, False when the server cannot run
#: functions (no FUNCTION command, or the user may not load one).
_functions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Per pool: nanoseconds a call polls for its reply (``set_spin_wait``); else C.SPIN_WAIT_US.
_spin: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_clock = time.perf_counter_ns

_pack: Callable[[tuple], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is optional
    _pack = None


def spin_of(pool) -> int:
    """Nanoseconds a script call on ``pool`` polls for its reply."""
    return _spin.get(pool, C.SPIN_WAIT_US * 1000)


def set_spin_wait(pool, microseconds: float) -> None:
    """How long a script call on ``pool`` polls for its reply before it sleeps (0: not at all)."""
    _spin[pool] = int(microseconds * 1000)


def send(conn, words: tuple, check_health: bool = True) -> None:
    """Send one command on ``conn``, packed by hiredis where it can, else by redis-py."""
    try:
        packed = [_pack(words)] if _pack is not None else conn.pack_command(*words)
    except TypeError:
        packed = conn.pack_command(*words)
    conn.send_packed_command(packed, check_health=check_health)


def take_connection(pool):
    """A connection of ``pool`` (redis-py before 5.3 wants a command name)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("FCALL")


def _give_back(pool, pid, conn):
    conn.disconnect()
    if pid == os.getpid():
        pool.release(conn)


class Line:
    """One thread's own connection of one pool; its ``flight`` is read before the next call on it.
    Polling pauses for 2, 4, .. C.SPIN_BACKOFF_MAX calls after a reply that came too late for it."""

    __slots__ = ("conn", "flight", "misses", "pid", "skip")

    def __init__(self, pool):
        self.conn = take_connection(pool)
        self.pid = os.getpid()
        self.flight: Flight | None = None
        self.misses = self.skip = 0

    def call(self, *words, spin_ns: int = 0):
        """Send one command and read its reply, polling ``spin_ns`` for it first."""
        conn = self.conn
        send(conn, words)
        self.poll(lambda: conn.can_read(0), spin_ns)
        return conn.read_response()

    def poll(self, ready, spin_ns: int) -> None:
        """Poll ``ready()`` for a reply up to ``spin_ns`` before a blocking read (the pause after
        one that came too late: see the class)."""
        if self.skip:
            self.skip -= 1
        elif spin_ns:
            deadline = _clock() + spin_ns
            while not ready():
                if _clock() > deadline:
                    self.misses += 1
                    self.skip = min(1 << self.misses, C.SPIN_BACKOFF_MAX)
                    return
            self.misses = 0

    def run(self, pool, script, keys, args):
        """``script`` (a ``runner.LuaScript``) as FCALL (the library loaded when needed or gone),
        else EVALSHA (loaded on NOSCRIPT)."""
        use = _functions.get(pool)
        if use is None:
            use = load_library(self.conn, pool)
        spin = spin_of(pool)
        words = script.command(use, keys, args)
        try:
            return self.call(*words, spin_ns=spin)
        except NoScriptError:  # (EVALSHA) the script not loaded there
            self.call("SCRIPT", "LOAD", script.script)
        except ResponseError as exc:  # (FCALL) the library gone: a restart, FUNCTION FLUSH?
            if not function_missing(exc) or not load_library(self.conn, pool):
                raise
        return self.call(*words, spin_ns=spin)


class _Held:
    """One thread's ``Line`` per pool, handed back when the thread ends (with its thread-local
    storage): a finished thread holds no slot of ``max_connections``."""

    def __init__(self):
        self.lines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        weakref.finalize(self, _give_back_all, self.lines)  # also runs at exit


def _give_back_all(lines):
    """A finished thread's lines closed; their pools take them back at the next ``own_line``: a
    finalizer may run in a garbage collection inside the pool's own lock (redis-py's
    ``get_connection`` making a connection), where ``release`` would wait for it forever."""
    for pool, line in list(lines.items()):
        line.conn.disconnect()
        _orphans.append((pool, line.pid, line.conn))


#: (pool, pid, connection) of finished threads, closed, not yet back in their pools.
_orphans: deque = deque()


def _release_orphans() -> None:
    while _orphans:
        try:
            pool, pid, conn = _orphans.popleft()
        except IndexError:  # (another thread took the last one)
            return
        _give_back(pool, pid, conn)


_pinned = threading.local()


@cache
def plain_client(cls: type) -> bool:
    """A plain redis-py client class (not a pipeline or cluster client)? Cached: ``issubclass`` is slow."""
    return issubclass(cls, redis.Redis) and not issubclass(cls, redis.client.Pipeline)


def own_line(client) -> Line | None:
    """This thread's ``Line`` of ``client``'s pool (a new one after a fork), a reply still in
    flight on it read first; None for a pipeline or a cluster client."""
    pool = getattr(client, "connection_pool", None)
    if pool is None or not plain_client(client.__class__):
        return None
    if _orphans:
        _release_orphans()
    held = getattr(_pinned, "held", None)
    if held is None:
        held = _pinned.held = _Held()
    line = held.lines.get(pool)
    if line is None or line.pid != os.getpid():
        line = held.lines[pool] = Line(pool)
    elif line.flight is not None:
        line.flight.finish()
    return line


def drop_line(client, line: Line) -> None:
    """A failed line's connection closed and handed back to its pool."""
    held = getattr(_pinned, "held", None)
    if held is not None:
        held.lines.pop(client.connection_pool, None)
    _give_back(client.connection_pool, os.getpid(), line.conn)


#: What a server says that cannot or may not load functions.
_REFUSALS = ("unknown command", "unknown subcommand", "NOPERM", "no permissions")


def load_library(conn, pool) -> bool:
    """Load the library on ``conn``'s server: whether its functions can be called there. Another
    refusal than ``_REFUSALS`` raises (the library itself is wrong)."""
    try:
        conn.send_command("FUNCTION", "LOAD", library().text)
        conn.read_response()
    except redis.exceptions.OutOfMemoryError:  # type: ignore[attr-defined]  # (not in the type stubs)
        return False  # a full Redis: EVALSHA now, a later call loads
    except ResponseError as exc:
        if "already exists" not in str(exc):
            if not any(refusal in str(exc) for refusal in _REFUSALS):
                raise
            _functions[pool] = False
            return False
    _functions[pool] = True
    return True


def uses_functions(client) -> bool:
    return bool(_functions.get(getattr(client, "connection_pool", None)))


def function_missing(exc: Exception) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("Function not found")


def readonly(exc: Exception) -> bool:
    return isinstance(exc, ReadOnlyError) or str(exc).startswith("READONLY")


def demoted(conn, exc: Exception) -> RedisConnectionError:
    """The connection error a READONLY reply becomes (its connection already dropped)."""
    where = f" at {conn.host}:{conn.port}" if conn is not None and hasattr(conn, "host") else ""
    return RedisConnectionError(
        f"the Redis server{where} is a read-only replica now (a failover demoted it): "
        f"the connection is closed, the next call connects again ({exc})"
    )


def raise_if_demoted(client, line: Line | None, exc: Exception) -> None:
    """For a READONLY reply on ``line`` (None: on ``client``'s pool): drop the line (close the
    pool's idle connections) and raise ``demoted``."""
    if not readonly(exc):
        return
    if line is not None:
        drop_line(client, line)
    elif getattr(client, "connection_pool", None) is not None:
        client.connection_pool.disconnect(inuse_connections=False)
    else:
        return
    raise demoted(None if line is None else line.conn, exc) from exc


class Flight:
    """A script call sent without waiting for its reply (``LuaScript.send_nowait``); the thread's
    next call on its line reads it first, so replies never cross."""

    __slots__ = ("_reply", "conn", "done", "line", "spin_ns")

    def __init__(self, line: Line, spin_ns: int = 0):
        self.line, self.conn, self.done, self.spin_ns = line, line.conn, False, spin_ns
        self._reply: Any = None
        line.flight = self

    def _land(self, reply) -> None:
        """The reply in: a value, an error reply, or a failure (then the connection dropped)."""
        self._reply, self.done, self.line.flight = reply, True, None
        if isinstance(reply, BaseException) and not isinstance(reply, ResponseError):
            self.conn.disconnect()

    def give_up(self) -> None:
        """No reply in the connection's timeout (half-open): drop it; ``result`` raises the timeout."""
        if not self.done:
            self._land(RedisTimeoutError(f"Timeout waiting for {self.conn.host}:{self.conn.port}"))

    def ready(self) -> bool:
        """Whether the reply is in (read now, to its end, if the socket holds some of it)."""
        if not self.done:
            try:
                if not self.conn.can_read(0):
                    return False
            except BaseException as exc:
                self._land(exc)
            self.finish()
        return True

    def wait(self) -> None:
        """Read the reply, polling for it up to the pool's spin first (as ``Line.call``)."""
        if not self.done:
            self.line.poll(self.ready, self.spin_ns)
        self.finish()

    def finish(self) -> None:
        """Read the reply, waiting for it up to the connection's timeout."""
        if not self.done:
            try:
                reply = self.conn.read_response()
            except BaseException as exc:
                reply = exc
            self._land(reply)

    def result(self):
        """The reply (read first if need be), an error reply or failure raised."""
        self.finish()
        if isinstance(self._reply, BaseException):
            raise self._reply
        return self._reply


class CallStream:
    """Script calls written to one pooled connection now, their replies read later (a publish
    batch's inserts: docs/publishing.md). Not the thread's ``Line``: another call on the thread
    must not read its replies. No health check while replies are outstanding (its PING would
    read one as its own)."""

    def __init__(self, client, conn):
        self.client, self.conn = client, conn
        self.outstanding = 0
        self.broken = False

    @classmethod
    def open(cls, client) -> CallStream | None:
        """A stream on a connection of ``client``'s pool (the library loaded there if needed);
        None for a cluster client or a pipeline."""
        pool = getattr(client, "connection_pool", None)
        if pool is None or not plain_client(client.__class__):
            return None
        conn = take_connection(pool)
        try:
            if _functions.get(pool) is None:
                load_library(conn, pool)
        except BaseException:
            _give_back(pool, os.getpid(), conn)
            raise
        return cls(client, conn)

    def send(self, script, keys, args) -> None:
        """Write one script call. A lost connection raises (LOST) and breaks the stream."""
        try:
            send(self.conn, script.words(self.client, keys, args), check_health=not self.outstanding)
        except BaseException:
            self.broken = True
            raise
        self.outstanding += 1

    def read(self):
        """The oldest unread reply, an error reply returned (not raised). A lost connection raises
        (LOST) and breaks the stream; READONLY breaks it, returned ``demoted``."""
        if not self.outstanding:
            raise RuntimeError("no reply is outstanding on this call stream")
        self.outstanding -= 1
        try:
            reply = self.conn.read_response()
        except ResponseError as exc:
            if readonly(exc):
                self.broken = True
                return demoted(self.conn, exc)
            return exc
        except BaseException:
            self.broken = True
            raise
        return reply

    def close(self) -> None:
        """Hand the connection back, the outstanding replies read first; closed when broken."""
        conn, pool = self.conn, self.client.connection_pool
        try:
            while self.outstanding and not self.broken:
                self.read()
        except Exception:
            self.broken = True
        finally:
            if self.broken or self.outstanding:
                conn.disconnect()
            self.outstanding = 0
            pool.release(conn)
