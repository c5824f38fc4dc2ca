"""The Spark writer's rows and options, in pure Python (no Spark, no Redis): each row's message is
the one Celery's own as_task_v2 makes, and bad options raise ConfigError naming the option."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone

import pytest
from celery import Celery

from celery_pq.codec import decode
from celery_pq.errors import ConfigError
from celery_pq.spark.rows import Rejected, TaskRows
from celery_pq.spark.settings import WriterSettings

COLUMNS = ["a", "b", "task_id", "priority"]
SAMPLES = [
    (1, 2.5, "t1", 3), (None, True, "t2", None), ("text", "ünï'\"code", "t3", 0), ([1, [2, "x"]], {"k": [1.5]}, "t4", 255),
    (10**30, -0.0, "t5", 1), ("x" * 5000, 7, "t6", 9), (float("inf"), 1e-300, "t7", 2),
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
        row[2], "proj.t", args=[row[0]], kwargs={"b": row[1]}, origin=rows.origin)
    assert message["headers"] == json.loads(json.dumps(ref.headers))
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    assert [args, kwargs, embed] == json.loads(json.dumps(list(ref.body)))
    assert {k: message["properties"][k] for k in ref.properties} == ref.properties
    assert (queue, item.id, item.priority) == ("celery", row[2], row[3] or 0)


def test_derived_ids_are_the_same_in_every_attempt_and_tell_identical_rows_apart():
    rows = [(1, 2, None, 1), (1, 2, None, 1), (3, 4, None, 1)]
    no_id = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "args": "a"}, ["a", "b"])
    one, two = TaskRows(no_id), TaskRows(no_id)
    ids = [one.build(r[:2], 0.0)[1].id for r in rows]
    assert ids == [two.build(r[:2], 50.0)[1].id for r in rows] and len(set(ids)) == 3
    keyed = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "key": "a"}, ["a", "b"])
    assert TaskRows(keyed).build((1, 2), 0.0)[1].id == TaskRows(keyed).build((1, 9), 0.0)[1].id
    other_job = WriterSettings.parse({"broker": "pq://h:1/0", "task": "proj.t", "key": "a", "job": "j2"}, ["a", "b"])
    assert TaskRows(keyed).build((1, 2), 0.0)[1].id != TaskRows(other_job).build((1, 2), 0.0)[1].id


@pytest.mark.parametrize("row, reason", [
    ((1, 2, "t", 256), "out of range"),
    ((1, 2, "t", 1.0), "must be an integer"),
    ((1, 2, "t", "7"), "must be an integer"),
    ((1, 2, None, 1), "task_id must be a non-empty string"),
    ((1, 2, "", 1), "task_id must be a non-empty string"),
    ((b"bytes", 2, "t", 1), "cannot be sent as JSON"),
])
def test_bad_rows_are_rejected_with_a_reason_naming_the_value(row, reason):
    with pytest.raises(Rejected, match=reason):
        TaskRows(settings()).build(row, 0.0)


def test_an_eta_timestamp_is_local_time_and_an_iso_string_without_zone_is_utc():
    s = WriterSettings.parse({"broker": "pq://h:1/0", "task": "t", "args": "a"}, ["a", "eta"])
    naive = datetime(2030, 1, 2, 3, 4, 5)
    _, local = TaskRows(s, eta_is_local=True).build((1, naive), 0.0)
    _, text = TaskRows(s).build((1, "2030-01-02T03:04:05"), 0.0)
    assert local.due_ms == int(naive.astimezone().timestamp() * 1000)
    assert text.due_ms == int(naive.replace(tzinfo=timezone.utc).timestamp() * 1000)


@pytest.mark.parametrize("options, columns, message", [
    ({"task": "t"}, ["a"], "option 'broker' is required"),
    ({"broker": "pq://h:1/0"}, ["a"], "option 'task' is required"),
    ({"broker": "pq://h:1/0", "task": "t", "args": "a,,b"}, ["a", "b"], "option 'args' must be column names"),
    ({"broker": "pq://h:1/0", "task": "t", "key": "a"}, ["a", "task_id"], "give one of them"),
    ({"broker": "pq://h:1/0", "task": "t", "transport_options": "[1]"}, ["a"], "must be a JSON object"),
    ({"broker": "pq://h:1/0", "task": "t", "dedupe_seconds": "-1"}, ["a"], "dedupe_seconds"),
    ({"broker": "pq://h:1/0", "task": "t", "Tenant_Concurrency": "2"}, ["a"], "need fair_key"),
])
def test_option_errors_name_the_option(options, columns, message):
    with pytest.raises(ConfigError, match=message):
        WriterSettings.parse(options, columns)


def test_transport_options_come_as_json_or_one_by_one_and_one_by_one_wins():
    s = WriterSettings.parse({"broker": "pq://h:1/0", "task": "t", "transport_options": json.dumps(
        {"key_prefix": "a", "priority_order": "lower_first"}), "key_prefix": "123", "dedupe_seconds": "600"}, ["x"])
    assert (s.transport.key_prefix, s.transport.priority_order, s.transport.dedupe_seconds) == \
        ("123", "lower_first", 600.0)
    assert s.redis_url() == "redis://h:1/0"
