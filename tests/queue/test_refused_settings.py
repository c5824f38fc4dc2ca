"""Bad settings are refused at once, before anything is written: a queue's settings, and fair
weights outside the range the tags hold."""

from __future__ import annotations

import pytest

from celery_pq import PriorityQueue


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"name": ""}, "name"),
        ({"key_prefix": ""}, "key_prefix"),
        ({"dedupe_seconds": -1}, "dedupe_seconds"),
        ({"max_dead_length": 0}, "max_dead_length"),
        ({"lease_seconds": float("nan")}, "lease_seconds"),
        ({"lease_seconds": "5"}, "lease_seconds"),
    ],
)
def test_bad_queue_settings_are_refused(redis_client, kwargs, word):
    args = {"name": "m12", **kwargs}
    with pytest.raises(ValueError, match=word):
        PriorityQueue(redis_client, args.pop("name"), **args)


@pytest.mark.parametrize("weight", [0, -1, 1e-9, 2e6, float("inf"), float("nan"), True, "2"])
def test_fair_weights_outside_the_range_the_tags_hold_are_refused(redis_client, make_pq, weight):
    q = make_pq("m12", fair=True)
    with pytest.raises(ValueError, match="weights"):
        q.configure_tenants(weights={"A": weight})
    assert not redis_client.exists(q.keys.tenant_settings)
