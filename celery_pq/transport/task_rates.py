"""Global rate limits by task name (the transport option ``task_rate``): at most N deliveries
per second of a named task from a queue, whichever workers consume it.

Celery's own ``Task.rate_limit`` is a token bucket inside each worker process, so three workers
let three times the rate through. This limit is the fair queue's tenant token bucket, kept in
Redis and taken inside the pop script (``fair.lua``'s ``fair_token``): a message of a limited task
is published under a tenant of its own, ``task:<task name>``, whose rate is the task's, and a pop
that finds that tenant out of tokens parks it and serves the other tenants meanwhile. Nothing
runs on the pop path beyond what a fair queue runs already; a queue no limit names is opened as
before (plain, or fair with ``fair_key``), and its publishes only look the task up in a dict.

The option's two forms (mixed freely; a queue's own entry wins over an every-queue one)::

    task_rate = {"proj.tasks.send_email": 20}               # on every queue
    task_rate = {"emails": {"proj.tasks.send_email": 20}}   # on queue "emails" only

A queue with a limit is a fair queue even without ``fair_key`` (the other messages share the
default tenant). Celery's own queues (remote control, replies, events) and dead-letter queues
take no limit. On a queue of shards every message of a limited task goes to one shard, its
tenant's, whose bucket holds the task's whole rate (docs/rate-limits.md, "Rate limits with
shards").

Who uses it: ``Options`` checks the option (``check``) and gives each queue's tenants their
rates (``on_queue``), which ``open_queue`` makes the queue's ``task_limits``; ``tenants.tenant_of``
looks each published message's task up there.
"""

from __future__ import annotations

from ..queue.values import MAX_RATE, MIN_RATE
from ..storage.constants import TASK_TENANT_PREFIX
from ..storage.errors import ConfigError


def task_tenant(task: str) -> str:
    """The tenant that carries the messages of a limited task."""
    return TASK_TENANT_PREFIX + task


def celery_own_queue(name: str) -> bool:
    """A queue Celery makes for itself (remote control, replies, events): it carries little and
    no task messages, so it keeps one shard and takes no task rate."""
    return name.endswith(".pidbox") or ".reply." in name or name.startswith("celeryev.")


def _rate(label: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_RATE <= value <= MAX_RATE:
        raise ConfigError(
            f"{label} must be a number of deliveries per second from {MIN_RATE:g} to {MAX_RATE:g}, got {value!r}"
        )
    return float(value)


def check(name: str, value) -> dict | None:
    """The option checked: None, or {task: rate} (every queue) and {queue: {task: rate}} entries
    in one dict. ConfigError naming the entry and the value for anything else."""
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


def _rates(value: dict, queue: str) -> dict[str, float]:
    """{task: rate} of the tasks limited on ``queue``: the every-queue entries, then the queue's."""
    if celery_own_queue(queue) or queue.endswith(".dead"):
        return {}
    rates = {task: rate for task, rate in value.items() if not isinstance(rate, dict)}
    own = value.get(queue)
    if isinstance(own, dict):
        rates.update(own)
    return rates


def on_queue(value: dict | None, queue: str) -> dict[str, float]:
    """{tenant: rate} of the tasks limited on ``queue`` (empty when none is): the rates
    ``configure_tenants`` writes to the queue (to each of its shards: a task's messages all go
    to its tenant's shard, whose bucket is then the task's one bucket in the queue)."""
    if not value:
        return {}
    return {task_tenant(task): rate for task, rate in _rates(value, queue).items()}
