"""Fixtures of the deployment tests: a Sentinel group (a master, a replica, three sentinels),
all real processes on loopback (``celery_pq.testing``)."""

from __future__ import annotations

import pytest
import redis

from celery_pq.testing import RedisServer, SentinelServer, TLSRedisServer, wait_for
from celery_pq.testing.proxy import DelayProxy

#: Seconds a failover may take here: down-after 1 s, the vote, the promotion, with room for a
#: loaded machine.
FAILOVER_SECONDS = 30


class SentinelGroup:
    """A master, one replica and three sentinels (quorum 2) monitoring the master as ``m``.
    With ``replica_lag`` (seconds), the replica replicates through a proxy that delays the
    master's writes by that much (``celery_pq/testing/proxy.py``). With ``certs``
    (``make_certificates``), the master, the replica and the sentinels speak only TLS
    (replication and the sentinels' links too)."""

    master_name = "m"

    def __init__(self, replica_lag: float | None = None, certs: dict | None = None):
        self.servers: list[RedisServer] = []
        self.proxy = None
        try:
            # no 5 s wait for more replicas before the first full sync (Redis 7 default)
            def server(*args):
                if certs is None:
                    return RedisServer(*args)
                return TLSRedisServer(certs, "--tls-replication", "yes", *args)

            self.master = self._add(server("--repl-diskless-sync-delay", "0"))
            source = self.master.port
            if replica_lag:
                self.proxy = DelayProxy(self.master.port, replica_lag)
                source = self.proxy.port
            self.replica = self._add(server("--replicaof", "127.0.0.1", str(source)))
            self.sentinels = [self._add(SentinelServer(self.master.port, certs=certs)) for _ in range(3)]
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    def _add(self, server):
        self.servers.append(server)
        return server

    @property
    def url(self) -> str:
        """The broker URL naming the three sentinels (with ``master_name="m"``)."""
        return ";".join(s.pq_url for s in self.sentinels) + "/0"

    def options(self, **more) -> dict:
        return {"master_name": self.master_name, **more}

    def wait_ready(self, timeout: float = 30):
        """Until every sentinel knows the replica and the two other sentinels, and the replica
        is in sync: a failover can then promote it."""

        def ready():
            try:
                states = [s.master() for s in self.sentinels]
                link = self.replica.client(decode_responses=True).info("replication").get("master_link_status")
            except redis.RedisError:
                return False
            return (
                all(int(st["num-slaves"]) >= 1 and int(st["num-other-sentinels"]) >= 2 for st in states)
                and link == "up"
            )

        wait_for(ready, timeout, lambda: f"the sentinel group: {[s.log_tail(5) for s in self.sentinels]}", interval=0.1)

    def kill_master(self):
        self.master.kill()

    def wait_promoted(self, timeout: float = FAILOVER_SECONDS) -> RedisServer:
        """Until every sentinel names the replica as the master; the replica (now master)."""
        want = ("127.0.0.1", self.replica.port)

        def promoted():
            try:
                return (
                    all(s.master_address() == want for s in self.sentinels)
                    and self.replica.client(decode_responses=True).info("replication")["role"] == "master"
                )
            except redis.RedisError:
                return False

        wait_for(promoted, timeout, lambda: f"the promotion: {self.sentinels[0].log_tail(20)}", interval=0.1)
        return self.replica

    def close(self):
        for server in reversed(self.servers):
            server.close()
        if self.proxy is not None:
            self.proxy.close()


@pytest.fixture
def sentinel_group():
    group = SentinelGroup()
    try:
        yield group
    finally:
        group.close()


#: The replication lag of ``lagging_sentinel_group``: what a replica across a slow or busy link
#: trails by, in seconds.
REPLICA_LAG = 0.2


@pytest.fixture
def lagging_sentinel_group():
    group = SentinelGroup(replica_lag=REPLICA_LAG)
    try:
        yield group
    finally:
        group.close()
