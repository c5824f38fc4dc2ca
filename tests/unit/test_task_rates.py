"""The task_rate option: its forms, its checks, which queues it makes fair and the tenant a
published message gets."""

import pytest

from celery_pq.storage.errors import ConfigError
from celery_pq.transport.options import Options
from celery_pq.transport.task_rates import on_queue
from celery_pq.transport.tenants import tenant_of


def options(**given):
    return Options.from_transport_options(given)


def test_every_queue_form_limits_the_task_on_each_queue_but_celery_s_own_and_dead_letters():
    o = options(task_rate={"proj.send_email": 20})
    assert o.queue_settings("q").fair and o.queue_settings("q").rate == {"task:proj.send_email": 20.0}
    for name in ("q.dead", "celery@host.celery.pidbox", "celeryev.1234", "x.reply.celery.pidbox"):
        assert not o.queue_settings(name).fair, name


def test_a_queue_s_own_table_limits_there_only_and_wins_over_the_every_queue_entry():
    o = options(task_rate={"emails": {"proj.send_email": 5}, "proj.resize": 2})
    assert o.queue_settings("emails").rate == {"task:proj.send_email": 5.0, "task:proj.resize": 2.0}
    assert o.queue_settings("other").rate == {"task:proj.resize": 2.0}
    o = options(task_rate={"emails": {"proj.send_email": 5}})
    assert o.queue_settings("emails").fair and not o.queue_settings("other").fair
    o = options(task_rate={"proj.send_email": 20, "emails": {"proj.send_email": 5}})
    assert o.queue_settings("emails").rate == {"task:proj.send_email": 5.0}


def test_no_task_rate_changes_nothing():
    assert options().queue_settings("q") == options(task_rate=None).queue_settings("q")
    assert not options(task_rate={}).queue_settings("q").fair


def test_with_fair_key_the_tenant_tables_and_the_task_limits_are_written_together():
    o = options(fair_key="tenant", tenant_rate={"acme": 3, "*": 100}, task_rate={"proj.send_email": 20})
    s = o.queue_settings("q")
    assert s.rate == {"acme": 3, "task:proj.send_email": 20.0} and s.tenant_rate == 100


def test_each_shard_of_a_sharded_queue_holds_the_whole_rate():
    """A limited task's messages all go to its tenant's shard: that shard's bucket is the task's
    only one, so it holds the task's whole rate (tests/shards/test_shard_rates.py)."""
    o = options(task_rate={"proj.send_email": 20, "proj.rare": 0.05}, shards=100)
    assert o.queue_settings("q").rate == {"task:proj.send_email": 20.0, "task:proj.rare": 0.05}
    assert on_queue(o.task_rate, "q") == {"task:proj.send_email": 20.0, "task:proj.rare": 0.05}


@pytest.mark.parametrize(
    "value, named",
    [
        (20, "must be a dict"),
        ({"t": 0}, "task_rate['t'] must be a number"),
        ({"t": -1}, "task_rate['t']"),
        ({"t": True}, "task_rate['t']"),
        ({"t": "20/s"}, "task_rate['t']"),
        ({"t": float("inf")}, "task_rate['t']"),
        ({"q": {"t": None}}, "task_rate['q']['t']"),
        ({"q": {1: 2}}, "task names are non-empty strings"),
        ({"": 2}, "non-empty strings"),
        ({"q.dead": {"t": 1}}, "dead-letter"),
        ({"celery@h.celery.pidbox": {"t": 1}}, "Celery's own"),
    ],
)
def test_a_bad_task_rate_is_refused_naming_the_entry(value, named):
    with pytest.raises(ConfigError, match="task_rate") as err:
        options(task_rate=value)
    assert named in str(err.value)


def test_the_tenant_of_a_published_message():
    o = options(task_rate={"emails": {"a": 1}, "b": 2})

    def tenant(queue, headers):
        return tenant_of({"headers": headers}, o, None, on_queue(o.task_rate, queue))

    assert tenant("emails", {"task": "a"}) == "task:a"
    assert tenant("emails", {"task": "b"}) == "task:b"
    assert tenant("other", {"task": "a"}) is None
    assert tenant("other", {"task": "b"}) == "task:b"
    assert tenant("other", {"task": "emails"}) is None  # a queue's name, not a task
    assert tenant("other", {}) is None
    assert tenant("celeryev.x", {"task": "b"}) is None
