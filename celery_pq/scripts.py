"""Loads the Lua scripts once per process and runs them.

One file per atomic operation under ``lua/``; a line ``--!include name.lua`` is replaced by
``lua/includes/name.lua``. What a script takes and returns is its header (the leading comment
block); ``signature`` reads its KEYS from there by name, so that the caller builds its key list
from the header (``keys.script_keys``) and the line ``--!keys`` in the script becomes the
bindings of those names (``local ii, pi = KEYS[1], KEYS[2]``; the fairness keys go in the table
``FK`` of includes/fair.lua). The error codes a script's code names (``NOT_LEASED``, ...) are
pasted in as constants from ``errors.ErrorCode``, the one source of their values. A single call runs as one EVALSHA on a connection the calling thread
keeps for itself (taken from the client's pool once, handed back when the thread ends):
redis-py's command path around it (pool checkout and return, retry wrapper, response hooks)
costs several times the work of sending the command. NOSCRIPT loads the script and runs it
again. A connection error hands the call to redis-py's ``Script`` (with the client's own retry
policy) on a fresh pooled connection.

Where the server has Redis Functions (Redis 7 and later), every script runs as a function of
one library (``library()``): its shared helpers are defined once, when the library is loaded,
instead of on every call as a script's text is (Redis runs a script's whole text, each
``local function`` definition a new closure, on every EVALSHA: about a third of an empty pop's
time). The library is loaded once per server and process (``FUNCTION LOAD``), and again when
FCALL finds it gone (a restart without persistence, ``FUNCTION FLUSH``). A server without
functions, or a user not allowed to load them, gets the same scripts by EVALSHA. The two forms
differ in one way: a function that is not allowed to run when Redis is full (``maxmemory``,
``noeviction``) is refused before it starts (``WRITES_WHEN_FULL``), where a script would fail at
its first write, perhaps half done.

``run_replicated`` (and ``LuaScript.replicated``) end a call with ``WAIT`` on the connection that
made the writes, for the transport option ``wait_replicas``: the reply says how many replicas
have them.

On a Redis Cluster (``connections.is_cluster``) every call goes to the master of its first key's
slot (all keys of a call share one hash tag): on that node's own client and pool, so the
library is loaded on each master the process calls (FUNCTION LOAD is replicated, so a promoted
replica has it; were it gone, "Function not found" loads it there again), and a batch
(``run_calls``, ``run_replicated``) is one pipeline per node, each with its own WAIT. A call
that meets a moved slot or a node that went away (``connections.REROUTE``: a failover) runs
again through redis-py's ``RedisCluster``, which learns the new layout and retries; such a
call's WAIT is not confirmed (0 replicas): a publish is then retried, stored once by its
publish id.

While a queue's slot migrates (a resharding: CLUSTER SETSLOT ... MIGRATING/IMPORTING, its keys
moved one by one, SETSLOT ... NODE) every call on it is refused: the script's slot guard
(lua/includes/common.lua) stops it before its first write, or Redis or redis-py answers TRYAGAIN,
ASK, CLUSTERDOWN, "TTL exhausted" (``connections.unsettled``). Such a call wrote nothing; it
is made again, after a pause that doubles from C.SETTLE_PAUSE_FIRST to C.SETTLE_PAUSE_MAX
seconds, until the slot settles or ``cluster_retry_seconds`` have passed
(``connections.until_settled``): then it fails with ``ClusterUnsettled``, a connection error to
kombu.

A server that answers READONLY (a master demoted by REPLICAOF: a failover behind a virtual IP
or a DNS name, or a sentinel's) gets its connection closed and the call fails with a connection
error, so the next call connects again (to the new master), as redis-py's sentinel connections
do for its own commands: a script's reply is read below them here.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import constants as C
from .connections import REROUTE, by_node, is_cluster, node_client, settling, unsettled, until_settled
from .errors import ErrorCode
from .keys import FAIR_SUFFIXES

SCRIPT_NAMES = (
    "insert",
    "pop",
    "pop_fair",
    "ack",
    "extend",
    "requeue",
    "reclaim",
    "remove",
    "peek",
    "peek_head",
    "retrieve_by_priority",
    "remove_highest",
    "change_priority",
    "cleanup",
    "purge",
    "migrate",
    "pause",
    "event_log",
    "replay",
)

_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.M)


_FUNCTION = re.compile(r"local function (\w+)\(")
_WORD = re.compile(r"\w+")
_COMMENT = re.compile(r"--.*")
_STRING = re.compile(r"'[^']*'")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The full text of one script: its key bindings, includes and error constants pasted in,
    minus the included helper functions it never calls (Redis runs a script's whole text on
    every call, definitions too)."""
    text = (resources.files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    text = text.replace("--!keys\n", _bindings(signature(name)), 1)
    return compose(text.replace("--!queue\n", _QUEUE_PROLOGUE, 1))


#: What a ``--!queue`` line stands for: the queue context taken off ARGV, and nothing done when
#: the caller's mode is not the one the queue recorded (see includes/common.lua).
_QUEUE_PROLOGUE = "take_context()\nlocal bad = mode_error(false)\nif bad then\n  return bad\nend\n"


def compose(text: str) -> str:
    """Lua ``text`` with its ``--!include`` lines replaced by the includes, minus the helper
    functions it never calls, the error codes it names defined first (tests run the shared
    helpers alone through this)."""
    root = resources.files(__package__) / "lua" / "includes"
    text = _without_unused_functions(_INCLUDE.sub(lambda m: (root / m.group(1)).read_text(encoding="utf-8"), text))
    return _error_constants(text) + text


#: Scripts Redis runs even when it is full (``maxmemory`` reached, ``noeviction``): they deliver,
#: renew, end or give back leases, move or delete entries: what frees memory or adds little
#: beside it. An insert (and a mode migration) is refused whole, before it starts, with Redis's
#: OOM error, so a full Redis refuses new work and still drains what it holds.
WRITES_WHEN_FULL = frozenset(SCRIPT_NAMES) - {"insert", "migrate"}

# Module state of the includes (a table made at the top level, ``local CTX = { n = 0 }``, on one
# line): a library keeps it between calls, so each function starts by making it anew with the
# same constructor, as a script's fresh run does; a table whose line ends "-- kept between
# calls" (a cache) is left as it is.
_STATE = re.compile(r"^local (\w+) = (\{[^\n]*\})[ \t]*(--[^\n]*)?$", re.M)
_KEPT = "-- kept between calls"


@dataclass(frozen=True)
class Library:
    """The Redis Functions library of every script: ``name``, ``text`` (for FUNCTION LOAD) and
    the function name of each script (``functions[script]``)."""

    name: str
    text: str
    functions: dict


@lru_cache(maxsize=None)
def library() -> Library:
    """Every script as a function of one library. The includes (helpers, constants, error codes)
    are defined once at its top level; each script's own text, with its key bindings and queue
    prologue, is the body of its function. The names carry a hash of the text, so processes of
    two versions of celery-pq can share a Redis, each calling its own functions."""
    root = resources.files(__package__) / "lua"
    bodies, includes = {}, []
    for name in SCRIPT_NAMES:
        text = (root / f"{name}.lua").read_text(encoding="utf-8")
        for inc in _INCLUDE.findall(text):
            if inc not in includes:
                includes.append(inc)
        text = _INCLUDE.sub("", text).replace("--!keys\n", _bindings(signature(name)), 1)
        bodies[name] = text.replace("--!queue\n", _QUEUE_PROLOGUE, 1)
    shared = "".join((root / "includes" / inc).read_text(encoding="utf-8") for inc in includes)
    state = [(n, t) for n, t, comment in _STATE.findall(shared) if comment.strip() != _KEPT]
    reset = f"{', '.join(n for n, _ in state)} = {', '.join(t for _, t in state)}\n" if state else ""
    codes = list(ErrorCode)
    top = ("local KEYS, ARGV\n"
           f"local {', '.join(c.name for c in codes)} = {', '.join(str(int(c)) for c in codes)}\n" + shared)
    digest = hashlib.sha1((top + "".join(bodies.values())).encode()).hexdigest()[:12]
    functions = {name: f"pq_{digest}_{name}" for name in SCRIPT_NAMES}
    parts = [f"#!lua name=celery_pq_{digest}\n", top]
    for name, body in bodies.items():
        flags = "'allow-oom'" if name in WRITES_WHEN_FULL else ""
        parts.append(f"redis.register_function{{function_name='{functions[name]}', flags={{{flags}}}, "
                     f"callback=function(keys, args)\nKEYS, ARGV = keys, args\n{reset}{body}\nend}}\n")
    return Library(f"celery_pq_{digest}", "".join(parts), functions)


def _error_constants(text: str) -> str:
    """``local NOT_LEASED, TOKEN_MISMATCH = -2, -3`` for the error codes the code of ``text`` names."""
    words = set(_WORD.findall(_STRING.sub("", _COMMENT.sub("", text))))
    codes = [c for c in ErrorCode if c.name in words]
    if not codes:
        return ""
    return f"local {', '.join(c.name for c in codes)} = {', '.join(str(int(c)) for c in codes)}\n"


@dataclass(frozen=True)
class Signature:
    """The KEYS of a script, by the names in its header, in order."""

    keys: tuple[str, ...]
    #: The last of ``keys``, sent only when the queue is fair (marked "fair only").
    fair_only: tuple[str, ...] = ()
    #: The name of an open list of keys after them (``KEYS[n..] name``), or None.
    tail: str | None = None


# "-- KEYS[i] name type ...", "-- KEYS[i..j] name name ...: ...", "-- KEYS[i..] name ..."
_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)(?:(\.\.)(\d*))?\]\s+(.*)$", re.M)
_ERR_LINE = re.compile(r"^-- ERR (-\d+) (\w+)$", re.M)


@lru_cache(maxsize=None)
def signature(name: str) -> Signature:
    """The KEYS a script takes, read from its header (ValueError when a line is out of order)."""
    keys: list[str] = []
    fair_only: list[str] = []
    tail = None
    for m in _KEY_LINE.finditer(header(name)):
        first, dots, last, text = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if first != len(keys) + 1 or tail is not None:
            raise ValueError(f"{name}.lua: KEYS[{first}] is out of order in the header")
        if not dots:
            names = text.split()[:1]
        elif not last:
            tail = text.split()[0]
            continue
        else:
            names = text.split(":")[0].split()
            if len(names) != int(last) - first + 1:
                raise ValueError(f"{name}.lua: KEYS[{first}..{last}] names {len(names)} keys")
        if fair_only and "fair only" not in text:
            raise ValueError(f"{name}.lua: keys sent only when fair must come last (before an open list)")
        keys += names
        fair_only += names if "fair only" in text else []
    return Signature(tuple(keys), tuple(fair_only), tail)


def header_errors(name: str) -> dict[str, int]:
    """The ``-- ERR <code> <NAME>`` lines of a script's header."""
    return {label: int(code) for code, label in _ERR_LINE.findall(header(name))}


def _bindings(sig: Signature) -> str:
    """The Lua lines binding a script's key names: locals, and the fairness keys in FK."""
    plain = [(i, n) for i, n in enumerate(sig.keys, 1) if n not in FAIR_SUFFIXES]
    fair = [(i, n) for i, n in enumerate(sig.keys, 1) if n in FAIR_SUFFIXES]
    out = f"local {', '.join(n for _, n in plain)} = {', '.join(f'KEYS[{i}]' for i, _ in plain)}\n" if plain else ""
    if fair:
        out += "FK = { " + ", ".join(f"{n} = KEYS[{i}]" for i, n in fair) + " }\n"
    return out


def _without_unused_functions(text: str) -> str:
    """Drop each top-level ``local function`` (from its line to the first line ``end``) that
    neither the script's own code nor a kept function names."""
    pieces: list[tuple[str | None, list[str]]] = [(None, [])]  # (function name or None, lines)
    for line in text.splitlines(keepends=True):
        m = _FUNCTION.match(line)
        if m:
            pieces.append((m.group(1), [line]))
        else:
            pieces[-1][1].append(line)
            if pieces[-1][0] is not None and line.rstrip("\n") == "end":
                pieces.append((None, []))
    words = {name: set(_WORD.findall(_COMMENT.sub("", "".join(lines[1:])))) for name, lines in pieces if name}
    todo = [w for name, lines in pieces if name is None
            for w in _WORD.findall(_COMMENT.sub("", "".join(lines))) if w in words]
    used = set(todo)
    while todo:
        for w in words[todo.pop()] & words.keys():
            if w not in used:
                used.add(w)
                todo.append(w)
    return "".join("".join(lines) for name, lines in pieces if name is None or name in used)


@lru_cache(maxsize=None)
def header(name: str) -> str:
    """The leading comment block of a script file (without includes)."""
    root = resources.files(__package__) / "lua"
    lines = []
    for line in (root / f"{name}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--") or line.startswith("--!"):
            break
        lines.append(line)
    return "\n".join(lines)


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


@lru_cache(maxsize=None)
def _plain_client(cls) -> bool:
    """A redis-py client class whose calls may go on a connection of its pool (not a pipeline,
    not a cluster client). Cached per class: ``isinstance`` against ``Pipeline`` is slow."""
    return issubclass(cls, redis.Redis) and not issubclass(cls, redis.client.Pipeline)


#: Bumped in a child process after a fork: a connection found in the thread's last-used slot
#: is this process's own only while the number it was kept with is the current one.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def _own_connection(client):
    """This thread's own connection of ``client``'s pool (a new one after a fork), or None when
    the client is not a plain redis-py client (a pipeline, a cluster client). The last one used
    is kept in the thread's slot ``last`` as ``(pool, client class, fork number, connection)``,
    checked first: the calls of one consumer or producer go to one pool, call after call."""
    pool = getattr(client, "connection_pool", None)
    last = getattr(_pinned, "last", None)
    if last is not None and last[0] is pool and last[1] is type(client) and last[2] == _forks[0]:
        return last[3]
    if pool is None or not _plain_client(type(client)):
        return None
    held = getattr(_pinned, "held", None)
    if held is None:
        held = _pinned.held = _Held()
    mine = held.conns.get(pool)
    if mine is None or mine[0] != os.getpid():
        mine = held.conns[pool] = (os.getpid(), pool.get_connection())  # kept until the thread ends, or it fails
    _pinned.last = (pool, type(client), _forks[0], mine[1])
    return mine[1]


def _drop_connection(client, conn):
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
    except OutOfMemoryError:  # a full Redis loads nothing: this call goes by EVALSHA, a later one loads
        return False
    except ResponseError as exc:
        text = str(exc)
        if "already exists" not in text:
            if not ("unknown command" in text or "unknown subcommand" in text or text.startswith("NOPERM")
                    or "no permissions" in text):
                raise  # the library itself is wrong: a bug to see, not to run around
            _functions[pool] = False
            return False
    _functions[pool] = True
    return True


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


class _FirstSend(str):
    """The type of ``FIRST_SEND``."""


#: An argument a call carries on its first send only: a script may then skip what only a repeat
#: needs (the insert skips the look-up of a publish id the client just made). Every path that
#: may send a call again (a retry after a connection error, redis-py's own retries of a pipeline
#: or a script, a cluster's reroute) sends ``resent(args)`` instead, where it reads "1".
FIRST_SEND = _FirstSend("F")


def resent(args) -> list:
    """``args`` as a call that may have been sent before carries them (``FIRST_SEND`` -> "1")."""
    return ["1" if a is FIRST_SEND else a for a in args]


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
            misses = conn._pq_spin_misses = getattr(conn, "_pq_spin_misses", 0) + 1
            conn._pq_spin_skip = min(1 << misses, C.SPIN_BACKOFF_MAX)
            return 0
        conn._pq_spin_misses = 0
        return n


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
    reader = parser._reader
    if conn.health_check_interval:
        conn.check_health()  # (a PING after a long silence, as redis-py's send would)
    try:
        sock.sendall(packed)
        push = getattr(parser, "_hiredis_PushNotificationType", None)  # (RESP3; None with older hiredis)
        while True:
            reply = reader.gets()
            if reply is _NOT_ENOUGH and spin_ns:
                n = _spin_recv(conn, sock, buf, spin_ns)
                if n:
                    reader.feed(buf, 0, n)
                    reply = reader.gets()
            while reply is _NOT_ENOUGH:
                n = sock.recv_into(buf)
                if not n:
                    raise RedisConnectionError(f"Connection closed by {conn.host}:{conn.port}")
                reader.feed(buf, 0, n)
                reply = reader.gets()
            if push is None or type(reply) is not push:
                break
            parser.handle_push_response(reply)  # a push message before the reply: redis-py's handlers
    except (BlockingIOError, socket.timeout) as exc:  # the kernel's timeout ran out
        conn.disconnect()
        raise RedisTimeoutError(f"Timeout waiting for {conn.host}:{conn.port}") from exc
    except OSError as exc:
        conn.disconnect()
        raise RedisConnectionError(f"Error talking to {conn.host}:{conn.port}: {exc}") from exc
    except BaseException:  # (a protocol error, an interrupt mid-reply: the stream is unusable)
        conn.disconnect()
        raise
    if conn.health_check_interval:
        conn.next_health_check = time.monotonic() + conn.health_check_interval
    if isinstance(reply, ResponseError):
        raise reply
    return reply


def _function_missing(exc: Exception) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith("Function not found")


def _readonly(exc: Exception) -> bool:
    """Is ``exc`` a READONLY reply (the server is a replica now)?"""
    return isinstance(exc, ReadOnlyError) or str(exc).startswith("READONLY")


def _demoted(conn, exc: Exception) -> RedisConnectionError:
    """The connection error a READONLY reply becomes (its connection already dropped)."""
    where = f" at {conn.host}:{conn.port}" if conn is not None and hasattr(conn, "host") else ""
    return RedisConnectionError(f"the Redis server{where} is a read-only replica now (a failover demoted it): "
                                f"the connection is closed, the next call connects again ({exc})")


def _raise_if_demoted(client, conn, exc: Exception) -> None:
    """For a READONLY reply on ``conn`` (of ``client``'s pool): the connection dropped and the
    connection error it becomes raised; nothing for any other error."""
    if _readonly(exc):
        _drop_connection(client, conn)
        raise _demoted(conn, exc) from exc


class LuaScript:
    """One script: ``script(keys=..., args=..., client=...)`` runs it, as a function of the
    library where the server has functions, else by EVALSHA; ``words(client, keys, args)`` is
    the same call as a command, for pipelines."""

    def __init__(self, client: redis.Redis, name: str):
        self.name = name
        self.script = source(name)
        self._script = client.register_script(self.script)
        self.sha = self._script.sha
        self.function = library().functions[name]

    def words(self, client, keys, args) -> tuple:
        """The call as a command for a pipeline (which redis-py may send again: ``resent``)."""
        args = resent(args)
        if _functions.get(getattr(client, "connection_pool", None)):
            return ("FCALL", self.function, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __call__(self, keys=(), args=(), client=None):
        if is_cluster(client):
            return self._on_cluster(keys, args, client)
        conn = _own_connection(client)
        if conn is None:
            return self._by_redis_py(keys, args, client)
        try:
            return self._run_on(conn, client.connection_pool, keys, args)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            _drop_connection(client, conn)
            return self._by_redis_py(keys, args, client)
        except ResponseError as exc:
            _raise_if_demoted(client, conn, exc)
            raise

    def _by_redis_py(self, keys, args, client):
        """The call through redis-py's ``Script`` (the client's retry policy, a fresh pooled
        connection, a cluster's routing), which may send it more than once: ``resent``."""
        try:
            return self._script(keys=keys, args=resent(args), client=client)
        except ResponseError as exc:
            pool = getattr(client, "connection_pool", None)
            if not _readonly(exc) or pool is None:
                raise
            pool.disconnect(inuse_connections=False)  # (its idle connections: to the demoted server)
            raise _demoted(None, exc) from exc

    def _on_cluster(self, keys, args, cluster):
        """The call on its slot's master (``_once_on_cluster``), made again while the slot
        moves (nothing of it was written) for up to ``cluster_retry_seconds``, with ``resent``
        arguments (it is the same call), then ``ClusterUnsettled`` (``until_settled``)."""
        again = None

        def attempt(n):
            nonlocal again
            if n and again is None:
                again = resent(args)
            return self._once_on_cluster(keys, args if n == 0 else again, cluster)

        return until_settled(cluster, keys[0], attempt)

    def _once_on_cluster(self, keys, args, cluster):
        """The call on the master of its keys' slot, on this thread's connection to it; after a
        moved slot or a failed node, through ``RedisCluster`` (refreshed layout, retries)."""
        node = node_client(cluster, keys[0])
        conn = _own_connection(node)
        try:
            return self._run_on(conn, node.connection_pool, keys, args)
        except REROUTE as exc:
            if not isinstance(exc, ResponseError):  # a dead connection; a MOVED reply leaves it fine
                _drop_connection(node, conn)
            settling["rerouted"] += 1
            return self._by_redis_py(keys, args, cluster)

    def replicated(self, keys, args, client, replicas: int, timeout_ms: int) -> tuple:
        """Run the script, then ``WAIT replicas timeout_ms`` on the same connection (WAIT
        counts the replicas that have every write that connection made): ``(reply, number of
        replicas that acknowledged)``. A connection error is tried once more on a new
        connection (the calls that take this path are idempotent: a publish id, an ack)."""
        for attempt in (1, 2):
            conn = _own_connection(client)
            if conn is None:  # a pipeline or cluster client: the script and WAIT in one pipeline
                # (per node, on a cluster: see run_replicated)
                replies, acked = run_replicated(client, [(self, keys, args)], replicas, timeout_ms)
                return replies[0], acked
            try:
                reply = self._run_on(conn, client.connection_pool, keys, args if attempt == 1 else resent(args))
                conn.send_command("WAIT", replicas, timeout_ms)
                return reply, int(conn.read_response())
            except (RedisConnectionError, RedisTimeoutError, OSError):
                _drop_connection(client, conn)
                if attempt == 2:
                    raise
            except ResponseError as exc:
                _raise_if_demoted(client, conn, exc)
                raise
        raise AssertionError("unreachable")

    def _run_on(self, conn, pool, keys, args):
        """The script on ``conn``: FCALL (the library loaded first when needed), else EVALSHA."""
        use = _functions.get(pool)
        if use is None:
            use = _load_library(conn, pool)
        if use:
            spin = _spin.get(pool, _SPIN_DEFAULT)
            try:
                return _roundtrip(conn, ("FCALL", self.function, len(keys), *keys, *args), spin)
            except ResponseError as exc:  # the library is gone (restart, FUNCTION FLUSH): load it
                if not _function_missing(exc) or not _load_library(conn, pool):
                    raise
                return _roundtrip(conn, ("FCALL", self.function, len(keys), *keys, *args), spin)
        try:
            _send(conn, ("EVALSHA", self.sha, len(keys), *keys, *args))
            return conn.read_response()
        except NoScriptError:  # Redis restarted or flushed its scripts: load, run again
            conn.send_command("SCRIPT", "LOAD", self.script)
            conn.read_response()
            _send(conn, ("EVALSHA", self.sha, len(keys), *keys, *args))
            return conn.read_response()


class Scripts:
    """The registered scripts, as attributes: ``scripts.pop(keys=..., args=..., client=...)``."""

    def __init__(self, client: redis.Redis):
        for name in SCRIPT_NAMES:
            setattr(self, name, LuaScript(client, name))


_lock = threading.Lock()
_scripts: Scripts | None = None


def get_scripts(client: redis.Redis) -> Scripts:
    """Process-wide ``Scripts``; each call site passes its own client (``client=``)."""
    global _scripts
    if _scripts is None:
        with _lock:
            if _scripts is None:
                _scripts = Scripts(client)
    return _scripts


def run_calls(client: redis.Redis, calls: list[tuple]) -> list:
    """Run several script calls ``(Script, keys, args)`` in one round trip.

    A pipeline of plain FCALL (or EVALSHA, ``LuaScript.words``): redis-py's own script
    pipelining asks SCRIPT EXISTS first, a second round trip. A call that finds its function or
    script missing (Redis restarted) did not run; it is run again on its own, which loads it.
    """
    if not calls:
        return []
    if is_cluster(client):
        replies = _per_node(client, calls, _pipelined)
    else:
        replies = _pipelined(client, calls)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _pipelined(client: redis.Redis, calls: list[tuple]) -> list:
    """``calls`` on one server in one round trip: their replies, errors in place."""
    if len(calls) == 1:  # one call needs no pipeline (Script reloads itself on NOSCRIPT)
        script, keys, args = calls[0]
        try:
            return [script(keys=keys, args=args, client=client)]
        except ResponseError as exc:
            return [exc]
    with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.execute_command(*script.words(client, keys, args))
        replies = pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError) or _function_missing(reply):
            script, keys, args = calls[i]
            try:
                replies[i] = script(keys=keys, args=resent(args), client=client)
            except ResponseError as exc:
                replies[i] = exc
    return replies


def _per_node(cluster, calls: list[tuple], run_group) -> list:
    """``calls`` on a cluster: each master's share with ``run_group(node client, calls)`` (one
    round trip per node), replies in the order of ``calls``, errors in place. A call that met a
    moved slot or a failed node runs again alone, through the cluster client. (A pipeline cut
    off midway may have run some of its calls already: run again, an insert is stored once by
    its publish id, an ack finds its lease gone, a pop leases other entries, whose leases run
    out: at least once holds, as for a pipeline redis-py retries on one server.)"""
    replies: list = [None] * len(calls)
    for node, idx in by_node(cluster, range(len(calls)), lambda i: calls[i][1][0]).items():
        try:
            got = run_group(node, [calls[i] for i in idx])
        except Exception as exc:  # noqa: BLE001 - only a moved slot or a lost node is run again
            if not _rerun(exc):
                raise
            got = [exc] * len(idx)
        for i, reply in zip(idx, got):
            if _rerun(reply):
                script, keys, args = calls[i]
                try:
                    reply = script(keys=keys, args=resent(args), client=cluster)
                except ResponseError as exc:
                    reply = exc
            replies[i] = reply
    return replies


def _rerun(reply) -> bool:
    """Is a call's reply on a cluster node one to run again alone through the cluster client
    (a moved slot, a lost node, a slot that is moving: nothing of it was written)?"""
    return isinstance(reply, Exception) and (isinstance(reply, REROUTE) or unsettled(reply))


def run_replicated(client: redis.Redis, calls: list[tuple], replicas: int, timeout_ms: int) -> tuple[list, int]:
    """``run_calls``, then ``WAIT replicas timeout_ms`` on the same connection, in the same
    round trip: ``(replies, number of replicas that acknowledged every write of the calls)``.

    Redis replicates asynchronously: a write the master answered can be lost when a replica is
    promoted before it arrived. WAIT returns when ``replicas`` replicas have the connection's
    writes, or after the timeout with how many have them (it cannot undo a write).
    """
    if is_cluster(client):
        acked = [replicas]

        def on_node(node, group):
            # (replies in place: only the calls that met a moved or moving slot run again)
            try:
                replies, n = _replicated_in_place(node, group, replicas, timeout_ms)
            except Exception as exc:  # noqa: BLE001
                if _rerun(exc):
                    acked[0] = 0  # run again through the cluster client, without a WAIT: not confirmed
                raise
            acked[0] = 0 if any(_rerun(r) for r in replies) else min(acked[0], n)
            return replies

        replies = _per_node(client, calls, on_node)
        acked = acked[0]
    else:
        replies, acked = _replicated_in_place(client, calls, replicas, timeout_ms)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies, acked


def _replicated_in_place(client: redis.Redis, calls: list[tuple], replicas: int, timeout_ms: int) -> tuple[list, int]:
    """``run_replicated`` on one server, the calls' error replies in place."""
    if len(calls) == 1 and _own_connection(client) is not None:
        script, keys, args = calls[0]
        try:
            reply, acked = script.replicated(keys, args, client, replicas, timeout_ms)
        except ResponseError as exc:
            return [exc], 0
        return [reply], acked
    with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.execute_command(*script.words(client, keys, args))
        pipe.execute_command("WAIT", replicas, timeout_ms)
        replies = pipe.execute(raise_on_error=False)
    acked = replies.pop()
    if isinstance(acked, Exception):
        raise acked
    acked = int(acked)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError) or _function_missing(reply):
            script, keys, args = calls[i]  # it did not run: run it on its own, which loads it
            if _own_connection(client) is None:  # no connection of our own to WAIT on: not confirmed
                replies[i], acked = script(keys=keys, args=resent(args), client=client), 0
            else:
                try:
                    replies[i], again = script.replicated(keys, resent(args), client, replicas, timeout_ms)
                except ResponseError as exc:
                    replies[i], again = exc, 0
                acked = min(acked, again)
    return replies, acked
