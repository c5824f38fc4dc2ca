"""Private redis-servers (plain, TLS, Sentinel, Cluster, Valkey) and real Celery worker
subprocesses, with one ``wait_for``: how the tests, the benchmarks and the demo (and an
application's tests) start them. The transport never imports it. README.md ("Development")."""

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
