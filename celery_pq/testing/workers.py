"""A real ``celery worker`` subprocess, started one way by the tests, the benchmarks and the demo::

    from celery_pq.testing import celery_env, start_worker

    env = celery_env(ROOT, PQ_TEST_BROKER=url)          # ROOT first on PYTHONPATH
    worker = start_worker("tests.e2e.app", cwd=ROOT, env=env, name="w1", queues="q",
                          log=tmp_path / "w1.log")
    try:
        worker.wait_ready(30)                           # its log says " ready." (or WorkerExited)
        ...
    finally:
        worker.stop()                                   # SIGTERM to its process group, then SIGKILL

The worker runs in a process group of its own (``start_new_session``): a signal to it
(``signal_group``) reaches its pool's processes too, and a Ctrl-C at the terminal reaches only
the caller, which then stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from .waiting import wait_for


class WorkerExited(RuntimeError):
    """A worker that exited while it was expected to start."""


def worker_app_settings(env: str, queue: str, *, broker: str = "pq://127.0.0.1:6379/0", **settings) -> dict:
    """The Celery settings of a test's or a benchmark's worker app (its module imported by the
    worker that ``start_worker`` starts), its broker from that worker's environment:
    ``<env>_BROKER`` (else ``broker``) and ``<env>_OPTIONS`` (JSON of the transport options);
    one task prefetched, ``queue`` the default queue, the root logger left alone, a broker not
    up yet retried at start; then ``settings``."""
    return {
        "broker_url": os.environ.get(f"{env}_BROKER", broker),
        "broker_transport_options": json.loads(os.environ.get(f"{env}_OPTIONS", "{}")),
        "worker_prefetch_multiplier": 1,
        "task_default_queue": queue,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        **settings,
    }


def celery_env(root: str | os.PathLike[str], **variables: str) -> dict[str, str]:
    """This process's environment with ``variables`` set and ``root`` (where the Celery app's
    module is imported from) first on PYTHONPATH: for a worker and for any ``celery`` command."""
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **variables, "PYTHONPATH": path}


class WorkerProcess(subprocess.Popen):
    """A ``celery worker`` subprocess (``start_worker`` makes one): a Popen with the worker's
    ``name`` and ``log_path`` (None when its output goes elsewhere)."""

    name: str
    log_path: Path | None

    def log_text(self) -> str:
        """What the worker wrote so far ("" when it has no log file)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def said_ready(self) -> bool:
        """Whether its log says Celery's `` ready.`` (logged at level info)."""
        return self.log_path is not None and self.log_path.exists() and b" ready." in self.log_path.read_bytes()

    def wait_ready(
        self, timeout: float = 60.0, ready: Callable[[], object] | None = None, *, may_exit: bool = False
    ) -> WorkerProcess:
        """Until the worker is ready (``ready()`` is true, by default ``said_ready``) or has
        exited; WorkerExited with its log's end when it exited, unless ``may_exit``. WaitTimeout
        after ``timeout`` seconds."""
        check = ready or self.said_ready
        wait_for(lambda: check() or self.poll() is not None, timeout, f"worker {self.name} to be ready")
        if not may_exit and self.poll() is not None:
            raise WorkerExited(f"worker {self.name} exited with code {self.returncode}:\n{self.log_text()[-3000:]}")
        return self

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (its pool's processes too)."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """``stop_workers`` of this one worker; its exit code."""
        stop_workers([self], sig, timeout)
        return self.returncode


def stop_workers(workers: Iterable[WorkerProcess], sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """``sig`` to the process group of each worker still running, all at once (SIGCONT first: a
    stopped one wakes to hear it), then wait for each up to ``timeout`` seconds, and SIGKILL the
    group of one still running after that."""
    running = [w for w in workers if w.poll() is None]
    for worker in running:
        worker.signal_group(signal.SIGCONT)
        worker.signal_group(sig)
    for worker in running:
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.signal_group(signal.SIGKILL)
            worker.wait(10)


def start_worker(
    app: str,
    *,
    cwd: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    name: str | None = None,
    queues: str | None = "q",
    pool: str | None = "solo",
    concurrency: int | None = 1,
    prefetch_multiplier: int | None = 1,
    loglevel: str = "info",
    gossip: bool = False,
    mingle: bool = False,
    heartbeat: bool = True,
    args: Sequence[str] = (),
    log: Path | IO[bytes] | None = None,
) -> WorkerProcess:
    """Start ``celery -A app worker`` in ``cwd`` with ``env`` (``celery_env(cwd)`` if not given),
    and return at once (``wait_ready`` waits for it).

    ``name``: its node name (``name@%h``; Celery's default when None). ``queues``, ``pool``,
    ``concurrency``, ``prefetch_multiplier``: ``-Q``, ``-P``, ``-c``, ``--prefetch-multiplier``,
    each left out when None. ``gossip``, ``mingle``, ``heartbeat``: False adds ``--without-...``.
    ``args``: more of the worker's arguments, after those. ``log``: a file path (truncated) or an
    open binary file for its stdout and stderr; None discards them."""
    command = [sys.executable, "-m", "celery", "-A", app, "worker", "-l", loglevel]
    for option, value in (
        ("-Q", queues),
        ("-P", pool),
        ("-c", concurrency),
        ("--prefetch-multiplier", prefetch_multiplier),
    ):
        if value is not None:
            command += [option, str(value)]
    if name is not None:
        command += ["-n", f"{name}@%h"]
    command += [
        f"--without-{feature}"
        for feature, on in (("mingle", mingle), ("gossip", gossip), ("heartbeat", heartbeat))
        if not on
    ]
    command += args
    log_path: Path | None = None
    opened: IO[bytes] | None = None
    out: IO[bytes] | int
    if isinstance(log, (str, os.PathLike)):
        log_path = Path(log)
        out = opened = open(log_path, "wb")  # noqa: SIM115 - the child holds it; closed here once started
    else:
        out = subprocess.DEVNULL if log is None else log
    try:
        proc = WorkerProcess(
            command,
            cwd=cwd,
            env=dict(env) if env is not None else celery_env(cwd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if opened is not None:
            opened.close()
    proc.name = name or app
    proc.log_path = log_path
    return proc
