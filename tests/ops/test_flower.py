"""Flower with celery-pq (celery_pq.ops.flower): real Flower processes started as a user starts
them (``celery -A app flower --conf=flowerconfig.py``, the file holding the one documented line)
answer ``/api/queues/length`` and render the broker page with the queue's true counts, for a
``pq://`` URL and for ``redis://`` with ``broker_transport``; one pointed at a Redis that is not
there shows Flower's "no queue data" and logs why.

The backlog is known: a real worker (thread pool, one task at a time, late acks) holds one
long task (leased, its one consumer), and behind it wait tasks of three priorities and three
tenants of a fair queue, three delayed ones (countdown) and two dead letters.

The browser test drives Debian's chromium with selenium as tests/e2e/test_dashboard_browser.py
does (it fails with scripts/ensure-chromium.sh's message when they are missing). It saves the
page as docs/img/flower-broker.png when PQ_UPDATE_SCREENSHOTS=1, else in pytest's tmp_path.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
from celery import Celery

import celery_pq  # noqa: F401  registers pq://
from celery_pq.ops.flower import PQFlowerBroker, consumers_of, flower_row, is_celery_pq
from celery_pq.queue import open_queue
from celery_pq.testing import free_port, wait_for
from celery_pq.transport.options import Options

try:
    from e2e.test_celery_e2e import Harness
    from e2e.test_dashboard_browser import browser
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.e2e.test_celery_e2e import Harness
    from tests.e2e.test_dashboard_browser import browser  # noqa: F401  (the fixture)


ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "img" / "flower-broker.png"
TENANTS = ("acme", "globex", "initech")
PRIORITIES = (0, 100, 200)
#: (tenant, priority) -> tasks waiting, a different number for each priority and tenant.
BACKLOG = {(t, p): 1 + (i + j) % 3 for i, t in enumerate(TENANTS) for j, p in enumerate(PRIORITIES)}
DELAYED, DEAD = 3, 2
ONE_LINE = "import celery_pq.ops.flower\n"


class Flower:
    """``celery -A tests.ops.flower_app flower`` on a free port with ``--conf`` (the one line)."""

    def __init__(self, h, tmp, label: str, **env):
        self.port = free_port()
        self.log = tmp / f"flower-{label}.log"
        conf = tmp / "flowerconfig.py"
        conf.write_text(ONE_LINE)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.ops.flower_app", "flower", *self.args(conf)],
            cwd=ROOT,
            env={**h.env, "FLOWER_UNAUTHENTICATED_API": "true", **env},
            stdout=open(self.log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def args(self, conf: Path) -> list[str]:
        return [f"--port={self.port}", "--address=127.0.0.1", f"--conf={conf}"]

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url + path, timeout=15) as r:
            return r.status, r.read().decode()

    def wait(self) -> Flower:
        def up():
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return self.get("/healthcheck")[0] == 200
            except OSError:
                return False

        wait_for(up, 30, "Flower to listen")
        return self

    def queues(self) -> dict:
        status, body = self.get("/api/queues/length")
        assert status == 200, body
        return {row["name"]: row for row in json.loads(body)["active_queues"]}

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module")
def live(redis_server, tmp_path_factory):
    """The backlog (module docstring), its worker, and three Flowers: ``pq``, ``redis`` (a
    ``redis://`` URL with ``broker_transport``) and ``down`` (a port where no Redis listens)."""
    tmp = tmp_path_factory.mktemp("flower")
    prefix = "pqt" + uuid.uuid4().hex[:10]
    h = Harness(redis_server, prefix, tmp, {"fair_key": "tenant"}, acks_late=True)
    flowers: dict[str, Flower] = {}
    try:
        h.send("e2e.sleep", 120, "held", priority=255, headers={"tenant": "acme"})
        h.worker("w1", "-P", "threads")
        wait_for(lambda: [r[0] for r in h.records("start")] == ["held"], 30, "the worker to start the long task")
        for (tenant, priority), n in BACKLOG.items():
            for k in range(n):
                h.send("e2e.sleep", 0, f"{tenant}-{priority}-{k}", priority=priority, headers={"tenant": tenant})
        for k in range(DELAYED):
            h.send("e2e.sleep", 0, f"later-{k}", priority=100, countdown=3600, headers={"tenant": "globex"})
        q = queue(h)
        for reason in ("rejected", "poisoned"):
            [lease] = q.pop(1, consumer="flower-test:1:dead")
            q.dead_letter(lease, reason)
        redis_url = f"redis://127.0.0.1:{redis_server.port}/0"
        transport = "celery_pq.transport:Transport"
        flowers["pq"] = Flower(h, tmp, "pq")
        flowers["redis"] = Flower(h, tmp, "redis", PQ_TEST_BROKER=redis_url, PQ_TEST_TRANSPORT=transport)
        flowers["down"] = Flower(h, tmp, "down", PQ_TEST_BROKER=f"pq://127.0.0.1:{free_port()}/0")
        for f in flowers.values():
            f.wait()
        for form in ("pq", "redis"):  # Flower knows the worker after its first inspect (a second or so)
            wait_for(lambda: flowers[form].queues()["q"]["consumers"] == 1, 20, f"Flower ({form}) to see the worker")
        yield h, flowers
    finally:
        for f in flowers.values():
            f.close()
        for w in h.workers:
            h.kill(w)  # (the long task is not waited for)
        h.close()
        h.redis.delete(*h.redis.keys(f"{prefix}*") or ["-"])


def queue(h):
    """The queue, opened with the workers' settings."""
    return open_queue(h.redis, "q", Options.from_transport_options(h.options).queue_settings("q"), declare=False)


def own_stats(h) -> dict:
    return queue(h).stats()


def counts(row: dict) -> dict:
    """A row's figures that stay put while the worker holds its task (ages move)."""
    keys = ("messages", "messages_ready", "messages_unacknowledged", "waiting", "delayed", "leased", "dead", "paused")
    out = {k: row[k] for k in keys}
    out["per_priority"] = {str(p): n for p, n in row["per_priority"].items()}
    out["per_tenant"] = {t: (c["waiting"], c["leased"]) for t, c in row["per_tenant"].items()}
    return out


def test_flower_api_returns_the_true_counts_for_both_url_forms(live):
    h, flowers = live
    waiting = sum(BACKLOG.values()) - DEAD
    for form in ("pq", "redis"):
        [row] = flowers[form].queues().values()
        # the counts published: the held task leased, the rest ready or delayed, the dead apart
        assert row["name"] == "q", form
        assert row["messages_unacknowledged"] == 1 and row["consumers"] == 1, (form, row)
        assert row["messages_ready"] == waiting and row["delayed"] == DELAYED and row["dead"] == DEAD, (form, row)
        assert row["messages"] == waiting + DELAYED + 1, (form, row)
        assert set(row["per_priority"]) == {"0", "100", "200"}  # (counted from the index: stale pointers too)
        assert set(row["per_tenant"]) == set(TENANTS) and row["per_tenant"]["acme"]["leased"] == 1
        assert sum(c["waiting"] for c in row["per_tenant"].values()) == waiting
        # and they are the queue's own stats
        assert counts(row) == counts(flower_row(own_stats(h))), form
    log = flowers["redis"].log.read_text()
    assert "Traceback" not in log and "broker is not supported" not in log


def test_flower_broker_page_shows_the_queue_in_a_browser(live, browser, tmp_path):
    h, flowers = live
    browser.get(flowers["pq"].url + "/broker")
    wait_for(lambda: browser.find_elements("css selector", "#queue-table tr#q"), 15, "the queue's row")
    cells = [td.text for td in browser.find_elements("css selector", "#queue-table tr#q td")]
    s = own_stats(h)
    ready, leased = s["waiting"], s["leased"]
    assert cells[:5] == ["q", str(ready + s["delayed"] + leased), str(leased), str(ready), "1"], cells
    assert ready == sum(BACKLOG.values()) - DEAD and leased == 1
    shot = SCREENSHOT if os.environ.get("PQ_UPDATE_SCREENSHOTS") == "1" else tmp_path / "flower-broker.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_flower_with_redis_down_shows_no_queue_data_and_logs_why(live):
    h, flowers = live
    down = flowers["down"]
    status, page = down.get("/broker")
    assert status == 200 and "No queue data is available." in page
    assert 'tr id="q"' not in page and "Traceback" not in page
    assert down.get("/api/queues/length") == (200, '{"active_queues": []}')
    log = down.log.read_text()
    assert "celery-pq: Flower cannot read the queues' stats: cannot reach Redis at 127.0.0.1:" in log, log
    assert "Traceback" not in log


def test_flower_row_maps_the_stats_to_flowers_columns():
    stats = {
        "queue": "q",
        "waiting": 7,
        "delayed": 3,
        "leased": 2,
        "dead": 4,
        "index_members": 7,
        "per_priority": {200: 5, 0: 2},
        "head_age_seconds": 1.5,
        "per_tenant": {"acme": {"waiting": 7, "leased": 2}},
        "paused": False,
    }
    row = flower_row(stats, consumers=3)
    assert {k: row[k] for k in ("name", "messages", "messages_ready", "messages_unacknowledged")} == {
        "name": "q",
        "messages": 12,  # ready + delayed + leased: the dead letters are kept apart
        "messages_ready": 7,
        "messages_unacknowledged": 2,
    }
    assert row["consumers"] == 3 and row["idle_since"] is None
    assert row["delayed"] == 3 and row["dead"] == 4 and row["per_priority"] == {200: 5, 0: 2}
    assert row["per_tenant"] == {"acme": {"waiting": 7, "leased": 2}} and row["head_age_seconds"] == 1.5
    assert "index_members" not in row and "queue" not in row
    assert flower_row(stats)["consumers"] is None
    workers = {
        "a@h": {"active_queues": [{"name": "q"}, {"name": "r"}]},
        "b@h": {"active_queues": [{"name": "q"}]},
        "c@h": {},
    }
    assert consumers_of(workers) == {"q": 2, "r": 1}


def test_only_celery_pq_apps_are_read_by_it_and_sharded_queues_sum_their_shards(redis_server, key_prefix):
    port = redis_server.port
    redis_transport = Celery("t", broker=f"redis://127.0.0.1:{port}/0")
    redis_transport.conf.broker_transport = "celery_pq.transport:Transport"
    assert is_celery_pq(Celery("t", broker=f"pq://127.0.0.1:{port}/0"))
    assert is_celery_pq(Celery("t", broker=f"pqs://127.0.0.1:{port}/0"))
    assert is_celery_pq(redis_transport)
    assert not is_celery_pq(Celery("t", broker=f"redis://127.0.0.1:{port}/0"))  # Flower's own reader
    assert not is_celery_pq(Celery("t", broker="amqp://127.0.0.1//"))

    app = Celery("t", broker=f"pq://127.0.0.1:{port}/0")
    app.conf.broker_transport_options = options = {"key_prefix": key_prefix, "shards": 4}
    try:
        for n in range(20):
            app.send_task("x", queue="s", priority=(0, 100, 255)[n % 3])
        app.send_task("x", queue="s", countdown=3600)
        [row] = asyncio.run(PQFlowerBroker(app).queues(["s"]))
        client = redis_server.client(decode_responses=False)
        s = open_queue(client, "s", Options.from_transport_options(options).queue_settings("s"), declare=False).stats()
        client.close()
        assert len(s["shards"]) == 4 and sum(part["waiting"] for part in s["shards"]) == 20
        assert (row["messages"], row["messages_ready"], row["delayed"]) == (21, 20, 1)
        assert row["per_priority"] == s["per_priority"] == {255: 6, 100: 7, 0: 7}
        assert row["shards"] == s["shards"]
    finally:
        app.close()


def test_importing_it_without_flower_says_to_install_flower():
    code = "import sys; sys.modules['flower'] = None\nimport celery_pq.ops.flower"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: celery_pq.ops.flower adapts Flower's broker page to celery-pq and needs Flower: "
        "pip install 'flower>=2.0' (it is imported by Flower's configuration, flowerconfig.py)"
    )


def test_the_one_line_is_the_documented_one():
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert f"\n{ONE_LINE}" in doc
