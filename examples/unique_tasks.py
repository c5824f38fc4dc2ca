"""Unique tasks, debounce and throttle by key (docs/unique.md), with what each publish became.

Three scenes, each a handful of publishes of one key, and what ``celery_pq.publish_outcome``
says of each:

- merge (``while_active``): five requests to rebuild one report while it is queued or running
  give one run; every caller waits on that run's result;
- debounce: five edits of one document within the delay give one reindex, with the last edit's
  arguments, a delay after it;
- throttle: five pings within the period give one run; a ping after the period gives another.

Run it against a pq:// broker, a worker in one shell and the publishes in another::

    celery -A examples.unique_tasks worker -Q unique_demo -P solo
    python -m examples.unique_tasks

or in one go (it starts a worker of its own, and stops it at the end)::

    python -m examples.unique_tasks --with-worker

PQ_EXAMPLE_BROKER  the broker URL (default ``pq://127.0.0.1:6379/0``); the task results go to the
                   same Redis (``redis://``, database 1), where ``AsyncResult.get`` reads them.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

from celery import Celery

import celery_pq

BROKER = os.environ.get("PQ_EXAMPLE_BROKER", "pq://127.0.0.1:6379/0")
QUEUE = "unique_demo"

app = Celery("unique_tasks")
app.conf.update(
    broker_url=BROKER,
    result_backend=BROKER.replace("pqs://", "rediss://").replace("pq://", "redis://").rsplit("/", 1)[0] + "/1",
    task_default_queue=QUEUE,
    task_acks_late=True,  # a while_active key stands until the ack, which comes after the run
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "unique_mode": {QUEUE: "while_active", "*": "while_waiting"},  # the mode of keyed messages that name none
        "unique_seconds": 1,  # the default debounce delay and throttle period (seconds)
    },
)


@app.task(name="unique_demo.rebuild_report")
def rebuild_report(report_id, requested_by):
    time.sleep(0.5)  # the work
    return f"report {report_id} rebuilt (asked by {requested_by})"


@app.task(name="unique_demo.reindex")
def reindex(doc_id, text):
    return f"document {doc_id} indexed as {text!r}"


@app.task(name="unique_demo.ping")
def ping(n):
    return f"ping {n}"


def show(label, results):
    """One line per publish: the id it was given, what became of it, who stands for the key."""
    print(label)
    for result in results:
        o = celery_pq.publish_outcome(result)
        print(f"  {o.requested[:8]}  {o.kind:<9}  stands: {o.task_id[:8]}  key {o.key}")
    return [celery_pq.publish_outcome(r) for r in results]


def merge():
    # five callers ask for the same report; the key is the report (the queue's mode: while_active)
    results = [
        rebuild_report.apply_async(("r-17", user), headers={"pq_unique": "report:r-17"})
        for user in ("ann", "bob", "cy", "dee", "eve")
    ]
    outcomes = show("merge: five requests for report r-17", results)
    # a merged publish waits on the task that stands for the key
    answers = {app.AsyncResult(o.task_id).get(timeout=30) for o in outcomes}
    print(f"  -> {len(answers)} run: {answers.pop()}")


def debounce():
    # five edits of one document, each asking for a reindex one second after the last edit
    results = [
        reindex.apply_async(
            ("doc-3", f"draft {n}"),
            headers={"pq_unique": "reindex:doc-3", "pq_unique_mode": "debounce", "pq_unique_seconds": 1},
        )
        for n in range(1, 6)
    ]
    sent = time.monotonic()
    show("debounce: five edits of doc-3 within the delay", results)
    # the last call wins: its task runs (the replaced ones never will)
    answer = app.AsyncResult(celery_pq.publish_outcome(results[-1]).task_id).get(timeout=30)
    print(f"  -> 1 run, {time.monotonic() - sent:.1f} s after the last edit: {answer}")


def throttle():
    def five(first):
        return [
            ping.apply_async((n,), headers={"pq_unique": "ping", "pq_unique_mode": "throttle"})
            for n in range(first, first + 5)
        ]

    first = show("throttle: five pings within the 1 s period", five(1))
    time.sleep(1.5)  # the period is over
    second = show("throttle: five more pings, 1.5 s later", five(6))
    runs = {o.task_id for o in first + second}
    answers = [app.AsyncResult(task_id).get(timeout=30) for task_id in sorted(runs)]
    print(f"  -> {len(runs)} runs: {', '.join(sorted(answers))}")


def main(argv):
    worker = None
    if "--with-worker" in argv:
        from celery_pq.testing import start_worker

        log = Path(tempfile.mkdtemp(prefix="unique-demo-")) / "worker.log"
        worker = start_worker("examples.unique_tasks", cwd=Path(__file__).resolve().parents[1], queues=QUEUE, log=log)
        worker.wait_ready(60)
    try:
        merge()
        debounce()
        throttle()
    finally:
        if worker is not None:
            worker.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
