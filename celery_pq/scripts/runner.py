"""The runner: the scripts as callables, one call or a batch, on a plain server or a cluster.

``get_scripts(client)`` gives the process's ``Scripts``, one ``LuaScript`` per script; a call
``scripts.pop(keys=..., args=..., client=...)`` goes on the thread's own connection (wire.py).
A connection error hands the call to redis-py's ``Script`` (with the client's own retry policy)
on a fresh pooled connection. ``run_calls`` sends several calls in one round trip (a pipeline
of plain FCALL or EVALSHA).

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
(lua/includes/queue.lua) stops it before its first write, or Redis or redis-py answers TRYAGAIN,
ASK, CLUSTERDOWN, "TTL exhausted" (``connections.unsettled``). Such a call wrote nothing; it
is made again, after a pause that doubles from C.SETTLE_PAUSE_FIRST to C.SETTLE_PAUSE_MAX
seconds, until the slot settles or ``cluster_retry_seconds`` have passed
(``connections.until_settled``): then it fails with ``ClusterUnsettled``, a connection error to
kombu.
"""

from __future__ import annotations

import threading

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..storage.connections import REROUTE, by_node, is_cluster, node_client, settling, unsettled, until_settled
from .assembly import SCRIPT_NAMES, library, source
from .wire import (
    Flight,
    drop_connection,
    function_missing,
    own_connection,
    raise_if_demoted,
    raise_if_pool_demoted,
    run_on,
    send_nowait,
    uses_functions,
)


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


class LuaScript:
    """One script: ``script(keys=..., args=..., client=...)`` runs it, as a function of the
    library where the server has functions, else by EVALSHA; ``words(client, keys, args)`` is
    the same call as a command, for pipelines."""

    def __init__(self, client: redis.Redis, name: str):
        self.name = name
        self.script = source(name)
        self._script = client.register_script(self.script)
        self.sha = self._script.sha  # type: ignore[attr-defined]  # (not in the type stubs)
        self.function = library().functions[name]

    def words(self, client, keys, args) -> tuple:
        """The call as a command for a pipeline (which redis-py may send again: ``resent``)."""
        args = resent(args)
        if uses_functions(client):
            return ("FCALL", self.function, len(keys), *keys, *args)
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __call__(self, keys=(), args=(), client=None):
        if is_cluster(client):
            return self._on_cluster(keys, args, client)
        conn = own_connection(client)
        if conn is None:
            return self._by_redis_py(keys, args, client)
        try:
            return run_on(conn, client.connection_pool, self, keys, args)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            drop_connection(client, conn)
            return self._by_redis_py(keys, args, client)
        except ResponseError as exc:
            raise_if_demoted(client, conn, exc)
            raise

    def send_nowait(self, keys, args, client) -> Flight | None:
        """The call sent without waiting for its reply (``wire.Flight``), on the thread's own
        connection of a plain server; None, nothing sent, where only a waiting call can be made
        (a cluster, a pipeline client, no lean connection, a send that failed: its connection
        is dropped)."""
        if is_cluster(client):
            return None
        conn = own_connection(client)
        if conn is None:
            return None
        try:
            return send_nowait(conn, client.connection_pool, self, keys, resent(args))
        except (RedisConnectionError, RedisTimeoutError, OSError):
            drop_connection(client, conn)
            return None

    def _by_redis_py(self, keys, args, client):
        """The call through redis-py's ``Script`` (the client's retry policy, a fresh pooled
        connection, a cluster's routing), which may send it more than once: ``resent``."""
        try:
            return self._script(keys=keys, args=resent(args), client=client)
        except ResponseError as exc:
            raise_if_pool_demoted(client, exc)
            raise

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
        conn = own_connection(node)
        try:
            return run_on(conn, node.connection_pool, self, keys, args)
        except REROUTE as exc:
            if not isinstance(exc, ResponseError):  # a dead connection; a MOVED reply leaves it fine
                drop_connection(node, conn)
            settling["rerouted"] += 1
            return self._by_redis_py(keys, args, cluster)

    def replicated(self, keys, args, client, replicas: int, timeout_ms: int) -> tuple:
        """Run the script, then ``WAIT replicas timeout_ms`` on the same connection (WAIT
        counts the replicas that have every write that connection made): ``(reply, number of
        replicas that acknowledged)``. A connection error is tried once more on a new
        connection (the calls that take this path are idempotent: a publish id, an ack)."""
        for attempt in (1, 2):
            conn = own_connection(client)
            if conn is None:  # a pipeline or cluster client: the script and WAIT in one pipeline
                # (per node, on a cluster: see run_replicated)
                replies, acked = run_replicated(client, [(self, keys, args)], replicas, timeout_ms)
                return replies[0], acked
            try:
                reply = run_on(conn, client.connection_pool, self, keys, args if attempt == 1 else resent(args))
                conn.send_command("WAIT", replicas, timeout_ms)
                return reply, int(conn.read_response())
            except (RedisConnectionError, RedisTimeoutError, OSError):
                drop_connection(client, conn)
                if attempt == 2:
                    raise
            except ResponseError as exc:
                raise_if_demoted(client, conn, exc)
                raise
        raise AssertionError("unreachable")


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
        if isinstance(reply, NoScriptError) or function_missing(reply):
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
        except Exception as exc:
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
        least = [replicas]  # (the fewest replicas any node's WAIT confirmed)

        def on_node(node, group):
            # (replies in place: only the calls that met a moved or moving slot run again)
            try:
                replies, n = _replicated_in_place(node, group, replicas, timeout_ms)
            except Exception as exc:
                if _rerun(exc):
                    least[0] = 0  # run again through the cluster client, without a WAIT: not confirmed
                raise
            least[0] = 0 if any(_rerun(r) for r in replies) else min(least[0], n)
            return replies

        replies = _per_node(client, calls, on_node)
        acked = least[0]
    else:
        replies, acked = _replicated_in_place(client, calls, replicas, timeout_ms)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies, acked


def _replicated_in_place(client: redis.Redis, calls: list[tuple], replicas: int, timeout_ms: int) -> tuple[list, int]:
    """``run_replicated`` on one server, the calls' error replies in place."""
    if len(calls) == 1 and own_connection(client) is not None:
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
        if isinstance(reply, NoScriptError) or function_missing(reply):
            script, keys, args = calls[i]  # it did not run: run it on its own, which loads it
            if own_connection(client) is None:  # no connection of our own to WAIT on: not confirmed
                replies[i], acked = script(keys=keys, args=resent(args), client=client), 0
            else:
                try:
                    replies[i], again = script.replicated(keys, resent(args), client, replicas, timeout_ms)
                except ResponseError as exc:
                    replies[i], again = exc, 0
                acked = min(acked, again)
    return replies, acked
