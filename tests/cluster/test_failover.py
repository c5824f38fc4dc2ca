"""A master failover on the cluster: what it loses without WAIT, what ``wait_replicas=1`` keeps.

Redis replicates asynchronously: a write the master acknowledged and had not yet sent to its
replica is lost when the replica takes over. On loopback that window is a fraction of a
millisecond, so the test widens it the way a slow or partitioned replica would: the replica is
stopped (SIGSTOP) while the producers go on, then the master is killed (SIGKILL) and the
replica resumed and promoted.
"""

from __future__ import annotations

import os
import signal

import pytest

from celery_pq import NotReplicated, PriorityQueue
from celery_pq.testing import RedisCluster

pytestmark = pytest.mark.cluster

BIG = b"x" * 64 * 1024  # more than the kernel's socket buffers hold, over a few hundred publishes


def stored(client, q, ids) -> set:
    return {i for i in ids if q.exists(i)}


def test_failover_loses_unreplicated_publishes_without_wait_and_none_acknowledged_with_wait(healed, spread,
                                                                                              capsys):
    cluster: RedisCluster = healed
    client = cluster.client(socket_timeout=5)
    # Given two queues on the same master: one without WAIT, one with wait_replicas=1
    name = spread[0]
    master = cluster.master_of(PriorityQueue(client, name).keys.entries)
    [replica] = cluster.replicas_of(master)
    plain = PriorityQueue(client, name, dedupe_seconds=0)
    other = next(n for n in (f"{name}w{i}" for i in range(1000))
                 if cluster.master_of(PriorityQueue(client, n).keys.entries) is master)
    safe = PriorityQueue(client, other, wait_replicas=1, wait_timeout=0.05)

    # While the replica keeps up: both kinds are acknowledged
    acked_plain = [plain.insert(b"early", 1, id=f"early{i}") for i in range(20)]
    acked_safe = [safe.insert(b"early", 1, id=f"early{i}") for i in range(20)]

    # When the replica stops reading, the master goes on acknowledging publishes without WAIT;
    # with WAIT, the publish raises NotReplicated: it is not acknowledged
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        late_plain = [plain.insert(BIG, 1, id=f"late{i}") for i in range(400)]
        refused = 0
        for i in range(10):
            try:
                acked_safe.append(safe.insert(b"late", 1, id=f"late{i}"))
            except NotReplicated:
                refused += 1
        master.kill()
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    cluster.wait_promotion([replica])

    # Then: the publishes acknowledged without WAIT while the replica lagged are partly lost
    after = cluster.client(socket_timeout=5)
    plain, safe = PriorityQueue(after, plain.name), PriorityQueue(after, safe.name)
    kept_early = stored(after, plain, acked_plain)
    kept_late = stored(after, plain, late_plain)
    lost = len(late_plain) - len(kept_late)
    with capsys.disabled():
        print(f"\nfailover without WAIT: {lost} of {len(late_plain)} acknowledged publishes made while the "
              f"replica lagged were lost ({len(kept_early)} of {len(acked_plain)} made before kept)")
    assert kept_early == set(acked_plain)
    assert lost > 0
    # and with wait_replicas=1 every acknowledged publish survived; the unacknowledged ones raised
    assert refused == 10
    assert stored(after, safe, acked_safe) == set(acked_safe)
    # A client made before the failover follows it: its reads and scripts reach the new master
    assert PriorityQueue(client, safe.name).stats()["waiting"] >= len(acked_safe)
    assert PriorityQueue(client, safe.name).peek(1)
    after.close()
    client.close()
