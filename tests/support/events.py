"""Event-log streams filled by hand in the log's exact format (the fields, in order, all strings),
for readers that must not depend on which script writes which event."""

from __future__ import annotations

from celery_pq.spark.eventlog import events_key

FIELDS = ("e", "q", "id", "p", "k", "t", "c", "task", "n", "r", "ms")


def xadd_event(client, queue: str, event: str, *, prefix: str, id: str = "", p="", k="", t="", c="",
               task="", n="", r="", ms=None, sid="*", maxlen=None) -> str:
    """Append one event to ``queue``'s log; returns its stream id."""
    if ms is None:
        sec, usec = client.time()
        ms = sec * 1000 + usec // 1000
    values = dict(e=event, q=queue, id=id, p=p, k=k, t=t, c=c, task=task, n=n, r=r, ms=ms)
    fields = {f: str(values[f]) for f in FIELDS}
    kwargs = {"maxlen": maxlen, "approximate": False} if maxlen else {}
    out = client.xadd(events_key(queue, prefix), fields, id=sid, **kwargs)
    return out.decode() if isinstance(out, bytes) else out
