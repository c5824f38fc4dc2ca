"""The Celery app of the unique-task end-to-end tests (tests/e2e/test_unique_e2e.py), configured
from the environment like tests/e2e/app.py, and a producer process for them.

PQ_TEST_BROKER     broker URL (pq://127.0.0.1:PORT/0)
PQ_TEST_OPTIONS    JSON of broker_transport_options
PQ_TEST_RECORD     Redis URL where tasks record what they did (lists under PQ_TEST_PREFIX)
PQ_TEST_PREFIX     key prefix of the test module (also used for the records)

Every run of ``unique.work`` pushes ``{"id", "key", "arg", "pid", "delivery", "at"}`` (``at``:
its start, epoch seconds) to ``<prefix>:rec:start`` when it starts and ``{"id", "key", "arg"}``
to ``<prefix>:rec:done`` when it ends. With ``hold`` true it waits in between until the test sets ``<prefix>:go:<key>``, so
that a test decides when a run ends without guessing how long it takes (the worker renews its
lease meanwhile); ``<prefix>:go-all`` ends every held run (the module's teardown sets it).
``unique.retry_once`` records its start likewise (with ``retries`` and ``unique``, the key its
message carried), retries once, and ends.

As a producer process (``python -m tests.e2e.unique_app QUEUE JSON [START]``, JSON a list of
``[key, arg, headers, hold]``, START an epoch time to begin at), it publishes them from 4
threads at once and prints a JSON list of ``[task id, outcome kind, standing task id, key]``,
one per publish, as ``celery_pq.publish_outcome`` answers in this process.
"""

import json
import os
import sys
import threading
import time

from celery import Celery

import celery_pq

from .recording import configure, log, rec

app = Celery("unique-e2e")
configure(app, task_acks_late=True)  # while_active holds a key until the ack: after the run, not before it

HOLD_LIMIT = 60.0  # seconds a held run waits for its go at most (a test that forgot it fails, not hangs)


@app.task(name="unique.work", bind=True)
def work(self, key, arg, hold=False):
    r = self.request
    delivery = (r.get("x-delivery-count") or 0) + 1
    log("start", {"id": r.id, "key": key, "arg": arg, "pid": os.getpid(), "delivery": delivery, "at": time.time()})
    if hold:
        prefix = os.environ["PQ_TEST_PREFIX"]
        go = (f"{prefix}:go:{key}", f"{prefix}:go-all")  # go-all: the test module ends
        deadline = time.monotonic() + HOLD_LIMIT
        while not rec().exists(*go) and time.monotonic() < deadline:
            time.sleep(0.05)
    log("done", {"id": r.id, "key": key, "arg": arg})


@app.task(name="unique.retry_once", bind=True)
def retry_once(self, key, arg):
    """Records its start (with ``retries``: Celery's retry count) and retries once (the same
    task id published again, its header ``retries`` one up), then ends."""
    r = self.request
    carried = (r.headers or {}).get("pq_unique", getattr(r, "pq_unique", None))  # the unique key it came with
    log("start", {"id": r.id, "key": key, "arg": arg, "retries": r.retries, "unique": carried, "at": time.time()})
    if r.retries == 0:
        raise self.retry(countdown=0.2)
    log("done", {"id": r.id, "key": key, "arg": arg})


def publish_all(client, queue, calls, threads=8):
    """Each ``(key, arg, headers, hold)`` of ``calls`` published by ``client`` (a Celery app) from
    ``threads`` threads at once (call i from thread i % threads, the threads started together);
    ``[task id, kind, standing task id, key]`` of each as ``publish_outcome`` answers, in the
    order given (kind None: no outcome known)."""
    threads = max(1, min(threads, len(calls)))
    start = threading.Barrier(threads)
    results = [None] * len(calls)

    def run(first):
        start.wait()
        for i in range(first, len(calls), threads):
            key, arg, headers, hold = calls[i]
            results[i] = client.send_task("unique.work", args=(key, arg, hold), queue=queue, headers=headers)

    pool = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out = []
    for result in results:
        outcome = celery_pq.publish_outcome(result)
        out.append(
            [result.id, outcome.kind, outcome.task_id, outcome.key] if outcome else [result.id, None, None, None]
        )
    return out


if __name__ == "__main__":
    if len(sys.argv) > 3:  # an epoch time to start at: producers of several processes publish together
        time.sleep(max(0.0, float(sys.argv[3]) - time.time()))
    print(json.dumps(publish_all(app, sys.argv[1], json.loads(sys.argv[2]), threads=4)))
