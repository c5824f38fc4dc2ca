"""The Spark writer's rows and options, in pure Python (no Spark, no Redis): each row's message is
the one Celery's own as_task_v2 makes, and bad options raise ConfigError naming the option."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from celery import Celery

from celery_pq.spark.events.log import redis_url
from celery_pq.spark.sink.rows import Rejected, TaskRows
from celery_pq.spark.sink.settings import WriterSettings
from celery_pq.storage.codec import decode
from celery_pq.storage.errors import ConfigError

COLUMNS = ["a", "b", "task_id", "priority"]
SAMPLES = [
    (1, 2.5, "t1", 3),
    (None, True, "t2", None),
    ("text", "ünï'\"code", "t3", 0),
    ([1, [2, "x"]], {"k": [1.5]}, "t4", 255),
    (10**30, -0.0, "t5", 1),
    ("x" * 5000, 7, "t6", 9),
    (float("inf"), 1e-300, "t7", 2),
]


def settings(**options):
    given = {"broker": "pq://127.0.0.1:1/0", "task": "proj.t", "args": "a", "kwargs": "b", **options}
    return WriterSettings.parse(given, COLUMNS)


@pytest.mark.parametrize("row", SAMPLES, ids=[s[2] for s in SAMPLES])
def test_a_row_gives_the_headers_body_and_properties_celery_makes(row):
    rows = TaskRows(settings())
    queue, item = rows.build(row, now=0.0)
    message = decode(item.payload)
    ref = Celery("ref", set_as_current=False).amqp.as_task_v2(
        row[2], "proj.t", args=[row[0]], kwargs={"b": row[1]}, origin=rows.origin
    )
    assert message["headers"] == json.loads(json.dumps(ref.headers))
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    assert [args, kwargs, embed] == json.loads(json.dumps(list(ref.body)))
    assert {k: message["properties"][k] for k in ref.properties} == ref.properties
    assert (queue, item.id, item.priority) == ("celery", row[2], row[3] or 0)


def test_a_row_without_task_id_or_key_is_its_write_partition_and_position():
    # Given identical rows, and a second attempt of the same partition (the same write)
    rows = [(1, 2), (1, 2), (3, 4)]
    no_id = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "args": "a"}, ["a", "b"])
    one, two = TaskRows(no_id, partition=5), TaskRows(no_id, partition=5)
    ids = [one.build(r, 0.0)[1].id for r in rows]
    # Then every row has its own id, the same in every attempt of its partition
    assert ids == [two.build(r, 50.0)[1].id for r in rows] and len(set(ids)) == 3
    # And another partition, or another write of the same rows, gives other ids
    other = [TaskRows(no_id, partition=6).build(r, 0.0)[1].id for r in rows[:1]]
    again = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "args": "a"}, ["a", "b"])
    assert again.write_id != no_id.write_id
    rerun_rows = TaskRows(again, partition=5)
    rerun = [rerun_rows.build(r, 0.0)[1].id for r in rows]
    assert not ({*other, *rerun} & set(ids)) and len(set(rerun)) == 3


def test_a_key_gives_the_same_id_in_every_write_and_partition():
    keyed = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "key": "a"}, ["a", "b"])
    again = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "key": "a"}, ["a", "b"])
    assert TaskRows(keyed).build((1, 2), 0.0)[1].id == TaskRows(again, partition=3).build((1, 9), 0.0)[1].id
    other_job = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "key": "a", "job": "j2"}, ["a", "b"])
    assert TaskRows(keyed).build((1, 2), 0.0)[1].id != TaskRows(other_job).build((1, 2), 0.0)[1].id


def test_a_rejected_row_keeps_its_position_so_the_next_rows_ids_do_not_move():
    s = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "args": "a"}, ["a", "priority"])
    with_bad, without = TaskRows(s), TaskRows(s)
    with pytest.raises(Rejected):
        with_bad.build((1, 999), 0.0)
    without.build((1, 1), 0.0)
    assert with_bad.build((2, 1), 0.0)[1].id == without.build((2, 1), 0.0)[1].id


@pytest.mark.parametrize(
    "row, reason",
    [
        ((1, 2, "t", 256), "out of range"),
        ((1, 2, "t", 1.0), "must be an integer"),
        ((1, 2, "t", "7"), "must be an integer"),
        ((1, 2, None, 1), "task_id must be a non-empty string"),
        ((1, 2, "", 1), "task_id must be a non-empty string"),
        ((b"bytes", 2, "t", 1), "cannot be sent as JSON"),
    ],
)
def test_bad_rows_are_rejected_with_a_reason_naming_the_value(row, reason):
    with pytest.raises(Rejected, match=reason):
        TaskRows(settings()).build(row, 0.0)


def test_an_eta_timestamp_is_local_time_and_an_iso_string_without_zone_is_utc():
    s = WriterSettings.parse({"broker": "pq://h:1/0", "task": "t", "args": "a"}, ["a", "eta"])
    naive = datetime(2030, 1, 2, 3, 4, 5)
    _, local = TaskRows(s, eta_is_local=True).build((1, naive), 0.0)
    _, text = TaskRows(s).build((1, "2030-01-02T03:04:05"), 0.0)
    assert local.due_ms == int(naive.astimezone().timestamp() * 1000)
    assert text.due_ms == int(naive.replace(tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    "options, columns, message",
    [
        ({"task": "t"}, ["a"], "option 'broker' is required"),
        ({"broker": "pq://h:1/0"}, ["a"], "option 'task' is required"),
        ({"broker": "pq://h:1/0", "task": "t", "args": "a,,b"}, ["a", "b"], "option 'args' must be column names"),
        ({"broker": "pq://h:1/0", "task": "t", "key": "a"}, ["a", "task_id"], "give one of them"),
        ({"broker": "pq://h:1/0", "task": "t", "transport_options": "[1]"}, ["a"], "must be a JSON object"),
        ({"broker": "pq://h:1/0", "task": "t", "dedupe_seconds": "-1"}, ["a"], "dedupe_seconds"),
        ({"broker": "pq://h:1/0", "task": "t", "Tenant_Concurrency": "2"}, ["a"], "need fair_key"),
    ],
)
def test_option_errors_name_the_option(options, columns, message):
    with pytest.raises(ConfigError, match=message):
        WriterSettings.parse(options, columns)


def test_transport_options_come_as_json_or_one_by_one_and_one_by_one_wins():
    s = WriterSettings.parse(
        {
            "broker": "pq://h:1/0",
            "task": "t",
            "transport_options": json.dumps({"key_prefix": "a", "priority_order": "lower_first"}),
            "key_prefix": "123",
            "dedupe_seconds": "600",
        },
        ["x"],
    )
    assert (s.transport.key_prefix, s.transport.priority_order, s.transport.dedupe_seconds) == (
        "123",
        "lower_first",
        600.0,
    )
    assert (s.conninfo().hostname, s.conninfo().port, s.tls) == ("h", 1, False)


@pytest.mark.parametrize(
    "broker",
    ["amqp://guest:s3cr3t-pw@h:5672//", "http://:s3cr3t-pw@h:1/0", "amqp://u:s3cr3t-pw@h;amqp://u:s3cr3t-pw@h2"],
)
def test_a_broker_url_of_another_scheme_is_refused_without_its_password(broker):
    with pytest.raises(ConfigError, match="option 'broker' must be a pq://") as info:
        WriterSettings.parse({"broker": broker, "task": "t"}, ["a"])
    assert "s3cr3t" not in str(info.value) and "***@h" in str(info.value)
    with pytest.raises(ConfigError, match="option 'broker' must be a pq://") as info:  # the event-log reader
        redis_url(broker)
    assert "s3cr3t" not in str(info.value) and "***@h" in str(info.value)


def test_cluster_and_master_name_are_checked_on_the_driver():
    # (tests/spark/test_writer.py writes through a Redis Cluster and through Sentinel)
    with pytest.raises(ConfigError, match="'cluster' and 'master_name'"):
        WriterSettings.parse({"broker": "pq://h:1/0", "task": "t", "master_name": "m", "cluster": "true"}, ["a"])
    with pytest.raises(ConfigError, match="only database 0"):
        WriterSettings.parse({"broker": "pq://h:1/3", "task": "t", "cluster": "true"}, ["a"])
