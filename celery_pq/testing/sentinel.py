"""``SentinelServer``: a Redis Sentinel watching one master, with short failover timings."""

from __future__ import annotations

from .server import HOST, RedisServer


class SentinelServer(RedisServer):
    """A Redis Sentinel monitoring the master at ``master_port`` as ``master_name`` (quorum 2), with
    short timings (down after 1 s, failover timeout 5 s); with ``certs`` (``make_certificates``) it
    speaks only TLS. Three make a broker URL: ``";".join(s.pq_url for s in sentinels)``."""

    def __init__(
        self, master_port: int, *, master_name: str = "m", binary: str | None = None, certs: dict | None = None
    ):
        self.master_port = master_port
        self.certs = certs
        self.master_name = master_name
        super().__init__(binary=binary)

    @property
    def pq_url(self) -> str:
        return f"pq://{HOST}:{self.port}"

    def command(self, port: int) -> list[str]:
        conf = self.dir / "sentinel.conf"
        if not conf.exists():  # later starts keep what sentinel learnt and wrote there
            name = self.master_name
            conf.write_text(
                f"sentinel monitor {name} {HOST} {self.master_port} 2\n"
                f"sentinel down-after-milliseconds {name} 1000\n"
                f"sentinel failover-timeout {name} 5000\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
        tls = [] if self.certs is None else ["--tls-replication", "yes"]
        return [self.binary, str(conf), "--sentinel", *super().command(port)[1:], *tls]

    def master(self) -> dict:
        """What this sentinel says of its master (``SENTINEL MASTER``), as text."""
        with self.client(socket_timeout=5, decode_responses=True) as c:
            return c.sentinel_master(self.master_name)

    def master_address(self) -> tuple[str, int] | None:
        with self.client(socket_timeout=5, decode_responses=True) as c:
            found = c.sentinel_get_master_addr_by_name(self.master_name)
        return (found[0], int(found[1])) if found else None
