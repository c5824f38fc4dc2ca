"""Celery app of the fault suite (benchmarks/fault_harness.py starts its workers with it).

FAULT_BROKER   broker URL (pq://... or redis://...)
FAULT_OPTIONS  JSON of broker_transport_options
FAULT_RECORDS  directory where each worker process appends one line per run of a task

A run is written as two lines, ``start <id> <pgid> <pid> <time>`` before the task's work and
``done <id> <pgid> <pid> <time>`` after it, to a file of its own process opened with O_APPEND:
a line is one write(2), so a SIGKILL leaves whole lines behind and no broker fault touches them.
"""

import os
import time

from celery import Celery

import celery_pq  # noqa: F401  (registers pq://)
from celery_pq.testing import worker_app_settings

app = Celery("faults")
app.conf.update(
    worker_app_settings(
        "FAULT",
        "faults",
        task_acks_late=True,
        broker_connection_max_retries=None,  # a Redis restart must not end a worker
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
)

_fd = None


def _write(kind: str, tid: str) -> None:
    global _fd
    if _fd is None:
        path = os.path.join(os.environ["FAULT_RECORDS"], f"{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_fd, f"{kind} {tid} {os.getpgid(0)} {os.getpid()} {time.time():.6f}\n".encode())


@app.task(name="faults.work")
def work(tid, seconds):
    _write("start", tid)
    time.sleep(seconds)
    _write("done", tid)
