"""OpenTelemetry through real workers (tests/e2e/otel_app.py, ``celery_pq.ops.otel.instrument``):
opentelemetry-instrumentation-celery's publish span (here, in the test process) and run span (in
the worker, exported to a file) share one trace on every path a message takes: plain, fair,
delayed, retried, imported from kombu's transport, redelivered after its worker was SIGKILLed;
the run span carries what the broker knows (wait, delivery count, priority, tenant); the
worker's metrics have the attributes docs/operations.md lists, the tenant only when asked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from celery import Celery
from click.testing import CliRunner
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_pq.__main__ import main
from celery_pq.testing import celery_env, start_worker, wait_for

from .test_celery_e2e import ROOT, Harness

pytestmark = pytest.mark.e2e

PRIORITY, TENANT, WAIT_MS = "messaging.celery_pq.priority", "messaging.celery_pq.tenant", "messaging.celery_pq.wait_ms"
COUNT, REDELIVERED, QUEUE = (
    "messaging.celery_pq.delivery_count",
    "messaging.celery_pq.redelivered",
    "messaging.destination.name",
)


class Client:
    """The publishing side, traced as an application's would be: the instrumentation on, its
    spans in memory; ``span(tag)`` is an application span around one publish."""

    def __init__(self):
        self.provider = TracerProvider()
        self.spans = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.provider.get_tracer("test")
        self.instrumentor = CeleryInstrumentor()
        self.instrumentor.instrument(tracer_provider=self.provider)
        self.traces: dict[str, str] = {}  # tag -> trace id

    def send(self, tag, publish):
        """``publish()`` inside an application span; its trace id is kept under ``tag``."""
        with self.tracer.start_as_current_span(f"client {tag}") as span:
            result = publish()
        self.traces[tag] = format(span.get_span_context().trace_id, "032x")
        return result

    def producer_traces(self) -> set[str]:
        return {
            format(s.context.trace_id, "032x") for s in self.spans.get_finished_spans() if s.kind.name == "PRODUCER"
        }


@pytest.fixture
def client():
    c = Client()
    yield c
    c.instrumentor.uninstrument()


class OtelHarness(Harness):
    def __init__(self, server, prefix, tmp_path, options, *, tenant=False, counters=False):
        super().__init__(server, prefix, tmp_path, options, acks_late=True)
        self.spans_path, self.metrics_path = tmp_path / "spans.jsonl", tmp_path / "metrics.json"
        self.env.update(
            PQ_TEST_SPANS=str(self.spans_path),
            PQ_TEST_METRICS=str(self.metrics_path),
            PQ_TEST_OTEL_TENANT="1" if tenant else "0",
            PQ_TEST_OTEL_COUNTERS="1" if counters else "0",
        )

    def worker(self, name, pool="solo"):
        proc = start_worker(
            "tests.e2e.otel_app", cwd=ROOT, env=self.env, name=name, pool=pool, log=self.tmp / f"{name}.log"
        )
        self.workers.append(proc)
        return proc.wait_ready(30)

    def run_spans(self, task_id: str, n: int = 1) -> list[dict]:
        """The worker's run spans of ``task_id``, once there are ``n``."""

        def found():
            if not self.spans_path.exists():
                return None
            lines = self.spans_path.read_text().splitlines()
            spans = [json.loads(line) for line in lines]
            mine = [
                s for s in spans if s["kind"] == "CONSUMER" and s["attributes"].get("messaging.message.id") == task_id
            ]
            return mine if len(mine) >= n else None

        return wait_for(found, 30, f"{n} run span(s) of {task_id}")

    def metrics(self) -> dict[str, list[dict]]:
        """The worker's metrics: name -> data points (``attributes`` and the values)."""
        self.metrics_path.unlink(missing_ok=True)
        self.send("otel.metrics")
        wait_for(self.metrics_path.exists, 30, "the metrics dump")
        data = json.loads(self.metrics_path.read_text())
        out: dict[str, list[dict]] = {}
        for rm in data.get("resource_metrics", []):
            for sm in rm["scope_metrics"]:
                for m in sm["metrics"]:
                    out.setdefault(m["name"], []).extend(m["data"]["data_points"])
        return out


@pytest.fixture
def otel_harness(redis_server, key_prefix, tmp_path):
    made = []

    def make(options=None, **kw):
        h = OtelHarness(redis_server, key_prefix, tmp_path, options or {}, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def kombu_import(h: OtelHarness, client: Client, tag: str) -> str:
    """A task published with kombu's Redis transport (the same Redis, keys of its own), moved into
    celery-pq by ``pq import-kombu``; its id."""
    keyprefix = f"{h.prefix}-kombu:"
    old = Celery("kombu-side", broker=h.url.replace("pq://", "redis://"))
    old.conf.broker_transport_options = {"global_keyprefix": keyprefix}
    try:
        task_id = client.send(tag, lambda: old.send_task("otel.work", args=(tag,), queue="q").id)
    finally:
        old.close()
    args = ["--broker", h.url, "--transport-options", json.dumps(h.options), "import-kombu", "q"]
    args += ["--from", h.url.replace("pq://", "redis://"), "--global-keyprefix", keyprefix, "--unacked", "none"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return task_id


def test_one_trace_from_publish_to_run_on_every_path(otel_harness, client):
    # prefork: what the transport put in delivery_info crosses to the pool's child
    h = otel_harness({"sweep_interval": 0.2})
    plain = client.send("plain", lambda: h.send("otel.work", "plain", priority=7).id)
    imported = kombu_import(h, client, "imported")
    published = time.time()
    time.sleep(1.0)  # both wait at least this long
    h.worker("w1", pool="prefork")
    delayed = client.send("delayed", lambda: h.send("otel.work", "delayed", countdown=3).id)
    delayed_at = time.time()
    retried = client.send("retried", lambda: h.send("otel.retry", "retried").id)

    runs = {"plain": h.run_spans(plain), "imported": h.run_spans(imported), "delayed": h.run_spans(delayed)}
    runs["retried"] = h.run_spans(retried, 2)
    assert len(runs["retried"]) == 2  # the first run and the retry's
    for tag, spans in runs.items():
        assert client.traces[tag] in client.producer_traces(), tag
        assert {s["trace_id"] for s in spans} == {client.traces[tag]}, tag
    # (the retry's publish happened in the worker, inside the first run span: its run is that span's grandchild)

    # the broker's figures on the run span
    (p,) = runs["plain"]
    assert p["attributes"][QUEUE] == "q" and p["attributes"][PRIORITY] == 7
    assert p["attributes"][COUNT] == 1 and p["attributes"][REDELIVERED] is False
    assert 1000 <= p["attributes"][WAIT_MS] <= (time.time() - published) * 1000 + 1000
    assert TENANT not in p["attributes"]  # a plain queue has no tenants
    # a countdown's wait counts from its due time, not from its publish (3 s before)
    (d,) = runs["delayed"]
    due_after_publish = (
        d["attributes"]["messaging.celery_pq.due_ms"] - d["attributes"]["messaging.celery_pq.enqueued_ms"]
    )
    assert 2500 <= due_after_publish <= 3500, due_after_publish
    assert 0 <= d["attributes"][WAIT_MS] < 1500, d["attributes"][WAIT_MS]
    assert time.time() - delayed_at >= 3

    metrics = h.metrics()
    waits = {(pt["attributes"][QUEUE], pt["attributes"].get(PRIORITY)): pt for pt in metrics["celery_pq.queue.wait"]}
    assert waits[("q", 7)]["count"] == 1 and waits[("q", 7)]["sum"] >= 1.0  # seconds
    assert all(TENANT not in pt["attributes"] for pt in metrics["celery_pq.queue.wait"])
    deliveries = {pt["attributes"][REDELIVERED]: pt["value"] for pt in metrics["celery_pq.deliveries"]}
    assert deliveries == {False: 6}  # plain, imported, delayed, the retried twice, the metrics dump itself
    assert "celery_pq.lease_expiries" not in metrics  # queue_counters off


@pytest.mark.parametrize("asked", [False, True], ids=["tenant-not-asked", "tenant-asked"])
def test_fair_queue_tenant_on_the_span_and_in_metrics_only_when_asked(otel_harness, client, asked):
    h = otel_harness({"fair_key": "tenant"}, tenant=asked)
    fair = client.send("fair", lambda: h.send("otel.work", "fair", headers={"tenant": "acme"}).id)
    h.worker("w1")
    (run,) = h.run_spans(fair)
    assert run["trace_id"] == client.traces["fair"]
    assert run["attributes"][TENANT] == "acme"  # a span has no cardinality to bound
    waits = h.metrics()["celery_pq.queue.wait"]
    tenants = {pt["attributes"].get(TENANT) for pt in waits}
    assert tenants == ({"acme", None} if asked else {None})  # (the metrics dump has the default tenant)


def test_redelivery_after_sigkill_stays_in_the_trace(otel_harness, client):
    h = otel_harness({"lease_seconds": 2, "sweep_interval": 0.3}, counters=True)
    hung = client.send("hung", lambda: h.send("otel.hang", "hung").id)
    a = h.worker("wa")
    wait_for(lambda: h.records("work"), 20, "the first delivery")
    h.kill(a)  # SIGKILL: its run span never ends; the lease expires
    h.worker("wb")
    (run,) = h.run_spans(hung)
    assert run["trace_id"] == client.traces["hung"]
    assert run["attributes"][COUNT] == 2 and run["attributes"][REDELIVERED] is True
    assert run["attributes"][WAIT_MS] >= 2000  # a redelivery's wait counts from the publish
    metrics = h.metrics()
    assert {pt["attributes"][REDELIVERED]: pt["value"] for pt in metrics["celery_pq.deliveries"]} == {True: 1, False: 1}
    (expiries,) = metrics["celery_pq.lease_expiries"]
    assert expiries["attributes"] == {QUEUE: "q"} and expiries["value"] == 1
    (dead,) = metrics["celery_pq.dead_letters"]
    assert dead["value"] == 0


@pytest.mark.timeout(120)
def test_console_example_prints_the_run_spans_in_the_publish_trace_and_the_metrics(redis_server):
    env = celery_env(ROOT, PQ_EXAMPLE_BROKER=f"pq://127.0.0.1:{redis_server.port}/0")
    run = subprocess.run(
        [sys.executable, "-m", "examples.otel_console", "--with-worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    trace_id = re.search(r"published 3 tasks in trace ([0-9a-f]{32})", run.stdout).group(1)
    runs = [s for s in re.findall(r"^\{\n.*?^\}$", run.stdout, re.S | re.M) if '"name": "run/otel_demo.work"' in s]
    assert len(runs) == 3 and all(f'"trace_id": "0x{trace_id}"' in s and WAIT_MS in s for s in runs), run.stdout
    for name in ("celery_pq.queue.wait", "celery_pq.deliveries", "celery_pq.lease_expiries", "celery_pq.dead_letters"):
        assert f'"name": "{name}"' in run.stdout, name
