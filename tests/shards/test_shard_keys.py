"""Shard names and their hash slots (pure Python)."""

import pytest
from redis.crc import key_slot

from celery_pq.storage.keys import MAX_SHARDS, queue_keys, shard_name, shard_names


def test_shard_zero_is_the_queue_itself_with_todays_keys():
    assert shard_names("orders", 1) == ["orders"]
    assert queue_keys(shard_names("orders", 4)[0]).entries == queue_keys("orders").entries == "pq:{orders}:ii"


def test_names_do_not_depend_on_the_number_of_shards():
    # growing a queue from 4 to 16 shards keeps shards 0..3 where they were
    assert shard_names("orders", 16)[:4] == shard_names("orders", 4)


def test_every_shard_has_its_own_tag_and_dead_letter_queue():
    names = shard_names("orders", 16)
    assert len({queue_keys(n).entries for n in names}) == 16
    assert all(n == "orders" or n.startswith("orders#") for n in names)
    assert shard_names("orders.dead", 4) == [n + ".dead" for n in shard_names("orders", 4)]
    assert queue_keys(shard_names("orders.dead", 4)[2]).entries.startswith(
        f"pq:{{{shard_names('orders', 4)[2]}}}:dead:"
    )


@pytest.mark.parametrize("base", ["orders", "q", "celery", "a{b}c"])
@pytest.mark.parametrize("n", [2, 3, 4, 16])
def test_slots_spread_over_the_ring(base, n):
    # the ring of 16384 slots cut into n equal arcs starting at shard 0's slot: with
    # masters owning equal slot ranges, spread shards land on different masters
    slots = [key_slot(queue_keys(name).entries.encode()) for name in shard_names(base, n)]
    assert len(set(slots)) == n
    arcs = sorted((s - slots[0]) % 16384 for s in slots)
    gaps = [b - a for a, b in zip(arcs, [*arcs[1:], arcs[0] + 16384])]
    assert min(gaps) > 16384 / n / 2  # a random placement has gaps near 0 for n=16


@pytest.mark.parametrize("n", [0, MAX_SHARDS + 1, "4", True, None])
def test_bad_shard_counts_are_refused(n):
    with pytest.raises(ValueError, match="shards must be an integer"):
        shard_names("orders", n)


def test_bad_shard_number_is_refused():
    with pytest.raises(ValueError, match="shard number"):
        shard_name("orders", MAX_SHARDS)
