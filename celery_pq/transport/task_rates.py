"""The transport option ``task_rate``: at most N deliveries per second of a named task from a queue, its
messages under a tenant of their own, ``task:<name>``, whose token bucket the fair pop honours. docs/rate-limits.md."""

from __future__ import annotations

from ..queue.values import MAX_RATE, MIN_RATE
from ..storage.constants import TASK_TENANT_PREFIX
from ..storage.errors import ConfigError


def task_tenant(task: str) -> str:
    return TASK_TENANT_PREFIX + task


def celery_own_queue(name: str) -> bool:
    """A queue Celery makes for itself (remote control, replies, events): one shard, no task rate."""
    return name.endswith(".pidbox") or ".reply." in name or name.startswith("celeryev.")


def _rate(label: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_RATE <= value <= MAX_RATE:
        raise ConfigError(
            f"{label} must be a number of deliveries per second from {MIN_RATE:g} to {MAX_RATE:g}, got {value!r}"
        )
    return float(value)


def check(name: str, value) -> dict | None:
    """None, or one dict of {task: rate} (all queues) and {queue: {task: rate}} (the queue's wins); else ConfigError."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(
            f"{name} must be a dict {{task name: deliveries per second}} or {{queue: {{task name: ...}}}}, got {value!r}"
        )
    out: dict = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{name}: task and queue names are non-empty strings, got {key!r}")
        if isinstance(v, dict):
            if celery_own_queue(key) or key.endswith(".dead"):
                raise ConfigError(
                    f"{name}: queue {key!r} is Celery's own or a dead-letter queue and takes no task rate"
                )
            for task, rate in v.items():
                if not isinstance(task, str) or not task:
                    raise ConfigError(f"{name}[{key!r}]: task names are non-empty strings, got {task!r}")
                out.setdefault(key, {})[task] = _rate(f"{name}[{key!r}][{task!r}]", rate)
        else:
            out[key] = _rate(f"{name}[{key!r}]", v)
    return out


def on_queue(value: dict | None, queue: str) -> dict[str, float]:
    """{tenant: rate} of the tasks limited on ``queue`` (the every-queue entries, then the queue's)."""
    if not value or celery_own_queue(queue) or queue.endswith(".dead"):
        return {}
    rates = {task: rate for task, rate in value.items() if not isinstance(rate, dict)}
    own = value.get(queue)
    rates.update(own if isinstance(own, dict) else {})
    return {task_tenant(task): rate for task, rate in rates.items()}
