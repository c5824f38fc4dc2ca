"""The runner: the scripts as callables (``get_scripts``) that run a call (``LuaScript.run``,
with WAIT for replicas: docs/deployments.md) or send it without waiting (``send_nowait``), and
a batch in one round trip (``run_replicated``). On a Redis Cluster each call goes
to its slot's master: docs/cluster.md ("How it works", "Resharding").
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

from ..storage.connections import REROUTE, by_node, is_cluster, node_client, settling, unsettled, until_settled
from .assembly import SCRIPT_NAMES, library, source
from .wire import LOST, Flight, drop_line, function_missing, own_line, raise_if_demoted, send, spin_of, uses_functions


class _FirstSend(str):
    pass


#: An argument a call carries on its first send only, so a script may skip what only a repeat
#: needs (the insert's look-up of a publish id just made). Every path that may send a call again
#: sends ``resent(args)``, where it reads "1".
FIRST_SEND = _FirstSend("F")


def resent(args) -> list:
    """``args`` as a call that may have been sent before carries them (``FIRST_SEND`` -> "1")."""
    return ["1" if a is FIRST_SEND else a for a in args]


class LuaScript:
    """One script: ``script(keys=..., args=..., client=...)`` runs it (FCALL, else EVALSHA)."""

    def __init__(self, client: redis.Redis, name: str):
        self.name = name
        self.script = source(name)
        self._script = client.register_script(self.script)
        self.sha = self._script.sha  # type: ignore[attr-defined]  # (not in the type stubs)
        self.function = library().functions[name]

    def words(self, client, keys, args) -> tuple:
        """The call as a command for a pipeline (``resent``: redis-py may send it again)."""
        return self.command(uses_functions(client), keys, resent(args))

    def command(self, functions: bool, keys, args) -> tuple:
        if functions:
            return ("FCALL", self.function, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __call__(self, keys=(), args=(), client=None):
        return self.run(client, keys, args)[0]

    def run(self, client, keys, args, wait: tuple | None = None) -> tuple[Any, int]:
        """The call on the thread's own connection (``wire.Line``), ``WAIT *wait`` after it there:
        ``(its reply, replicas that acknowledged)`` (0 without ``wait`` or a ``Line``). After a lost
        connection: through redis-py's ``Script``, or with ``wait`` once more on a new connection."""
        if is_cluster(client):
            return self._on_cluster(keys, args, client), 0
        for again in (False, True):
            line = None if again and wait is None else own_line(client)
            if line is None:
                return self._by_redis_py(keys, args, client), 0
            try:
                reply = line.run(client.connection_pool, self, keys, resent(args) if again else args)
                return reply, int(line.call("WAIT", *wait)) if wait else 0
            except LOST:
                drop_line(client, line)
                if again:
                    raise
            except ResponseError as exc:
                raise_if_demoted(client, line, exc)
                raise
        raise AssertionError("unreachable")

    def send_nowait(self, keys, args, client) -> Flight | None:
        """The call sent on the thread's own connection without waiting (``wire.Flight``); None,
        nothing sent, without a ``Line`` or the library, or when the send failed."""
        line = own_line(client)
        if line is None or not uses_functions(client):
            return None
        try:
            send(line.conn, self.command(True, keys, resent(args)))
        except LOST:
            drop_line(client, line)
            return None
        return Flight(line, spin_of(client.connection_pool))

    def _by_redis_py(self, keys, args, client):
        try:
            return self._script(keys=keys, args=resent(args), client=client)
        except ResponseError as exc:
            raise_if_demoted(client, None, exc)
            raise

    def _on_cluster(self, keys, args, cluster):
        """The call on its slot's master, again while the slot moves (``until_settled``)."""
        return until_settled(
            cluster, keys[0], lambda n: self._once_on_cluster(keys, resent(args) if n else args, cluster)
        )

    def _once_on_cluster(self, keys, args, cluster):
        """On the ``Line`` to the slot's master; after a moved slot or a failed node, by ``RedisCluster``."""
        node = node_client(cluster, keys[0])
        line = own_line(node)
        assert line is not None  # (a node's client is a plain one)
        try:
            return line.run(node.connection_pool, self, keys, args)
        except REROUTE as exc:
            if not isinstance(exc, ResponseError):  # a dead connection; a MOVED reply leaves it fine
                drop_line(node, line)
            settling["rerouted"] += 1
            return self._by_redis_py(keys, args, cluster)


_lock = threading.Lock()
_scripts: SimpleNamespace | None = None


def get_scripts(client: redis.Redis) -> SimpleNamespace:
    """The process's ``LuaScript`` of each script, by name; each call passes its own client."""
    global _scripts
    if _scripts is None:
        with _lock:
            if _scripts is None:
                _scripts = SimpleNamespace(**{name: LuaScript(client, name) for name in SCRIPT_NAMES})
    return _scripts


def run_replicated(client: redis.Redis, calls: list[tuple], replicas: int, timeout_ms: int) -> tuple[list, int]:
    """Several ``(script, keys, args)`` calls in one round trip, then (``replicas`` > 0) ``WAIT
    replicas timeout_ms``: ``(replies, replicas that acknowledged every write)``, 0 without WAIT;
    on a cluster the fewest of any node, 0 when a call was rerouted. The first error reply raised."""
    wait = (replicas, timeout_ms) if replicas else None
    replies, acked = (_per_node if is_cluster(client) else _in_place)(client, calls, wait)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies, acked


def _in_place(client: redis.Redis, calls: list[tuple], wait: tuple | None) -> tuple[list, int]:
    """``run_replicated`` on one server, error replies in place; a call whose function or script
    was missing (a restart) runs again alone, which loads it."""
    if len(calls) == 1 and (wait is None or own_line(client) is not None):  # no pipeline
        script, keys, args = calls[0]
        return _alone(client, script, keys, args, wait)
    with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.execute_command(*script.words(client, keys, args))
        if wait:
            pipe.execute_command("WAIT", *wait)
        replies = pipe.execute(raise_on_error=False)
    acked = replies.pop() if wait else 0
    if isinstance(acked, Exception):
        raise acked
    acked = int(acked)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError) or function_missing(reply):
            script, keys, args = calls[i]  # it did not run: alone, it loads itself
            [replies[i]], again = _alone(client, script, keys, resent(args), wait)
            acked = min(acked, again)
    return replies, acked


def _alone(client, script, keys, args, wait: tuple | None) -> tuple[list, int]:
    """``LuaScript.run``, its error reply in place: ``([reply], replicas that acknowledged)``."""
    try:
        reply, acked = script.run(client, keys, args, wait)
        return [reply], acked
    except ResponseError as exc:
        return [exc], 0


def _per_node(cluster, calls: list[tuple], wait: tuple | None) -> tuple[list, int]:
    """``run_replicated`` on a cluster, each master's share ``_in_place``. A call that met a moved
    slot or a failed node runs again alone through the cluster client, without a WAIT (then 0). It
    may have run already: at least once holds (publish ids, token-checked acks, leases running out)."""
    replies: list = [None] * len(calls)
    acked = wait[0] if wait else 0
    for node, idx in by_node(cluster, range(len(calls)), lambda i: calls[i][1][0]).items():
        try:
            got, n = _in_place(node, [calls[i] for i in idx], wait)
        except Exception as exc:
            if not _rerun(exc):
                raise
            got, n = [exc] * len(idx), 0
        acked = min(acked, n)
        for i, reply in zip(idx, got):
            if _rerun(reply):
                script, keys, args = calls[i]
                [reply], acked = _alone(cluster, script, keys, resent(args), None)
            replies[i] = reply
    return replies, acked


def _rerun(reply) -> bool:
    """Run again through the cluster client (a moved, lost or moving slot: nothing written)?"""
    return isinstance(reply, Exception) and (isinstance(reply, REROUTE) or unsettled(reply))
