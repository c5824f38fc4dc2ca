"""Redis Sentinel: a master, a replica and three sentinels on loopback; the master is SIGKILLed
mid-run, the sentinels promote the replica, and producers and consumers carry on.

Replication is asynchronous, so a failover can lose the publishes the master answered that had
not reached the replica yet. Without ``wait_replicas`` these tests count them (printed, and in
docs/reliability.md); with ``wait_replicas=1`` a publish returns only once the replica has it, and
none is lost.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import Connection, Producer
from kombu.mixins import ConsumerMixin

import celery_pq  # noqa: F401  registers pq://
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.storage.codec import decode
from celery_pq.testing import RedisServer, celery_env, make_certificates, start_worker, wait_for
from tests.deploy.conftest import REPLICA_LAG, SentinelGroup
from tests.support.consume import drain, make_queue

ROOT = Path(__file__).resolve().parents[2]

#: kombu's publish retry, long enough to cover a failover (down-after 1 s, vote, promotion).
RETRY = {"max_retries": 100, "interval_start": 0.1, "interval_step": 0.1, "interval_max": 0.3}


class Collector(ConsumerMixin):
    """A kombu consumer thread that reconnects by itself (kombu's ConsumerMixin)."""

    def __init__(self, connection, queue):
        self.connection = connection
        self.queue = queue
        self.got: list[int] = []
        self.connect_max_retries = 200

    def get_consumers(self, Consumer, channel):
        return [Consumer(queues=[self.queue], callbacks=[self.on_message], prefetch_count=20)]

    def on_message(self, body, message):
        self.got.append(body["i"])
        message.ack()

    def on_connection_error(self, exc, interval):
        pass  # expected while the master is down


class Publisher(threading.Thread):
    """Publishes ``{"i": n}`` with kombu's publish retry until stopped; ``returned`` holds the
    numbers whose publish returned, ``raised`` those whose publish raised."""

    def __init__(self, url, options, queue, start_at, *, retry=True, stop_on_error=False, pause=0.0):
        super().__init__(daemon=True)
        self.conn = Connection(url, transport_options=options)
        self.queue = queue
        self.n = start_at
        self.retry = retry
        self.stop_on_error = stop_on_error
        self.pause = pause
        self.stopped = threading.Event()
        # (n, when its publish began): a clock read after the call returns can land after a kill
        # that the call's answer came before, when this thread waits for the GIL.
        self.returned: list[tuple[int, float]] = []
        self.raised: list[int] = []

    def run(self):
        producer = Producer(self.conn)
        self.queue(self.conn.default_channel).declare()
        while not self.stopped.is_set():
            self.n += 1
            began = time.monotonic()
            try:
                producer.publish(
                    {"i": self.n},
                    exchange=self.queue.exchange,
                    routing_key=self.queue.routing_key,
                    retry=self.retry,
                    retry_policy=RETRY,
                )
            except Exception:
                self.raised.append(self.n)
                if self.stop_on_error:
                    return
                continue
            self.returned.append((self.n, began))
            if self.pause:
                time.sleep(self.pause)

    def stop(self):
        self.stopped.set()
        self.join(timeout=60)
        self.conn.release()


def body_number(payload) -> int:
    """The ``i`` of a stored kombu message ``{"i": n}`` (its body is base64 JSON)."""
    return json.loads(base64.b64decode(decode(payload)["body"]))["i"]


def test_kombu_producers_and_a_consumer_carry_on_when_the_master_is_killed(sentinel_group, key_prefix):
    g = sentinel_group
    options = g.options(key_prefix=key_prefix)
    queue = make_queue("fo")
    publishers = [Publisher(g.url, options, queue, k * 1_000_000, pause=0.002) for k in range(2)]
    collector = Collector(Connection(g.url, transport_options=options), queue)
    consumer = threading.Thread(target=collector.run, daemon=True)
    for p in publishers:
        p.start()
    consumer.start()
    try:
        # Given publishing and consuming under way
        wait_for(lambda: len(collector.got) > 200, 30, "consumption under way")
        # When the master is SIGKILLed and the sentinels promote the replica
        killed_at = time.monotonic()
        g.kill_master()
        dead_at = time.monotonic()  # kill_master waits for the process to be gone
        g.wait_promoted()
        promoted_at = time.monotonic()
        failover = promoted_at - killed_at
        # Then the same producers and consumer go on, on the new master, without a restart
        count_then = len(collector.got)
        wait_for(lambda: len(collector.got) > count_then + 200, 30, "consumption after the failover")
    finally:
        for p in publishers:
            p.stop()
    returned = {n for p in publishers for n, _ in p.returned}
    raised = {n for p in publishers for n in p.raised}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not returned <= set(collector.got):
        before = len(collector.got)
        time.sleep(1.0)
        if len(collector.got) == before and time.monotonic() > promoted_at + 5:
            break  # nothing more is coming: what is missing was lost in the failover
    collector.should_stop = True
    consumer.join(timeout=30)
    got = set(collector.got)
    lost = returned - got
    after = {n for p in publishers for n, t in p.returned if t > promoted_at}
    duplicates = len(collector.got) - len(got)
    print(
        f"\nFAILOVER kombu, no WAIT: published {len(returned)}, raised {len(raised)}, lost {len(lost)}, "
        f"duplicated {duplicates}, unexpected {len(got - returned - raised)}, failover {failover:.1f}s"
    )
    assert not raised, "kombu's publish retry covers the failover"
    assert after and after <= got, "nothing published after the promotion is lost"
    assert not got - returned - raised, "nothing consumed that was never published"
    # Replication is asynchronous: only publishes begun before the master was gone can be lost.
    assert all(t <= dead_at for p in publishers for n, t in p.returned if n in lost)


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_what_a_failover_loses_with_and_without_wait(lagging_sentinel_group, key_prefix, wait_replicas):
    """Four producers publish as fast as they can for two seconds while the replica trails the
    master by REPLICA_LAG; then the master is SIGKILLed. Every publish that returned is looked
    for on the promoted replica: without ``wait_replicas`` the last REPLICA_LAG seconds of them
    are gone; with ``wait_replicas=1`` each publish returned only once the replica had it, and
    none is missing."""
    g = lagging_sentinel_group
    options = g.options(key_prefix=key_prefix, wait_replicas=wait_replicas, wait_timeout=5)
    queue = make_queue("w")
    publishers = [Publisher(g.url, options, queue, k * 1_000_000, retry=False, stop_on_error=True) for k in range(4)]
    for p in publishers:
        p.start()
    time.sleep(2.0)
    killed_at = time.monotonic()
    g.kill_master()
    for p in publishers:
        p.join(timeout=30)  # each stops at its first error (the master is gone)
    new_master = g.wait_promoted()
    for p in publishers:
        p.stop()
    returned = [n for p in publishers for n, _ in p.returned]
    last_second = [n for p in publishers for n, t in p.returned if t > killed_at - 1.0]
    client = new_master.client()
    q = open_queue(client, "w", QueueSettings(key_prefix=key_prefix), declare=False)
    stored = {body_number(e.payload) for e in q.peek(len(returned) + 100)}
    lost = set(returned) - stored
    print(
        f"\nFAILOVER replica lag {REPLICA_LAG}s, wait_replicas={wait_replicas}: {len(returned)} publishes "
        f"returned in 2 s ({len(last_second)} in the last second), {len(lost)} lost"
    )
    assert returned
    if wait_replicas:
        assert not lost, f"acknowledged publishes lost with WAIT: {sorted(lost)[:20]}"
    else:
        assert lost, "without WAIT the lagging replica misses the last publishes"
        # Replication keeps the master's order: what a producer lost is the tail of what it
        # published (its last publishes before the kill), never one from before a kept one.
        for p in publishers:
            mine = [n for n, _ in p.returned]
            kept = [i for i, n in enumerate(mine) if n not in lost]
            assert not kept or all(n not in lost for n in mine[: kept[-1] + 1]), (
                "a publish was lost while a later one of the same producer was kept"
            )


@pytest.mark.e2e
def test_a_celery_worker_carries_on_when_the_master_is_killed(sentinel_group, key_prefix, tmp_path):
    """A real Celery worker subprocess and a Celery producer (publish retry on) through the
    sentinels; the master is SIGKILLed mid-run; the worker process is the same afterwards and
    runs what is published after the promotion."""
    g = sentinel_group
    records = RedisServer()  # the tasks record what ran here: it is not the broker that dies
    worker = None
    try:
        options = g.options(key_prefix=key_prefix)
        env = celery_env(
            ROOT,
            PQ_TEST_BROKER=g.url,
            PQ_TEST_OPTIONS=json.dumps(options),
            PQ_TEST_RECORD=records.url,
            PQ_TEST_PREFIX=key_prefix,
            PQ_TEST_ACKS_LATE="1",
        )
        worker = start_worker(
            "tests.e2e.app", cwd=ROOT, env=env, name="fo", prefetch_multiplier=None, log=tmp_path / "worker.log"
        )
        worker.wait_ready(60)
        app = Celery("fo-producer", broker=g.url)
        app.conf.broker_transport_options = options
        app.conf.task_publish_retry_policy = RETRY
        rec = records.client()

        def ran():
            return {json.loads(x)[0] for x in rec.lrange(f"{key_prefix}:rec:order", 0, -1)}

        sent, raised = [], []

        def send(n):
            try:
                app.send_task("e2e.record", args=[n, None], queue="q", retry=True)
                sent.append(n)
            except Exception:
                raised.append(n)

        for n in range(200):
            send(n)
        wait_for(lambda: len(ran()) >= 100, 60, "tasks running")
        g.kill_master()
        for n in range(200, 300):  # during the failover: each waits in the publish retry
            send(n)
        g.wait_promoted()
        for n in range(300, 400):
            send(n)
        wait_for(lambda: set(range(300, 400)) <= ran(), 60, "tasks published after the promotion")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not set(sent) <= ran():
            time.sleep(0.2)
        lost = set(sent) - ran()
        print(f"\nFAILOVER celery worker, no WAIT: sent {len(sent)}, raised {len(raised)}, lost {len(lost)}")
        # remote control (pub/sub and the reply queue) reaches the worker on the new master
        replies = wait_for(lambda: app.control.ping(timeout=2), 30, "a reply to ping")
        assert "pong" in str(replies), replies
        assert worker.poll() is None, "the worker process carried on (no restart)"
        assert not raised
        assert lost <= set(range(0, 300)), "nothing published after the promotion is lost"
        app.close()
    finally:
        if worker is not None:
            worker.stop()
        records.close()


def test_a_demoted_master_sends_clients_to_the_new_one(sentinel_group, key_prefix):
    """SENTINEL FAILOVER: the old master lives on as a replica. Clients still connected to it
    get READONLY (or, blocked, UNBLOCKED): they must reconnect to the new master, not fail."""
    g = sentinel_group
    options = g.options(key_prefix=key_prefix)
    queue = make_queue("dm")
    with (
        Connection(g.url, transport_options=options) as producer_conn,
        Connection(g.url, transport_options=options) as consumer_conn,
    ):
        producer = Producer(producer_conn)
        queue(producer_conn.default_channel).declare()
        got = []
        collector = Collector(consumer_conn, queue)
        collector.on_message = lambda body, message: (got.append(body["i"]), message.ack())
        thread = threading.Thread(target=collector.run, daemon=True)
        thread.start()
        for i in range(50):
            producer.publish(
                {"i": i}, exchange=queue.exchange, routing_key=queue.routing_key, retry=True, retry_policy=RETRY
            )
        wait_for(lambda: len(got) >= 50, 30, "50 before the failover")
        with redis.Redis(port=g.sentinels[0].port) as s:
            s.execute_command("SENTINEL", "FAILOVER", g.master_name)
        g.wait_promoted()
        wait_for(
            lambda: g.master.client(decode_responses=True).info("replication")["role"] == "slave",
            30,
            "the old master demoted",
        )
        for i in range(50, 100):
            producer.publish(
                {"i": i}, exchange=queue.exchange, routing_key=queue.routing_key, retry=True, retry_policy=RETRY
            )
        wait_for(lambda: set(range(100)) <= set(got), 30, "50 after the failover")
        collector.should_stop = True
        thread.join(timeout=30)


def test_tls_master_and_replica_behind_sentinels_carry_on_through_a_failover(key_prefix, tmp_path):
    # Given a master, a replica and three sentinels that speak only TLS (replication and the
    # sentinels' links too), and kombu connections pqs://s1;pqs://s2;pqs://s3 with the CA given
    # the kombu way (ssl=) and the sentinels' TLS in sentinel_kwargs
    certs = make_certificates(tmp_path / "ca")
    g = SentinelGroup(certs=certs)
    try:
        url = ";".join(f"pqs://127.0.0.1:{s.port}" for s in g.sentinels) + "/0"
        ssl = {"ssl_ca_certs": str(certs["ca"]), "ssl_cert_reqs": "required"}
        options = g.options(key_prefix=key_prefix, sentinel_kwargs={"ssl": True, **ssl, "socket_timeout": 2})
        queue = make_queue("tq")
        with Connection(url, ssl=ssl, transport_options=options) as conn:
            producer = Producer(conn)
            queue(conn.default_channel).declare()
            for i in range(30):
                producer.publish(
                    {"i": i}, exchange=queue.exchange, routing_key=queue.routing_key, retry=True, retry_policy=RETRY
                )
            # When, once the replica has them all (over TLS), the master is killed and the
            # sentinels promote the replica
            ii = open_queue(g.replica.client(), "tq", QueueSettings(key_prefix=key_prefix), declare=False).keys.entries
            wait_for(lambda: g.replica.client().hlen(ii) == 30, 30, "the replica has the 30")
            g.kill_master()
            g.wait_promoted()
            # Then publishing goes on to the new master, over TLS, and every message is there once
            for i in range(30, 60):
                producer.publish(
                    {"i": i}, exchange=queue.exchange, routing_key=queue.routing_key, retry=True, retry_policy=RETRY
                )
            got = [body["i"] for body, _ in drain(conn, queue, 60, timeout=30)]
        assert sorted(got) == list(range(60))
    finally:
        g.close()
