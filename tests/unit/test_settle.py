"""The waiting of a call whose Redis Cluster slot is moving (connections.until_settled): which
errors count as "the slot is moving", the calls made again (the same call: resent arguments),
the bound, and the error kombu then sees. Redis is not needed: the attempts are stand-ins (the
real migration is tests/cluster/test_resharding.py)."""

from __future__ import annotations

import time

import pytest
import redis
from redis import exceptions as rex

from celery_pq import ClusterUnsettled
from celery_pq.scripts import FIRST_SEND, LuaScript
from celery_pq.storage import connections as cn
from celery_pq.transport.channel import Transport


class Cluster:
    """A stand-in for a RedisCluster client (until_settled only keys its bound by it)."""


NON_LOCAL = "Script attempted to access a non local key in a cluster node script: pq_x_insert, on @user_function:12."


@pytest.mark.parametrize(
    "exc",
    [
        rex.TryAgainError("Multiple keys request during rehashing of slot"),
        rex.AskError("5258 127.0.0.1:7001"),
        rex.MovedError("5258 127.0.0.1:7001"),
        rex.ClusterError("TTL exhausted."),
        rex.ClusterDownError("The cluster is down"),
        rex.SlotNotCoveredError("Slot 5258 is not covered by the cluster."),
        rex.ResponseError(NON_LOCAL),
        rex.ResponseError("Script attempted to execute a command while the cluster is down"),
        rex.ResponseError("ERR " + NON_LOCAL),
    ],
)
def test_the_errors_of_a_moving_slot_are_unsettled(exc):
    assert cn.unsettled(exc)


@pytest.mark.parametrize(
    "exc",
    [
        rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        rex.ResponseError("PQ -8 pq:{q}:ii 0-hT 1PhT"),
        rex.ResponseError("PQ -8 pq:{TRYAGAIN non local key}:ii 0-hT 1PhT"),  # (a queue's name is no cause)
        rex.ConnectionError("Connection refused"),
        ValueError("x"),
    ],
)
def test_other_errors_are_not(exc):
    assert not cn.unsettled(exc)


def test_a_refused_call_is_made_again_until_the_slot_settles():
    cluster = Cluster()
    tries = []

    def attempt(n):
        tries.append(n)
        if n < 3:
            raise rex.ResponseError(NON_LOCAL)
        return "done"

    before = cn.settling["refused"]
    assert cn.until_settled(cluster, "pq:{q}:ii", attempt) == "done"
    assert tries == [0, 1, 2, 3]
    assert cn.settling["refused"] - before == 3


def test_a_slot_that_does_not_settle_ends_in_a_connection_error_after_the_bound():
    cluster = Cluster()
    cn.set_cluster_retry(cluster, 0.2)
    tries = []

    def attempt(n):
        tries.append(n)
        raise rex.TryAgainError("Multiple keys request during rehashing of slot")

    started = time.monotonic()
    with pytest.raises(ClusterUnsettled) as caught:
        cn.until_settled(cluster, b"pq:{orders}:ii", attempt)
    waited = time.monotonic() - started
    assert 0.1 <= waited <= 2.0
    assert len(tries) > 2  # tried again meanwhile, with pauses (not a busy loop: 0.01 s doubling)
    assert "pq:{orders}:ii" in str(caught.value) and "cluster_retry_seconds" in str(caught.value)
    # kombu and Celery take it for a lost connection: a worker reconnects, a publish is retried
    assert isinstance(caught.value, rex.ConnectionError)
    assert isinstance(caught.value, Transport.connection_errors)


def test_another_error_is_raised_at_once():
    tries = []

    def attempt(n):
        tries.append(n)
        raise rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    with pytest.raises(rex.ResponseError, match="WRONGTYPE"):
        cn.until_settled(Cluster(), "k", attempt)
    assert tries == [0]


def test_the_call_made_again_is_the_same_call_its_publish_id_marked_as_resent(monkeypatch):
    script = LuaScript(redis.Redis(), "insert")  # (register_script connects to nothing)
    sent = []

    def once(keys, args, cluster):
        sent.append(list(args))
        if len(sent) < 3:
            raise rex.TryAgainError("Multiple keys request during rehashing of slot")
        return ["ok"]

    monkeypatch.setattr(script, "_once_on_cluster", once)
    assert script._on_cluster(["pq:{q}:ii"], ["x", FIRST_SEND, "pid"], Cluster()) == ["ok"]
    # the first send says so (its publish id cannot be stored yet); a send again may have been
    # stored before ("1"), with the same publish id
    assert sent[0][1] is FIRST_SEND
    assert sent[1] == sent[2] == ["x", "1", "pid"]


def test_cluster_errors_that_reach_kombu_are_connection_errors():
    for cls in (
        rex.ClusterError,
        rex.ClusterDownError,
        rex.TryAgainError,
        rex.AskError,
        rex.MovedError,
        rex.ReadOnlyError,
        ClusterUnsettled,
    ):
        assert issubclass(cls, Transport.connection_errors), cls


def test_an_impatient_thread_does_not_wait():
    # the lease keeper's calls: the keeper tries again on its own timer
    tries = []

    def attempt(n):
        tries.append(n)
        raise rex.TryAgainError("Multiple keys request during rehashing of slot")

    with cn.impatient():
        with pytest.raises(ClusterUnsettled):
            cn.until_settled(Cluster(), "k", attempt)
    assert tries == [0]
    cn.set_cluster_retry(cluster := Cluster(), 0.05)
    with pytest.raises(ClusterUnsettled):
        cn.until_settled(cluster, "k", attempt)  # (outside the block: waits again)
    assert len(tries) > 2
