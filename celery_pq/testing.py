"""A private redis-server process: the one launcher of the tests, the benchmarks and the demo.

As Celery ships ``celery.contrib.testing``, celery-pq ships this module so that its own test
suite, ``benchmarks/`` and ``examples/demo.py`` (and an application's tests, if it likes) start
Redis the same way. Nothing here is imported by the transport itself.

Each ``RedisServer`` runs its own ``redis-server`` on a free port of 127.0.0.1, in a fresh
temporary directory, with persistence off unless the caller asks for it; it is never the
machine's Redis on 6379::

    from celery_pq.testing import RedisServer

    with RedisServer() as server:
        server.client().ping()

    with RedisServer("--appendonly", "yes") as server:   # survives restart()
        server.client().set("k", "v")
        server.restart()
        assert server.client().get("k") == b"v"

What it offers:

- ``find_redis_server()``  the binary: ``$PQ_REDIS_SERVER`` (set by ``make test``), else PATH;
- ``free_port()``          a TCP port of 127.0.0.1 that was free a moment ago (never 6379);
- ``RedisServer``          ``start()``, ``stop()`` (SIGTERM), ``kill()`` (SIGKILL, a crash),
  ``restart()`` (same port, same directory), ``close()``, ``url``, ``client()``, ``log_tail()``;
  a replica is ``RedisServer("--replicaof", master.host, str(master.port))``;
- ``SentinelServer``       a Redis Sentinel watching one master, with short failover timings;
- ``RedisCluster``         a local Redis Cluster (3 masters, each with a replica, by default) whose
  masters can be SIGKILLed, waiting for their replicas' promotion (``kill_master``);
- ``make_certificates``, ``TLSRedisServer``  a CA and server certificate (``openssl``), and a
  redis-server that speaks only TLS with them.

The process runs in a session of its own (a Ctrl-C at the terminal reaches the caller, which
then stops it in order) and, on Linux, is killed when the process that started it dies; any
server still running at interpreter exit is stopped.
"""

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
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

HOST = "127.0.0.1"
RESERVED_PORTS = frozenset({6379})  # the machine's own Redis, if any: never ours
START_TIMEOUT = 10.0  # seconds to wait for PING after starting the process
STOP_TIMEOUT = 10.0  # seconds to wait after SIGTERM before SIGKILL
PORT_ATTEMPTS = 10  # fresh ports to try when the chosen one is taken at start

_running: set["RedisServer"] = set()


def find_redis_server(required: bool = True) -> str | None:
    """Path of the redis-server binary to use. When there is none: RuntimeError saying what is
    missing, or None if not ``required``. A ``$PQ_REDIS_SERVER`` that is not an executable file is
    always an error."""
    env = os.environ.get("PQ_REDIS_SERVER")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise RuntimeError(f"PQ_REDIS_SERVER={env!r} is not an executable file")
    found = shutil.which("redis-server")
    if found or not required:
        return found
    raise RuntimeError(
        "redis-server not found: set PQ_REDIS_SERVER to its path or put it on PATH "
        "(apt-get install redis-server, or brew install redis); `make test` does this for you"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (never 6379)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the process that started it dies (Linux only)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:  # pragma: no cover - best effort, not available off Linux
        pass


class RedisServerError(RuntimeError):
    pass


class _PortTaken(RedisServerError):
    pass


class RedisServer:
    """One redis-server process owned by the code that made it.

    ``args`` are extra redis-server command-line arguments (``"--appendonly", "yes"``);
    ``config`` is the same as a mapping (``{"appendonly": "yes"}``).
    """

    def __init__(self, *args: str, config: dict[str, str] | None = None, binary: str | None = None,
                 start: bool = True):
        self.binary = binary or find_redis_server()
        self.extra_args = list(args)
        self.password = (config or {}).get("requirepass")
        for name, value in (config or {}).items():
            self.extra_args += [f"--{name}", str(value)]
        self.dir = Path(tempfile.mkdtemp(prefix="pq-redis-"))
        self.log_path = self.dir / "redis.log"
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        if start:
            try:
                self.start()
            except BaseException:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise

    # -- addresses -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def client_tls(self) -> dict:
        """redis-py's TLS arguments for a client of this server (none: plain TCP)."""
        return {}

    def client(self, **kwargs) -> redis.Redis:
        """A new redis-py client for this server (db 0 and bytes replies unless told otherwise)."""
        kwargs = {**self.client_tls(), **kwargs}
        kwargs.setdefault("socket_timeout", 30)
        kwargs.setdefault("db", 0)
        if self.password:
            kwargs.setdefault("password", self.password)
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> "RedisServer":
        """Start the process; a first start picks a free port, later starts reuse it."""
        if self.running:
            return self
        if self.port is not None:
            self._launch(self.port)
            return self
        last: Exception | None = None
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            try:
                self._launch(port)
            except _PortTaken as exc:
                last = exc
                continue
            self.port = port
            return self
        raise RedisServerError(f"could not find a free port for redis-server after {PORT_ATTEMPTS} tries: {last}")

    def stop(self) -> None:
        """SIGTERM, wait, SIGKILL if it does not go. The directory (and any AOF) stays."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT)
        self.process = None
        _running.discard(self)

    def kill(self) -> None:
        """SIGKILL without a chance to persist (a crash, not a shutdown)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)
        self.process = None
        _running.discard(self)

    def restart(self) -> "RedisServer":
        """Stop, then start again on the same port with the same directory."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the temporary directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<RedisServer {HOST}:{self.port} {state} dir={self.dir}>"

    # -- internals -------------------------------------------------------------------------

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            "--port", str(port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--logfile", "",
            *self.extra_args,  # later arguments win, so callers may override the above
        ]

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
                self.command(port), cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        _running.add(self)
        deadline = time.monotonic() + START_TIMEOUT
        # No client-side retries: redis-py >= 6 retries with backoff by default, which would
        # hide a process that exited (port taken) behind seconds of waiting.
        probe = redis.Redis(host=HOST, port=port, socket_connect_timeout=0.5, socket_timeout=0.5, password=self.password,
                            retry=Retry(NoBackoff(), 0), **self.client_tls())
        try:
            while True:
                if self.process.poll() is not None:
                    self.process = None
                    _running.discard(self)
                    log_text = self.log_path.read_bytes()[offset:].decode(errors="replace")
                    if "Address already in use" in log_text:
                        raise _PortTaken(f"port {port} is taken")
                    raise RedisServerError(
                        f"redis-server exited while starting on port {port}; log tail:\n{self.log_tail()}"
                    )
                try:
                    if probe.ping():
                        # Is it ours? Another redis may hold the port while ours fails to bind.
                        if probe.info("server").get("process_id") == self.process.pid:
                            return
                        try:
                            self.process.wait(timeout=START_TIMEOUT)  # ours will exit: bind failed
                        except subprocess.TimeoutExpired:
                            self.kill()
                            raise RedisServerError(
                                f"port {port} answers as another redis-server; ours did not exit"
                            ) from None
                        continue
                except redis.ResponseError as exc:
                    # LOADING while an AOF is replayed after restart(): keep waiting
                    if "LOADING" not in str(exc):
                        raise
                except (redis.ConnectionError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise RedisServerError(
                        f"redis-server on port {port} did not answer PING within {START_TIMEOUT:g}s; "
                        f"log tail:\n{self.log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            probe.close()


def make_certificates(directory: Path, *, name: str = "pq test CA") -> dict[str, Path]:
    """A self-signed CA and a server certificate it signed for 127.0.0.1 and localhost, made
    with the ``openssl`` command line in ``directory``: ``{"ca": ..., "cert": ..., "key": ...}``.
    Call it twice (two directories) for a second, unrelated CA."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found: it makes the test certificates (apt-get install openssl)")
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "server.crt", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for args in (
        ["req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name}"],
        ["req", "-new", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "2",
         "-extfile", ext],
    ):
        done = subprocess.run([openssl, *map(str, args)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")
    return {"ca": ca, "cert": cert, "key": key}


class TLSRedisServer(RedisServer):
    """A redis-server that speaks only TLS (``--port 0 --tls-port PORT``), with the server
    certificate and CA of ``certs`` (``make_certificates``); clients need no certificate of
    their own (``--tls-auth-clients no``)."""

    def __init__(self, certs: dict, *args: str, **kwargs):
        self.certs = certs
        super().__init__(*args, **kwargs)

    @property
    def url(self) -> str:
        return f"rediss://{HOST}:{self.port}/0"

    def client_tls(self) -> dict:
        return {"ssl": True, "ssl_ca_certs": str(self.certs["ca"]), "ssl_cert_reqs": "required"}

    def command(self, port: int) -> list[str]:
        plain = super().command(port)
        at = plain.index("--port")
        plain[at + 1] = "0"
        return plain + ["--tls-port", str(port), "--tls-cert-file", str(self.certs["cert"]),
                        "--tls-key-file", str(self.certs["key"]), "--tls-ca-cert-file", str(self.certs["ca"]),
                        "--tls-auth-clients", "no"]


class SentinelServer(RedisServer):
    """A Redis Sentinel (``redis-server CONFIG --sentinel``) on a free port, monitoring one master
    as ``master_name`` with a quorum of ``quorum``; ``down_after_ms`` and ``failover_timeout_ms``
    short, so that a test's failover takes seconds. Sentinel rewrites its config file, so it
    lives in the server's own directory::

        master = RedisServer()
        replica = RedisServer("--replicaof", master.host, str(master.port))
        sentinels = [SentinelServer(master.port) for _ in range(3)]
        url = ";".join(s.pq_url for s in sentinels)     # with master_name="m"

    With ``certs`` (``make_certificates``) it speaks only TLS, as the master and replicas it
    reaches (``TLSRedisServer``s) and the other sentinels do (Redis uses TLS for all of them once
    ``tls-replication`` is on); its clients need the CA (``client_tls()``).
    """

    def __init__(self, master_port: int, *, master_name: str = "m", quorum: int = 2, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 5000, binary: str | None = None, start: bool = True,
                 certs: dict | None = None):
        self.master_port = master_port
        self.certs = certs
        self.master_name = master_name
        self.settings = {"quorum": quorum, "down_after_ms": down_after_ms, "failover_timeout_ms": failover_timeout_ms}
        super().__init__(binary=binary, start=start)

    @property
    def pq_url(self) -> str:
        return f"pq://{HOST}:{self.port}"

    def command(self, port: int) -> list[str]:
        conf = self.dir / "sentinel.conf"
        if not conf.exists():  # later starts keep what sentinel learnt and wrote there
            name, s = self.master_name, self.settings
            conf.write_text(
                f"sentinel monitor {name} {HOST} {self.master_port} {s['quorum']}\n"
                f"sentinel down-after-milliseconds {name} {s['down_after_ms']}\n"
                f"sentinel failover-timeout {name} {s['failover_timeout_ms']}\n"
                f"sentinel parallel-syncs {name} 1\n")
        ports = ["--port", str(port)]
        if self.certs is not None:
            ports = ["--port", "0", "--tls-port", str(port), "--tls-replication", "yes", "--tls-auth-clients", "no",
                     "--tls-cert-file", str(self.certs["cert"]), "--tls-key-file", str(self.certs["key"]),
                     "--tls-ca-cert-file", str(self.certs["ca"])]
        return [self.binary, str(conf), "--sentinel", *ports, "--bind", HOST, "--dir", str(self.dir),
                "--daemonize", "no", "--logfile", ""]

    def client_tls(self) -> dict:
        if self.certs is None:
            return {}
        return {"ssl": True, "ssl_ca_certs": str(self.certs["ca"]), "ssl_cert_reqs": "required"}

    def master(self) -> dict:
        """What this sentinel says of its master (``SENTINEL MASTER``), as text."""
        with redis.Redis(host=HOST, port=self.port, socket_timeout=5, decode_responses=True, **self.client_tls()) as c:
            return c.sentinel_master(self.master_name)

    def master_address(self) -> tuple[str, int] | None:
        with redis.Redis(host=HOST, port=self.port, socket_timeout=5, decode_responses=True, **self.client_tls()) as c:
            found = c.sentinel_get_master_addr_by_name(self.master_name)
        return (found[0], int(found[1])) if found else None


class ClusterNode(RedisServer):
    """One node of a ``RedisCluster``: a redis-server with ``--cluster-enabled yes`` on a port
    whose cluster bus port (port + 10000) was free too, with short failure detection."""

    def __init__(self, *args: str, node_timeout_ms: int = 1000, **kwargs):
        self.node_timeout_ms = node_timeout_ms
        super().__init__(*args, start=False, **kwargs)
        last: Exception | None = None
        for _ in range(PORT_ATTEMPTS):
            self.port = _free_cluster_port()
            try:
                self._launch(self.port)
                return
            except _PortTaken as exc:
                last = exc
        shutil.rmtree(self.dir, ignore_errors=True)
        raise RedisServerError(f"could not find a free port pair for a cluster node: {last}")

    def command(self, port: int) -> list[str]:
        # nodes.conf lives in the node's own directory: a restart() rejoins with the same identity
        return super().command(port) + [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # the other masters keep serving while one of them fails over
            "--cluster-require-full-coverage", "no",
            # a replica promotes however long its link was down (a test kills at any time)
            "--cluster-replica-validity-factor", "0",
        ]

    def node_id(self) -> str:
        with self.client(decode_responses=True) as c:
            return c.execute_command("CLUSTER", "MYID")

    def role(self) -> str:
        with self.client(decode_responses=True, socket_timeout=2) as c:
            return c.execute_command("ROLE")[0]


def _free_cluster_port() -> int:
    """A port of 127.0.0.1 that is free, and whose cluster bus port (+10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535 or port + 10000 in RESERVED_PORTS:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((HOST, port + 10000))
            except OSError:
                continue
        return port


class RedisCluster:
    """A local Redis Cluster: ``masters`` masters with ``replicas`` replicas each, made with
    ``redis-cli --cluster create`` and ready (``cluster_state:ok``, every slot served, every
    node agreeing) when the constructor returns::

        with RedisCluster() as cluster:              # 3 masters + 3 replicas
            client = cluster.client()               # a redis.RedisCluster
            url = cluster.pq_url                    # pq://127.0.0.1:PORT, with {"cluster": True}
            node = cluster.master_of(b"pq:{orders}:ii")
            promoted = cluster.kill_master(node)    # SIGKILL; returns its replica, now a master
            cluster.restart(node)                   # back, as a replica of the promoted one

    ``node_timeout_ms`` is the cluster's failure detection (``cluster-node-timeout``): a killed
    master's replica takes over about two of it later.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 1000,
                 binary: str | None = None, ready_timeout: float = 30.0):
        self.nodes: list[ClusterNode] = []
        self.ready_timeout = ready_timeout
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(ClusterNode(binary=binary, node_timeout_ms=node_timeout_ms))
            cli = shutil.which("redis-cli", path=os.path.dirname(self.nodes[0].binary) + os.pathsep
                               + os.environ.get("PATH", ""))
            if cli is None:
                raise RedisServerError("redis-cli not found next to redis-server or on PATH: it creates the cluster")
            done = subprocess.run([cli, "--cluster", "create", *(f"{HOST}:{n.port}" for n in self.nodes),
                                   "--cluster-replicas", str(replicas), "--cluster-yes"],
                                  capture_output=True, text=True, timeout=60)
            if done.returncode:
                raise RedisServerError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr}")
            self.wait_ready(masters=masters, replicas=masters * replicas)
        except BaseException:
            self.close()
            raise

    @property
    def seed(self) -> ClusterNode:
        """A running node (the broker URL may name any)."""
        return next(n for n in self.nodes if n.running)

    @property
    def pq_url(self) -> str:
        """``pq://127.0.0.1:P1;pq://127.0.0.1:P2;...``: every running node as a seed (with the
        transport option ``cluster``), so that a reconnection finds one while a node is down."""
        return ";".join(f"pq://{HOST}:{n.port}" for n in self.nodes if n.running)

    def client(self, **kwargs) -> redis.RedisCluster:
        kwargs.setdefault("socket_timeout", 10)
        return redis.RedisCluster(host=HOST, port=self.seed.port, **kwargs)

    def _by_port(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == int(port))

    def masters(self) -> list[ClusterNode]:
        """The running nodes that are masters now."""
        return [n for n in self.nodes if n.running and n.role() == "master"]

    def master_of(self, key) -> ClusterNode:
        """The node that serves ``key``'s slot now."""
        with self.seed.client(decode_responses=True) as c:
            slot = c.execute_command("CLUSTER", "KEYSLOT", key)
            for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return self._by_port(master[1])
        raise RedisServerError(f"no node serves the slot of {key!r}")

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        mid = master.node_id()
        out = []
        for n in self.nodes:
            if n is master or not n.running:
                continue
            with n.client(decode_responses=True) as c:
                info = c.execute_command("CLUSTER", "NODES")
            for line in info.splitlines():
                parts = line.split()
                if "myself" in parts[2] and "slave" in parts[2] and parts[3] == mid:
                    out.append(n)
        return out

    def tags_on_distinct_masters(self, prefix: str = "q") -> list[str]:
        """One name per master whose ``{name}`` hash tag lands on that master (``prefix0``,
        ``prefix7``, ...): queues spread over every master."""
        found: dict[int, str] = {}
        with self.seed.client(decode_responses=True) as c:
            slots = c.execute_command("CLUSTER", "SLOTS")
            i = 0
            while len(found) < len(slots) and i < 10_000:
                name = f"{prefix}{i}"
                slot = c.execute_command("CLUSTER", "KEYSLOT", name)
                for start, end, master, *_ in slots:
                    if start <= slot <= end:
                        found.setdefault(master[1], name)
                i += 1
        return list(found.values())

    def slot_of(self, key) -> int:
        with self.seed.client() as c:
            return int(c.execute_command("CLUSTER", "KEYSLOT", key))

    def move_slot(self, slot: int, to: ClusterNode, *, pause: float = 0.0, on_key=None) -> int:
        """Move hash ``slot`` to master ``to`` the way ``redis-cli --cluster reshard`` does:
        ``CLUSTER SETSLOT slot IMPORTING`` at ``to``, ``MIGRATING`` at the master serving it now,
        every key of the slot moved by its own ``MIGRATE`` (``pause`` seconds after each, so that
        calls meet the slot half moved; ``on_key(n)`` called after the n-th), then ``SETSLOT slot
        NODE`` on every master, and until every node says ``to`` serves it. Returns how many
        keys were moved (0, nothing done, when ``to`` serves the slot already)."""
        source = self._owner_of_slot(slot)
        if source.port == to.port:
            return 0
        sid, tid = source.node_id(), to.node_id()
        moved = 0
        with source.client(decode_responses=True) as s, to.client(decode_responses=True) as t:
            t.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", sid)
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", tid)
            while True:
                keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10)
                for key in keys:
                    s.execute_command("MIGRATE", HOST, to.port, "", 0, 10_000, "KEYS", key)
                    moved += 1
                    if on_key is not None:
                        on_key(moved)
                    if pause:
                        time.sleep(pause)
                if keys:
                    continue
                t.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tid)
                try:
                    s.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tid)
                except redis.ResponseError as exc:  # a key written at the source meanwhile: move it too
                    if "still hold keys" not in str(exc):
                        raise
                    continue
                break
        for m in self.masters():
            if m.port not in (source.port, to.port):
                with m.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tid)
        deadline = time.monotonic() + self.ready_timeout
        while not all(self._owner_of_slot(slot, n).port == to.port for n in self.nodes if n.running):
            if time.monotonic() > deadline:
                raise RedisServerError(f"the nodes did not agree that {to!r} serves slot {slot}")
            time.sleep(0.05)
        return moved

    def _owner_of_slot(self, slot: int, asked: ClusterNode | None = None) -> ClusterNode:
        with (asked or self.seed).client(decode_responses=True) as c:
            for start, end, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return self._by_port(master[1])
        raise RedisServerError(f"no node serves slot {slot}")

    def kill_master(self, master: ClusterNode, timeout: float | None = None) -> ClusterNode:
        """SIGKILL ``master`` (a crash) and wait until one of its replicas is a master serving
        its slots and the cluster is ok again; that replica."""
        replicas = self.replicas_of(master)
        if not replicas:
            raise RedisServerError(f"{master!r} has no replica to take over")
        master.kill()
        return self.wait_promotion(replicas, timeout)

    def wait_promotion(self, replicas: list[ClusterNode], timeout: float | None = None) -> ClusterNode:
        """Until one of ``replicas`` (of a master that is gone) is a master and the cluster is ok."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            for r in replicas:
                try:
                    if r.role() == "master" and self._ok(r):
                        return r
                except redis.RedisError:
                    pass
            time.sleep(0.1)
        raise RedisServerError(f"no replica of the killed master took over within {timeout or self.ready_timeout}s")

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again (same port and nodes.conf): it rejoins, a replica of the
        node that took its slots; wait until the cluster sees it."""
        node.start()
        self.wait_ready()

    def _ok(self, node: ClusterNode) -> bool:
        with node.client(decode_responses=True, socket_timeout=2) as c:
            info = c.execute_command("CLUSTER", "INFO")
        return "cluster_state:ok" in info and "cluster_slots_ok:16384" in info

    @staticmethod
    def _linked(replica: ClusterNode) -> bool:
        """Has the replica synced with its master (its link up)?"""
        with replica.client(decode_responses=True, socket_timeout=2) as c:
            role = c.execute_command("ROLE")
        return role[0] == "slave" and role[3] == "connected"

    def wait_ready(self, masters: int | None = None, replicas: int | None = None) -> None:
        """Until every running node says the cluster is ok, all 16384 slots served, every
        replica is synced with its master, and the nodes agree on the roles (``masters`` / ``replicas`` of them, when given)."""
        deadline = time.monotonic() + self.ready_timeout
        while True:
            try:
                running = [n for n in self.nodes if n.running]
                if all(self._ok(n) for n in running):
                    roles = [n.role() for n in running]
                    if not all(self._linked(n) for n, role in zip(running, roles) if role == "slave"):
                        raise redis.ConnectionError("a replica is still syncing")
                    views = set()
                    for n in running:
                        with n.client(decode_responses=True) as c:
                            lines = c.execute_command("CLUSTER", "NODES").splitlines()
                        views.add(frozenset((p[1].split("@")[0], "master" in p[2], "fail" in p[2])
                                            for p in (line.split() for line in lines)))
                    live = {f"{HOST}:{n.port}" for n in running}
                    if (len(views) == 1 and not any(failed for addr, _, failed in next(iter(views)) if addr in live)
                            and (masters is None or roles.count("master") == masters)
                            and (replicas is None or roles.count("slave") == replicas)):
                        return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RedisServerError("the cluster did not become ready in time:\n"
                                       + "\n".join(f"{n!r}: {n.log_tail(5)}" for n in self.nodes))
            time.sleep(0.1)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> "RedisCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        try:
            server.close()
        except Exception:
            pass
