"""One small, flat exception tree; script error codes are mapped here and nowhere else."""

from __future__ import annotations

from enum import IntEnum

from redis.exceptions import ConnectionError as RedisConnectionError


class ErrorCode(IntEnum):
    """Negative integers returned by the Lua scripts (each script's header lists its own)."""

    NOT_FOUND = -1  # no entry with that id
    NOT_LEASED = -2  # the entry is not leased (acked, returned, or never delivered)
    TOKEN_MISMATCH = -3  # the lease was taken over by another delivery
    NOT_WAITING = -4  # the entry is leased, so it cannot be removed or re-prioritised
    QUEUE_FULL = -5  # max_length reached
    STALE_VIEWS = -6  # the caller's list of priority views is out of date: refresh and retry
    TENANT_FULL = -7  # max_length_per_tenant reached
    MODE_MISMATCH = -8  # the queue was made with other settings (fair, scope, order, technique)
    MIGRATING = -9  # the queue's mode is being migrated: nothing was done, retry


#: First word of an error reply carrying a code any script may meet (MODE_MISMATCH, MIGRATING):
#: ``PQ <code> <key> <stored mode> [<caller's mode>]``.
ERROR_REPLY = "PQ"


class PQError(Exception):
    """Base class of every error celery-pq raises."""


class QueueFull(PQError):
    """Publishing to a queue that holds ``max_length`` waiting entries."""

    def __init__(self, queue: str, size: int, limit: int, tenant: str | None = None):
        self.queue, self.size, self.limit, self.tenant = queue, size, limit, tenant
        who, option = ("", "max_length") if tenant is None else (f" for tenant {tenant!r}", "max_length_per_tenant")
        super().__init__(f"queue {queue!r} is full{who}: {size} waiting entries, {option}={limit}")


class LeaseLost(PQError):
    """An ack, requeue or renewal presented a lease that is no longer held."""

    def __init__(self, queue: str, entry_id: str, code: ErrorCode):
        self.queue, self.entry_id, self.code = queue, entry_id, code
        why = {
            ErrorCode.NOT_LEASED: "is not leased any more (its lease expired and it was reclaimed)",
            ErrorCode.TOKEN_MISMATCH: "is leased to another delivery now",
        }.get(code, code.name)
        super().__init__(f"entry {entry_id!r} of queue {queue!r} {why}")


class EntryNotFound(PQError):
    def __init__(self, queue: str, entry_id: str):
        self.queue, self.entry_id = queue, entry_id
        super().__init__(f"queue {queue!r} has no entry {entry_id!r}")


class NotWaiting(PQError):
    def __init__(self, queue: str, entry_id: str):
        self.queue, self.entry_id = queue, entry_id
        super().__init__(f"entry {entry_id!r} of queue {queue!r} is leased, not waiting")


#: The one line a command or module of the ``[ops]`` extra says when the extra is not installed.
OPS_EXTRA = "{what} needs the [ops] extra (prometheus_client): pip install 'celery-pq[ops]'"
OTEL_EXTRA = (
    "{what} needs the [otel] extra (opentelemetry-api, opentelemetry-instrumentation-celery): "
    "pip install 'celery-pq[otel]'"
)


class ConfigError(PQError, ValueError):
    """A transport option or queue setting that cannot work."""


class ModeMismatch(ConfigError):
    """A process uses a queue with another mode (fairness, scope, order, technique) than the one
    recorded on first use; nothing was changed (``PriorityQueue.migrate_mode`` changes it)."""

    def __init__(self, queue: str, stored: dict, wanted: dict):
        self.queue, self.stored, self.wanted = queue, stored, wanted
        diff = ", ".join(
            f"{k}={stored.get(k)!r} (this process: {wanted.get(k)!r})" for k in wanted if stored.get(k) != wanted.get(k)
        )
        super().__init__(
            f"queue {queue!r} was made with {diff}; nothing was changed. Use the "
            f"queue's own settings, or migrate it on purpose (PriorityQueue.migrate_mode)"
        )


class QueueMigrating(PQError, ConnectionError):
    """A call to a queue whose mode is being migrated: nothing done. The queue API retries for up
    to ``C.MIGRATION_WAIT``; a pipeline raises it at once (a connection error to kombu)."""

    def __init__(self, queue: str, mode: dict):
        self.queue, self.mode = queue, mode
        super().__init__(
            f"queue {queue!r} is being migrated to {mode}; nothing was done: retry when the "
            "migration is over (PriorityQueue.migrate_mode finishes it)"
        )


class MessageTooLarge(PQError, ValueError):
    """A message whose stored size passes ``max_message_bytes``; nothing was written."""

    def __init__(self, queue: str, size: int, limit: int):
        self.queue, self.size, self.limit = queue, size, limit
        super().__init__(
            f"message for queue {queue!r} is {size} bytes, over max_message_bytes={limit}; it was not published"
        )


class BrokerUnreachable(PQError, ConnectionError):
    """The broker's Redis did not answer; named by host:port only (a URL may hold a password)."""

    def __init__(self, address: str, reason: str):
        self.address, self.reason = address, reason
        super().__init__(f"cannot reach Redis at {address}: {reason}")


class NotReplicated(PQError):
    """A publish fewer than ``wait_replicas`` replicas acknowledged within ``wait_timeout``: the
    master may hold it and a failover lose it; a retry (same publish id) stores it once."""

    def __init__(self, queue: str, acknowledged: int, wanted: int, timeout: float):
        self.queue, self.acknowledged, self.wanted, self.timeout = queue, acknowledged, wanted, timeout
        super().__init__(
            f"publish to queue {queue!r}: only {acknowledged} of {wanted} replicas acknowledged it "
            f"within {timeout:g}s (wait_replicas={wanted}, wait_timeout={timeout:g}). It may still "
            "be stored on the master, and a failover now may lose it; a retry with the same "
            "publish id stores it once"
        )


def error_for(code: int, queue: str, **context) -> PQError | None:
    """The exception of a script's error code (None for a code >= 0): the one place codes become
    exceptions. ``context``: ``entry_id``, ``size``/``limit``/``tenant``, ``stored``/``wanted``."""
    if code >= 0:
        return None
    c = ErrorCode(code)
    if c in (ErrorCode.NOT_LEASED, ErrorCode.TOKEN_MISMATCH):
        return LeaseLost(queue, context["entry_id"], c)
    if c is ErrorCode.NOT_FOUND:
        return EntryNotFound(queue, context["entry_id"])
    if c is ErrorCode.NOT_WAITING:
        return NotWaiting(queue, context["entry_id"])
    if c in (ErrorCode.QUEUE_FULL, ErrorCode.TENANT_FULL):
        return QueueFull(queue, context["size"], context["limit"], tenant=context.get("tenant"))
    if c is ErrorCode.MODE_MISMATCH:
        return ModeMismatch(queue, context["stored"], context["wanted"])
    if c is ErrorCode.MIGRATING:
        return QueueMigrating(queue, context["stored"])
    return PQError(f"queue {queue!r}: the script answered {c.name}")  # STALE_VIEWS: its caller retries


def raise_for(code: int, queue: str, **context) -> None:
    """Raise ``error_for(code, ...)`` when the code is an error."""
    exc = error_for(code, queue, **context)
    if exc is not None:
        raise exc


class ClusterUnsettled(PQError, RedisConnectionError):
    """A Redis Cluster call still refused after ``cluster_retry_seconds`` (its slot moving, or
    the cluster down); nothing written. A connection error to kombu and Celery (docs/cluster.md)."""

    def __init__(self, key: str | bytes, waited: float, last: BaseException):
        self.key = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        self.waited, self.last = waited, last
        super().__init__(
            f"Redis Cluster: the slot of {self.key!r} did not settle within {waited:.1f}s "
            f"(a resharding or failover still under way; cluster_retry_seconds): {last}"
        )
