"""A Redis clock step, made without a seam: the scripts read Redis's own TIME, which a test
cannot move, so the clock is stepped by moving every time the queue has stored by the same
amount the other way. A step back of d ms is every stored deadline, due time and bucket moved
d ms later (the records look as if a clock d ms ahead wrote them); time passing by d ms is
every one moved d ms earlier. The stored times moved: due times of delayed entries (``dz``),
lease deadlines (``lz``, only on a step back: a step forward would expire every lease), the
periods of throttle records (``uq``, ``uz``), debounce publish times (``ub``), token buckets
(``fr``), parked tenants' due times (``tw``) and the time of the latest rate park (``fv`` field
``T``). Entry headers (enqueue time, expiry deadline) and the event log keep theirs: the
machines that step the clock give no entry an expiry.
"""

from __future__ import annotations


def _shift_zset(client, key, d: int) -> None:
    rows = client.zrange(key, 0, -1, withscores=True)
    if rows:
        client.zadd(key, {m: max(0, s + d) for m, s in rows})


def shift(client, keys, d: int, leases: bool = False) -> None:
    """Move the stored times of one queue (or shard) ``keys`` by ``d`` ms (later when > 0)."""
    _shift_zset(client, keys.delayed, d)
    _shift_zset(client, keys.rate_parked, d)
    _shift_zset(client, keys.throttle_deadlines, d)
    _shift_zset(client, keys.debounce_publishes, d)
    if leases:
        _shift_zset(client, keys.lease_deadlines, d)
    for field, rec in client.hgetall(keys.unique_keys).items():
        kind, until, rest = rec.split(b"|", 2)
        if kind == b"t":
            client.hset(keys.unique_keys, field, b"t|%d|%s" % (max(0, int(until) + d), rest))
    for field, rec in client.hgetall(keys.token_buckets).items():
        tokens, _, last = rec.partition(b",")
        try:
            moved = b"%s,%d" % (tokens, int(float(last)) + d)
        except ValueError:
            continue
        client.hset(keys.token_buckets, field, moved)
    parked = client.hget(keys.virtual_times, "T")
    if parked is not None:
        client.hset(keys.virtual_times, "T", int(float(parked)) + d)
