"""A queue's settings (``QueueSettings``): checked once, with one error type; what the options
produce; a recorded mode adopted; both kinds of queue answer the same protocol."""

import pytest
import redis

from celery_pq import ConfigError, PriorityQueue
from celery_pq.queue import QueueSettings
from celery_pq.queue.sharded import ShardedQueue
from celery_pq.transport.options import Options


@pytest.mark.parametrize(
    "bad",
    [
        {"technique": "X"},
        {"fair_scope": "nope"},
        {"lease_seconds": 0},
        {"tenant_concurrency": 2},
        {"max_length": 0},
        {"shards": 0},
        {"peek": 65},
    ],
)
def test_bad_settings_are_one_error_a_value_error_too(bad):
    name = next(iter(bad))
    with pytest.raises(ConfigError, match=name if name != "tenant_concurrency" else "need fairness"):
        QueueSettings(**bad)
    with pytest.raises(ValueError):  # a queue made with keyword settings checks them the same way
        PriorityQueue(redis.Redis(), "q", **bad)


def test_a_recorded_plain_mode_drops_the_tenant_caps_a_fair_one_keeps_them():
    fair = QueueSettings(fair=True, tenant_concurrency=2, max_length_per_tenant=5)
    plain = fair.with_mode({"fair": False, "fair_scope": None, "priority_order": "lower_first", "technique": "S"})
    assert (
        plain.fair,
        plain.tenant_concurrency,
        plain.max_length_per_tenant,
        plain.priority_order,
        plain.technique,
    ) == (False, None, None, "lower_first", "S")
    kept = fair.with_mode(
        {"fair": True, "fair_scope": "tenant_first", "priority_order": "higher_first", "technique": "T"}
    )
    assert (kept.tenant_concurrency, kept.fair_scope) == (2, "tenant_first")


def test_the_options_produce_each_queues_settings():
    opts = Options(fair_key="tenant", fair_weights={"big": 2}, shards=4, max_length=10)
    s = opts.queue_settings("orders")
    assert (s.fair, s.shards, s.max_length, s.weights) == (True, 4, 3, {"big": 2})  # 10 over 4 shards
    assert opts.queue_settings("orders.dead").fair is False
    assert opts.queue_settings("celeryev.x").shards == 1


def test_a_plain_queue_is_its_own_single_shard():
    q = PriorityQueue(redis.Redis(), "q", QueueSettings(fair=True))
    assert q.shards == [q] and q.settings.fair and q.mode["technique"] == "T"
    sharded = ShardedQueue([q, PriorityQueue(redis.Redis(), "q#1", q.settings)], "q")
    assert sharded.shards[0] is q and sharded.settings.fair


@pytest.mark.parametrize("kw", [{"technique": "Q"}, {"priority_order": "up"}, {"lease_seconds": 0}, {"max_length": 0}])
def test_queue_settings_are_checked(kw):
    with pytest.raises(ValueError):
        PriorityQueue(None, "q", **kw)
