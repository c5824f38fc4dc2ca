"""The Prometheus exporter, scraped over real HTTP and read with prometheus_client's parser."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from celery_pq.ops.metrics import PQCollector, serve
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.testing import celery_env

try:
    from support.slow_clients import SLOW_REQUEST, dropped
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.slow_clients import SLOW_REQUEST, dropped

ROOT = Path(__file__).resolve().parents[2]


def scrape(url) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def fill(w):
    """A fair queue with waiting, delayed, leased, dead and refused work."""
    for i in range(3):
        w.send("ops.work", i, priority=250, headers={"tenant": "acme"})
    w.send("ops.work", 9, priority=20, headers={"tenant": "zeta"})
    w.send("ops.work", 10, priority=20, countdown=600, headers={"tenant": "zeta"})
    q = w.queue()
    leases = q.pop(2, consumer="c:1:x")
    q.dead_letter(leases[0], "boom")


def test_exporter_command_over_http(fair_world):
    w = fair_world
    fill(w)
    env = celery_env(ROOT)
    proc = subprocess.Popen(
        [
            *w.command(),
            "metrics",
            "--port",
            "0",  # on loopback by default
            "--bands",
            "0-99,100-199,200-255",
            "--queue",
            "q",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first.startswith("celery-pq metrics on http://127.0.0.1:"), (first, proc.stderr.read())
        url = first.split()[-1]
        s = scrape(url)
    finally:
        proc.terminate()
        proc.wait(10)
    # Then the gauges say what the queue holds
    assert value(s, "celery_pq_up") == 1
    assert value(s, "celery_pq_waiting_messages", queue="q") == 2  # 4 due, 2 delivered
    assert value(s, "celery_pq_delayed_messages", queue="q") == 1
    assert value(s, "celery_pq_leased_messages", queue="q") == 1
    assert value(s, "celery_pq_dead_messages", queue="q") == 1
    assert value(s, "celery_pq_paused", queue="q") == 0
    assert value(s, "celery_pq_waiting_messages_by_priority", queue="q", band="200-255") == 1
    assert value(s, "celery_pq_waiting_messages_by_priority", queue="q", band="0-99") == 1
    assert value(s, "celery_pq_waiting_messages_by_priority", queue="q", band="100-199") == 0
    assert (
        value(s, "celery_pq_waiting_messages_by_tenant", queue="q", tenant="acme")
        + value(s, "celery_pq_waiting_messages_by_tenant", queue="q", tenant="zeta")
        == 2
    )
    assert value(s, "celery_pq_oldest_waiting_age_seconds", queue="q") >= 0
    # and the counters the scripts keep
    assert value(s, "celery_pq_enqueued_total", queue="q") == 5
    assert value(s, "celery_pq_deliveries_total", queue="q") == 2
    assert value(s, "celery_pq_dead_letters_total", queue="q") == 1
    assert value(s, "celery_pq_redeliveries_total", queue="q") == 0
    # celery_pq_waiting_messages carries the queue label only
    assert {k for (n, labels) in s if n == "celery_pq_waiting_messages" for k, _ in labels} == {"queue"}


def test_collector_mounted_in_an_app_registry(world):
    w = world
    w.send("ops.work", 1, priority=3)
    q = w.queue()
    q.pop(1, consumer="c:1:x", lease_seconds=0.05)
    time.sleep(0.1)
    q.reclaim()  # the lease ran out: an expiry, and the next pop is a redelivery
    q.pop(1, consumer="c:1:x")

    full = open_queue(w.client, "q", QueueSettings(key_prefix=w.prefix, max_length=1))  # refuses a second waiting entry
    full.insert(b"x", 1)
    with pytest.raises(Exception, match="full"):
        full.insert(b"y", 1)
    registry = CollectorRegistry()
    registry.register(PQCollector(w.url, transport_options=w.options, max_tenants=5))
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        s = scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
    assert value(s, "celery_pq_lease_expiries_total", queue="q") == 1
    assert value(s, "celery_pq_redeliveries_total", queue="q") == 1
    assert value(s, "celery_pq_refusals_total", queue="q") == 1
    assert value(s, "celery_pq_waiting_messages", queue="q") == 1


def test_expired_messages_are_counted(world):
    w = world
    w.send("ops.work", 1, expires=0.05)  # Celery's expires: passes before any pop
    w.send("ops.work", 2)
    time.sleep(0.1)
    q = w.queue()
    [lease] = q.pop(5, consumer="c:1:x")  # the live one; the expired one is dead-lettered
    fams = {f.name: f for f in PQCollector(w.url, transport_options=w.options).collect()}
    [sample] = [x for x in fams["celery_pq_expired"].samples if x.labels["queue"] == "q"]
    assert sample.value == 1
    assert [e.dead_reason for e in q.dead.peek(5)] == ["expired"]


def test_tenants_beyond_the_cap_are_other(redis_server, key_prefix):
    from tests.ops.conftest import World

    w = World(redis_server, key_prefix, {"fair_key": "tenant"})
    try:
        for t, n in (("a", 3), ("b", 2), ("c", 1), ("d", 1)):
            for i in range(n):
                w.send("ops.work", i, headers={"tenant": t})
        fams = {f.name: f for f in PQCollector(w.url, transport_options=w.options, max_tenants=2).collect()}
        by = {s.labels["tenant"]: s.value for s in fams["celery_pq_waiting_messages_by_tenant"].samples}
        assert by == {"a": 3, "b": 2, "other": 2}
    finally:
        w.close()


def test_unreachable_redis_scrapes_as_down_without_the_password(caplog):
    c = PQCollector("pq://:hunter2-pw@127.0.0.1:1/0")
    fams = {f.name: f for f in c.collect()}
    assert [s.value for s in fams["celery_pq_up"].samples] == [0]
    assert "127.0.0.1:1" in caplog.text and "hunter2-pw" not in caplog.text


def test_bad_bands_are_a_clear_error(world):
    r = world.run("metrics", "--port", "0", "--bands", "0-99,50-120", ok=False)
    assert r.exit_code == 1 and "overlap" in r.output


def test_the_exporter_listens_on_loopback_unless_told_otherwise():
    url = "pq://127.0.0.1:1/0"  # no scrape here: where it listens is all that is looked at
    for given, bound in ((None, "127.0.0.1"), ("0.0.0.0", "0.0.0.0")):
        kwargs = {} if given is None else {"address": given}
        server, _ = serve(url, port=0, block=False, **kwargs)
        try:
            assert server.server_address[0] == bound
        finally:
            server.shutdown()
            server.server_close()


def test_a_client_that_sends_nothing_or_a_byte_at_a_time_is_dropped(world):
    world.send("ops.work", 1)
    server, thread = serve(world.url, port=0, block=False, transport_options=world.options, request_timeout=0.5)
    try:
        port = server.server_address[1]
        # A client that connects and sends nothing, and one whose request trickles in, are
        # dropped once the request has not come in request_timeout
        assert dropped(port)
        assert dropped(port, SLOW_REQUEST)
        # and a scrape that arrives in time is answered
        assert value(scrape(f"http://127.0.0.1:{port}/metrics"), "celery_pq_waiting_messages", queue="q") == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
