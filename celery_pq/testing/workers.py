"""A real ``celery worker`` subprocess for the tests, the benchmarks and the demo, in a process
group of its own: ``signal_group`` reaches its pool's processes, and a Ctrl-C only the caller."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import IO

from .waiting import wait_for


class WorkerExited(RuntimeError):
    """A worker that exited while it was expected to start."""


def worker_app_settings(env: str, queue: str, *, broker: str = "pq://127.0.0.1:6379/0", **settings) -> dict:
    """The Celery settings of a ``start_worker`` app: broker from ``<env>_BROKER`` (else ``broker``)
    and ``<env>_OPTIONS`` (JSON transport options) in the environment, ``queue`` the default; then
    ``settings``."""
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
    """This process's environment with ``variables`` set and ``root`` (where the app's module is
    imported from) first on PYTHONPATH."""
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **variables, "PYTHONPATH": path}


class WorkerProcess(subprocess.Popen):
    """A Popen of ``celery worker`` (``start_worker``) with its ``name`` and ``log_path`` (or None)."""

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

    def wait_ready(
        self, timeout: float = 60.0, ready: Callable[[], object] | None = None, *, may_exit: bool = False
    ) -> WorkerProcess:
        """Until ``ready()`` (default: its log says Celery's `` ready.``, logged at level info) or the
        worker exited: WorkerExited with its log's end, unless ``may_exit``; WaitTimeout after
        ``timeout`` seconds."""
        check = ready or (lambda: " ready." in self.log_text())
        wait_for(lambda: check() or self.poll() is not None, timeout, f"worker {self.name} to be ready")
        if not may_exit and self.poll() is not None:
            raise WorkerExited(f"worker {self.name} exited with code {self.returncode}:\n{self.log_text()[-3000:]}")
        return self

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (its pool's processes too)."""
        with suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """``stop_workers`` of this one worker; its exit code."""
        stop_workers([self], sig, timeout)
        return self.returncode


def stop_workers(workers: Iterable[WorkerProcess], sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """``sig`` to each running worker's process group at once (after SIGCONT: a stopped one wakes
    to hear it), then wait up to ``timeout`` seconds for each, SIGKILL for one still running."""
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
    """Start ``celery -A app worker`` in ``cwd`` with ``env`` (default ``celery_env(cwd)``) and return
    at once (``wait_ready`` waits). ``name``: node ``name@%h``; None leaves an option out; ``gossip``,
    ``mingle``, ``heartbeat`` False: ``--without-...``; ``args`` last. ``log``: a path (truncated) or
    an open binary file for stdout and stderr; None discards them."""
    command = [sys.executable, "-m", "celery", "-A", app, "worker", "-l", loglevel]
    options = {"-Q": queues, "-P": pool, "-c": concurrency, "--prefetch-multiplier": prefetch_multiplier}
    options["-n"] = None if name is None else f"{name}@%h"
    command += [arg for option, value in options.items() if value is not None for arg in (option, str(value))]
    without = {"mingle": mingle, "gossip": gossip, "heartbeat": heartbeat}
    command += [f"--without-{feature}" for feature, on in without.items() if not on]
    command += args
    log_path = None
    output: AbstractContextManager = nullcontext(subprocess.DEVNULL if log is None else log)
    if isinstance(log, (str, os.PathLike)):
        log_path = Path(log)
        output = open(log_path, "wb")  # noqa: SIM115 - closed here once the child holds it
    with output as out:
        proc = WorkerProcess(
            command,
            cwd=cwd,
            env=dict(env) if env is not None else celery_env(cwd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc.name = name or app
    proc.log_path = log_path
    return proc
