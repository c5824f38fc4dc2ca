"""Event logs for the Spark tests: streams filled by hand in the log's exact format (the fields,
in order, all strings), and a small real run of a queue with its event log on."""

from __future__ import annotations

import random

from celery_pq import Item, PriorityQueue
from celery_pq.queue import QueueSettings, open_queue
from celery_pq.spark.events.log import events_key

FIELDS = ("e", "q", "id", "p", "k", "t", "c", "task", "n", "r", "ms")


def xadd_event(
    client,
    queue: str,
    event: str,
    *,
    prefix: str,
    id: str = "",
    p="",
    k="",
    t="",
    c="",
    task="",
    n="",
    r="",
    ms=None,
    sid="*",
    maxlen=None,
) -> str:
    """Append one event to ``queue``'s log; returns its stream id."""
    if ms is None:
        sec, usec = client.time()
        ms = sec * 1000 + usec // 1000
    values = dict(e=event, q=queue, id=id, p=p, k=k, t=t, c=c, task=task, n=n, r=r, ms=ms)
    fields = {f: str(values[f]) for f in FIELDS}
    kwargs = {"maxlen": maxlen, "approximate": False} if maxlen else {}
    out = client.xadd(events_key(queue, prefix), fields, id=sid, **kwargs)
    return out.decode() if isinstance(out, bytes) else out


def real_run(client, prefix: str, queue: str = "work", *, entries: int = 300, seed: int = 7) -> PriorityQueue:
    """A queue with its event log on, shared by tenants ``a`` (many, urgent), ``b`` and ``c`` with
    ``fair_scope="tenant_first"`` (so some deliveries pass over better-ranked entries of another
    tenant: rank errors), popped in batches by two consumers that ack most, give some back, let a
    few leases expire, and dead-letter one; a few entries are removed before delivery."""
    rnd = random.Random(seed)
    q = open_queue(
        client,
        queue,
        QueueSettings(
            key_prefix=prefix,
            fair=True,
            fair_scope="tenant_first",
            event_log=100_000,
            lease_seconds=0.05,
            max_deliveries=3,
        ),
    )
    items = []
    for i in range(entries):
        tenant = rnd.choices("abc", weights=(6, 3, 1))[0]
        priority = rnd.choice((9, 5, 1)) if tenant == "a" else rnd.randrange(0, 10)
        items.append(Item(f"payload{i}".encode(), priority, f"{queue}-{i}", tenant=tenant))
    for i in range(0, entries, 50):
        q.insert_many(items[i : i + 50])
        # consume part of the backlog between the bursts of inserts
        for lease in q.pop(20, consumer=f"w{i % 2}", lease_seconds=30):
            q.ack(lease)
    q.remove(f"{queue}-{entries - 1}")
    expired = q.pop(3, consumer="w9")  # lease of 0.05 s: runs out, back to waiting
    import time

    time.sleep(0.1)
    q.reclaim()
    assert expired
    given_back = q.pop(2, consumer="w1", lease_seconds=30)
    for lease in given_back:
        q.requeue(lease)
    [doomed] = q.pop(1, consumer="w1", lease_seconds=30)
    q.dead_letter(doomed, reason="bad_input")
    while True:
        batch = q.pop(25, consumer="w0", lease_seconds=30)
        if not batch:
            break
        for lease in batch:
            q.ack(lease)
    return q
