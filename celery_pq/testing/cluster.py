"""``RedisCluster``: a local Redis Cluster of ``ClusterNode`` redis-servers, whose masters can be
SIGKILLed (waiting for their replicas' promotion) and whose slots can be moved (docs/cluster.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import redis

from .server import HOST, RedisServer, RedisServerError, flags
from .waiting import wait_for

#: ``cluster-node-timeout``: a killed master's replica takes over about two of it later.
NODE_TIMEOUT_MS = 1000
#: Seconds to wait for the cluster to be ready, a replica's promotion, a slot's move.
READY_TIMEOUT = 30.0


class ClusterNode(RedisServer):
    """One node of a ``RedisCluster``: a redis-server with ``--cluster-enabled yes`` on a port
    whose cluster bus port (port + 10000) was free too, with short failure detection."""

    bus_offset = 10000

    def command(self, port: int) -> list[str]:
        settings = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",  # in the node's directory: a restart() rejoins as itself
            "cluster-node-timeout": NODE_TIMEOUT_MS,
            "cluster-require-full-coverage": "no",  # the other masters serve while one fails over
            "cluster-replica-validity-factor": 0,  # a replica promotes however long its link was down
        }
        return [*super().command(port), *flags(settings)]

    def ask(self, *command, timeout: float = 30):
        """One command's reply (decoded), on a client of its own."""
        with self.client(decode_responses=True, socket_timeout=timeout) as c:
            return c.execute_command(*command)

    def node_id(self) -> str:
        return self.ask("CLUSTER", "MYID")

    def role(self) -> str:
        return self.ask("ROLE", timeout=2)[0]


def _serving(slots: list, slot: int) -> int | None:
    """The port of the master a ``CLUSTER SLOTS`` reply says serves ``slot``."""
    return next((master[1] for start, end, master, *_ in slots if start <= slot <= end), None)


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each (``redis-cli --cluster create``), ready
    (``wait_ready``) when the constructor returns; ``client()`` is a ``redis.RedisCluster``."""

    def __init__(self, masters: int = 3, replicas: int = 1):
        self.nodes: list[ClusterNode] = []
        try:
            for _ in range(masters * (1 + replicas)):
                self.nodes.append(ClusterNode())
            cli = shutil.which(
                "redis-cli", path=os.path.dirname(self.nodes[0].binary) + os.pathsep + os.environ.get("PATH", "")
            )
            if cli is None:
                raise RedisServerError("redis-cli not found next to redis-server or on PATH: it creates the cluster")
            addresses = [f"{HOST}:{n.port}" for n in self.nodes]
            create = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(replicas), "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=60)
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
        """``pq://127.0.0.1:P1;pq://127.0.0.1:P2;...`` (with the transport option ``cluster``):
        every running node a seed, so a reconnection finds one while a node is down."""
        return ";".join(f"pq://{HOST}:{n.port}" for n in self.nodes if n.running)

    def client(self, **kwargs) -> redis.RedisCluster:
        kwargs.setdefault("socket_timeout", 10)
        return redis.RedisCluster(host=HOST, port=self.seed.port, **kwargs)

    def masters(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.running and n.role() == "master"]

    def master_of(self, key) -> ClusterNode:
        return self._owner_of_slot(self.slot_of(key))

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        """The running nodes that replicate ``master`` now (by their ``ROLE``)."""
        return [n for n in self.nodes if n.running and n.ask("ROLE", timeout=2)[:3] == ["slave", HOST, master.port]]

    def tags_on_distinct_masters(self, prefix: str = "q") -> list[str]:
        """One name per master (``prefix0``, ``prefix7``, ...) whose ``{name}`` tag lands there."""
        found: dict[int, str] = {}
        slots = self.seed.ask("CLUSTER", "SLOTS")
        for name in (f"{prefix}{i}" for i in range(10_000)):
            if len(found) == len(slots):
                break
            port = _serving(slots, self.slot_of(name))
            if port is not None:
                found.setdefault(port, name)
        return list(found.values())

    def slot_of(self, key) -> int:
        return int(self.seed.ask("CLUSTER", "KEYSLOT", key))

    def move_slot(self, slot: int, to: ClusterNode, *, pause: float = 0.0) -> int:
        """Move hash ``slot`` to master ``to`` as ``redis-cli --cluster reshard`` does, pausing ``pause``
        seconds after each key (calls meet the slot half moved), and wait until every node agrees;
        the number of keys moved (0 if ``to`` serves it already)."""
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
                    if pause:
                        time.sleep(pause)
                if keys:
                    continue
                t.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tid)
                try:
                    s.execute_command("CLUSTER", "SETSLOT", slot, "NODE", tid)
                except redis.ResponseError as exc:  # a key written at the source meanwhile
                    if "still hold keys" not in str(exc):
                        raise
                    continue
                break
        for m in self.masters():
            if m.port not in (source.port, to.port):
                m.ask("CLUSTER", "SETSLOT", slot, "NODE", tid)
        wait_for(
            lambda: all(self._owner_of_slot(slot, n).port == to.port for n in self.nodes if n.running),
            READY_TIMEOUT,
            f"the nodes to agree that {to!r} serves slot {slot}",
        )
        return moved

    def _owner_of_slot(self, slot: int, asked: ClusterNode | None = None) -> ClusterNode:
        port = _serving((asked or self.seed).ask("CLUSTER", "SLOTS"), slot)
        if port is None:
            raise RedisServerError(f"no node serves slot {slot}")
        return next(n for n in self.nodes if n.port == int(port))

    def kill_master(self, master: ClusterNode) -> ClusterNode:
        """SIGKILL ``master`` and wait until one of its replicas serves its slots and the cluster
        is ok; that replica."""
        replicas = self.replicas_of(master)
        if not replicas:
            raise RedisServerError(f"{master!r} has no replica to take over")
        master.kill()
        return self.wait_promotion(replicas)

    def wait_promotion(self, replicas: list[ClusterNode]) -> ClusterNode:
        """Until one of ``replicas`` (of a master that is gone) is a master and the cluster is ok."""

        def promoted() -> ClusterNode | None:
            for r in replicas:
                try:
                    if r.role() == "master" and self._ok(r):
                        return r
                except redis.RedisError:
                    pass
            return None

        return wait_for(promoted, READY_TIMEOUT, "a replica of the killed master to take over", interval=0.1)

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again (same port and nodes.conf); it rejoins as a replica of the node
        that took its slots."""
        node.start()
        self.wait_ready()

    def _ok(self, node: ClusterNode) -> bool:
        info = node.ask("CLUSTER", "INFO", timeout=2)
        return "cluster_state:ok" in info and "cluster_slots_ok:16384" in info

    def wait_ready(self, masters: int | None = None, replicas: int | None = None) -> None:
        """Until every running node says the cluster is ok with all 16384 slots served, every
        replica is synced, and the nodes agree on the roles (``masters`` / ``replicas``, if given)."""

        def ready() -> bool:
            running = [n for n in self.nodes if n.running]
            try:
                if not all(self._ok(n) for n in running):
                    return False
                roles = [n.ask("ROLE", timeout=2) for n in running]
                if any(role[0] == "slave" and role[3] != "connected" for role in roles):
                    return False  # a replica still syncing with its master
                views = {
                    frozenset((p[1].split("@")[0], "master" in p[2], "fail" in p[2]) for p in map(str.split, lines))
                    for lines in (n.ask("CLUSTER", "NODES").splitlines() for n in running)
                }
            except redis.RedisError:
                return False
            live = {f"{HOST}:{n.port}" for n in running}
            return (
                len(views) == 1
                and not any(failed for addr, _, failed in next(iter(views)) if addr in live)
                and (masters is None or [r[0] for r in roles].count("master") == masters)
                and (replicas is None or [r[0] for r in roles].count("slave") == replicas)
            )

        wait_for(
            ready,
            READY_TIMEOUT,
            lambda: "the cluster to become ready:\n" + "\n".join(f"{n!r}: {n.log_tail(5)}" for n in self.nodes),
            interval=0.1,
        )

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
