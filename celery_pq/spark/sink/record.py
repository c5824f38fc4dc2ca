"""The streaming sink's record in Redis (a hash per query, fenced by run): per partition of each
micro-batch, the digests of the segments of rows handled and of the one being sent (Redis times).
docs/spark.md ("Each row once, across retries and restarts"), docs/key-layout.md."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ...storage.errors import PQError
from ...storage.keys import sink_record_key

#: Fields of the record that name no micro-batch.
OWNER_FIELD = "owner"
RUN_FIELD_PREFIX = "run:"


class Fenced(PQError):
    """A later run of the streaming query (same checkpoint) took it over: this run sends no more rows."""


def redis_ms(client) -> int:
    """The Redis server's time, Unix milliseconds."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


class RowDigest:
    """The digest of a run of rows, in order (the repr of each row's values)."""

    def __init__(self, rows=()):
        self._h = hashlib.blake2b(digest_size=12)
        for row in rows:
            self.add(row)

    def add(self, row) -> None:
        self._h.update(repr(tuple(row)).encode() + b"\x1e")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


@dataclass
class PartitionState:
    """What one attempt did with one partition: ``segments``, ``(end, digest)`` of each run of
    rows handled, from position 0 in order; ``pending``, ``(end, digest, namespace)`` of the one
    being sent under ``namespace`` (``TaskRows.write_id``) or None; ``ms``, when written (Redis)."""

    segments: list = field(default_factory=list)
    pending: tuple | None = None
    ms: int = 0

    @property
    def handled(self) -> int:
        return self.segments[-1][0] if self.segments else 0

    @property
    def end(self) -> int:
        """The position after the last row handled or being sent."""
        return self.pending[0] if self.pending else self.handled

    def encode(self) -> str:
        segments = ",".join(f"{end}:{digest}" for end, digest in self.segments)
        pending = "" if self.pending is None else "{}:{}:{}".format(*self.pending)
        return f"{self.ms}|{segments}|{pending}"

    @classmethod
    def decode(cls, value: bytes) -> PartitionState:
        ms, segments, pending = value.decode().split("|", 2)
        parts = [part.split(":") for part in filter(None, segments.split(","))]
        state = cls([(int(end), digest) for end, digest in parts], ms=int(ms))
        if pending:
            end, digest, namespace = pending.split(":", 2)
            state.pending = (int(end), digest, namespace)
        return state


class SinkRecord:
    def __init__(self, client, query: str, prefix: str, run: str):
        self.client = client
        self.key = sink_record_key(query, prefix)
        self.run = run

    def _field(self, batch: int, partition: int) -> str:
        return f"{batch}:{partition}:{self.run}"

    def claim(self) -> None:
        """Own the query, or ``Fenced``: a run new to the record takes it over (it started last);
        a known one that finds another owner was fenced off."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.key, OWNER_FIELD)
        pipe.hexists(self.key, RUN_FIELD_PREFIX + self.run)
        owner, known = pipe.execute()
        if owner is not None and owner.decode() == self.run:
            return
        if known:
            self._fenced(owner)
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(self.key, RUN_FIELD_PREFIX + self.run, redis_ms(self.client))
        pipe.hset(self.key, OWNER_FIELD, self.run)
        pipe.execute()

    def _fenced(self, owner) -> None:
        raise Fenced(
            f"celery_pq stream writer: run {self.run} of the query was fenced off: run "
            f"{owner.decode() if owner else '?'} was started later on the same checkpoint and owns its "
            "record (two applications must not run one checkpoint); this run sends no more rows"
        )

    def load(self, batch: int, partition: int) -> PartitionState | None:
        """The state this run wrote at the partition, else the latest one an earlier run wrote."""
        mine = self.client.hget(self.key, self._field(batch, partition))
        if mine is not None:
            return PartitionState.decode(mine)
        states = [
            PartitionState.decode(value)
            for _, value in self.client.hscan_iter(self.key, match=f"{batch}:{partition}:*", count=1000)
        ]
        return max(states, key=lambda s: s.ms, default=None)

    def save(self, batch: int, partition: int, state: PartitionState) -> None:
        """Write this run's state of the partition; ``Fenced`` when another run owns the query."""
        state.ms = redis_ms(self.client)
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.key, OWNER_FIELD)
        pipe.hset(self.key, self._field(batch, partition), state.encode())
        owner, _ = pipe.execute()
        if owner is not None and owner.decode() != self.run:
            self._fenced(owner)

    def prune(self, below: int) -> None:
        """Drop the fields of micro-batches before ``below``."""
        old = [f for f in self.client.hkeys(self.key) if f[:1].isdigit() and int(f.split(b":", 1)[0]) < below]
        if old:
            self.client.hdel(self.key, *old)


class Progress:
    """``write_partition``'s hooks: the digest of the rows since the last segment, and the state
    written before each segment is sent (pending) and after (handled)."""

    def __init__(self, record: SinkRecord, batch: int, partition: int, rows):
        self.record, self.batch, self.partition, self.rows = record, batch, partition, rows
        self.state = PartitionState()
        self.digest = RowDigest()
        self.sending = ""

    def save(self) -> None:
        self.record.save(self.batch, self.partition, self.state)

    def see(self, row) -> None:
        self.digest.add(row)

    def begin(self, end: int) -> None:
        self.sending, self.digest = self.digest.hexdigest(), RowDigest()
        self.state.pending = (end, self.sending, self.rows.write_id)
        self.save()

    def done(self, end: int) -> None:
        self.state.segments.append((end, self.sending))
        self.state.pending = None
        self.save()
