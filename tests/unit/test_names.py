"""Names in the stored keys and records: a queue's keys share one hash tag with its dead-letter
queue's, dead-letter names, tenants escaped (no Redis)."""

import pytest

from celery_pq.queue import escape_tenant, unescape_tenant
from celery_pq.storage.keys import dead_queue_name, queue_keys, split_dead


def test_keys_share_one_tag_and_dead_queue_shares_it():
    k = queue_keys("orders", "pq")
    d = queue_keys("orders.dead", "pq")
    assert k.entries == "pq:{orders}:ii" and k.priority_index == "pq:{orders}:pi"
    assert d.entries == "pq:{orders}:dead:ii"
    assert all("{orders}" in key for key in k.all() + d.all())
    # 32 suffixes, 256 priority lists and 256 front lists each, 256 + 1 keys of a migration
    assert len(set(k.all() + d.all())) == 2 * (34 + 2 * 256 + 257)
    assert k.level(0) == "pq:{orders}:pi:0" and d.level(255) == "pq:{orders}:dead:pi:255"


def test_braces_in_queue_names_cannot_break_the_tag():
    k = queue_keys("a}b{c", "pq")
    tag = k.entries[k.entries.index("{") + 1 : k.entries.index("}")]
    assert "{" not in tag and "}" not in tag
    assert queue_keys("a}b{c").entries != queue_keys("a%7Db%7Bc").entries


def test_dead_names():
    assert split_dead("x.dead") == ("x", True)
    assert split_dead("x") == ("x", False)
    assert split_dead(".dead") == (".dead", False)
    assert dead_queue_name("x") == "x.dead"
    with pytest.raises(ValueError):
        dead_queue_name("x.dead")


@pytest.mark.parametrize("tenant", ["acme", "a,b", "a|b", "100%", "%2C", ""])
def test_tenant_escaping_round_trips(tenant):
    esc = escape_tenant(tenant)
    assert "," not in esc and "|" not in esc
    assert unescape_tenant(esc) == tenant
