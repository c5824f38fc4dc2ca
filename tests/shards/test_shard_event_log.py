"""The event log of a sharded queue: one stream per shard, and both readers (``pq export-events``
and the ``celery_pq_events`` source's settings) read every shard's."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from celery_pq.queue import open_queue
from celery_pq.spark.events.export import export_events
from celery_pq.spark.events.log import Settings
from celery_pq.storage.errors import ConfigError
from celery_pq.storage.keys import shard_names
from celery_pq.transport.options import Options

ROOT = Path(__file__).resolve().parents[2]


def test_export_events_reads_every_shards_stream(redis_server, redis_client, key_prefix, tmp_path):
    # Given a queue of 4 shards with its event log on, entries in every shard, some delivered
    opts = {"key_prefix": key_prefix, "shards": 4, "event_log": 10_000}
    queue = open_queue(redis_client, "kq", Options(**opts).queue_settings("kq"))
    queue.set_event_log(10_000)
    for i in range(40):
        queue.insert(f"m{i}".encode(), i % 3, publish_id=f"p{i}")
    popped = list(queue.pop(10))
    for lease in popped:
        queue.ack(lease)
    logged = {s.name: redis_client.xlen(s.keys.events) for s in queue.shards}
    assert popped and all(logged.values()) and sum(logged.values()) == 40 + 2 * len(popped)
    # When export-events runs with the queue's options
    out = tmp_path / "events"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery_pq",
            "--broker",
            f"pq://127.0.0.1:{redis_server.port}/0",
            "--transport-options",
            json.dumps(opts),
            "export-events",
            "kq",
            "--out",
            str(out),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # Then every shard's events are exported, each under its shard's name, each once
    assert json.loads(done.stdout)["exported"] == logged
    table = pq.read_table(str(out))
    assert table.num_rows == sum(logged.values())
    assert set(table.column("queue").to_pylist()) == set(logged)
    assert sorted(table.column("event").to_pylist()).count("enqueue") == 40
    # and a second run finds nothing new
    assert set(export_events(redis_client, "kq", out, key_prefix=key_prefix, shards=4).exported.values()) == {0}
    # Without the shard count, only shard 0's stream (the queue's own name) is read
    alone = export_events(redis_client, "kq", tmp_path / "alone", key_prefix=key_prefix)
    assert alone.exported == {"kq": logged["kq"]}


def test_the_event_source_names_every_shards_stream():
    settings = Settings.parse({"broker": "pq://127.0.0.1:6390/0", "queue": "a,b", "shards": "4"})
    assert list(settings.queues) == shard_names("a", 4) + shard_names("b", 4)
    assert len({settings.key(q) for q in settings.queues}) == 8
    assert Settings.parse({"broker": "pq://127.0.0.1:6390/0", "queue": "a"}).queues == ("a",)
    for bad in ("0", "many", "257"):
        with pytest.raises(ConfigError, match="shards"):
            Settings.parse({"broker": "pq://127.0.0.1:6390/0", "queue": "a", "shards": bad})
