"""A fair queue's tenants (docs/fairness.md): their weights, caps and rates (``configure_tenants``),
their entries and deliveries, which cannot be served now and why; and what the queue recorded
(its mode, pauses and event-log cap)."""

from __future__ import annotations

from ..storage import constants as C
from ..storage.records import split_entry, split_switches, split_tenant_member
from . import calls
from .running import readable_mode
from .scripts import Scripts
from .settings import tenant_setting
from .values import Entry, as_text, escape_tenant, unescape_tenant

#: The start of the fields of the tenants' settings that hold ``task_rate`` limits.
TASK_RATES = f"r:{escape_tenant(C.TASK_TENANT_PREFIX)}"
#: Minutes of held time the ``recent_worker_ms`` of a tenant covers (fair_cost="time").
RECENT_MINUTES = 5


def stored_entries(s: Scripts, eids: list) -> list[Entry | None]:
    """The entries stored under ``eids`` (one HMGET), None for one gone since they were read."""
    values = s.client.hmget(s.keys.entries, eids) if eids else []
    out: list[Entry | None] = []
    for eid, value in zip(eids, values):
        parsed = split_entry(value) if value else None
        out.append(None if parsed is None else calls.entry_of(s, eid, parsed[0].score, value))
    return out


def tenants(s: Scripts) -> dict[str, dict]:
    """{tenant: {"waiting": n, "leased": n, "deliveries": n, "held": why}} of a fair queue's
    tenants with entries, deliveries so far or held back (``held``: None, or ``held_tenants``'s why)."""
    out = {t: {**row, "deliveries": 0, "held": None} for t, row in tenant_stats(s).items()}
    blank = {"waiting": 0, "leased": 0, "deliveries": 0, "held": None}
    for t, n in s.client.hgetall(s.keys.tenant_deliveries).items():
        out.setdefault(unescape_tenant(as_text(t)), dict(blank))["deliveries"] = int(n)
    for t, why in held_tenants(s).items():
        out.setdefault(t, dict(blank))["held"] = why
    return out


def tenant_stats(s: Scripts, *, ages: bool = False) -> dict:
    """{tenant: {"waiting": n, "leased": n}} for tenants with waiting or leased entries; with
    ``ages``, also "next_age_seconds": the age of the entry the tenant gives next. A queue with
    ``fair_cost="time"`` adds, for tenants that held leases, "worker_ms" (ms of leases held so
    far) and "recent_worker_ms" (in the last ``RECENT_MINUTES`` minutes: ``worker_time``)."""
    out: dict = {}
    raw: dict = {}  # tenant: its escaped name
    for field, value in s.client.hgetall(s.keys.tenant_counts).items():
        kind, _, tenant = as_text(field).partition(":")
        row = out.setdefault(unescape_tenant(tenant), {"waiting": 0, "leased": 0})
        raw[unescape_tenant(tenant)] = tenant
        row["waiting" if kind == "n" else "leased"] = int(value)
    if ages and out:
        with s.pipeline() as p:
            for t in raw.values():
                p.zrangebylex(s.keys.tenant_entries, f"[{t}\0", f"({t}\1", start=0, num=1)
            p.time()
            *heads, (now_s, now_us) = p.execute()
        now_ms = int(now_s) * 1000 + int(now_us) // 1000
        members = {name: split_tenant_member(h[0]) if h else None for name, h in zip(raw, heads)}
        eids = {name: m[3] for name, m in members.items() if m}
        entries = dict(zip(eids, stored_entries(s, list(eids.values()))))
        for name, row in out.items():
            entry = entries.get(name)
            row["next_age_seconds"] = (now_ms - entry.enqueued_ms) / 1000 if entry else None
    if s.settings.fair_cost == "time":
        for t, held in worker_time(s).items():
            row = out.setdefault(t, {"waiting": 0, "leased": 0, **({"next_age_seconds": None} if ages else {})})
            row.update(held)
    return out


def worker_time(s: Scripts) -> dict[str, dict[str, int]]:
    """{tenant: {"worker_ms", "recent_worker_ms"}} of a ``fair_cost="time"`` queue: the ms its
    leases were held (delivery to ack, or an expired lease's length), all told and in the last
    ``RECENT_MINUTES`` minutes by the Redis clock (the hash ``th``: docs/key-layout.md)."""
    with s.pipeline() as p:
        p.hgetall(s.keys.tenant_held)
        p.time()
        fields, (now_s, _) = p.execute()
    since = int(now_s) // 60 - RECENT_MINUTES + 1
    out: dict[str, dict[str, int]] = {}
    for field, value in fields.items():
        minute, bar, tenant = as_text(field).partition("|")
        if not bar:
            tenant, minute = minute, ""
        row = out.setdefault(unescape_tenant(tenant), {"worker_ms": 0, "recent_worker_ms": 0})
        if not bar:
            row["worker_ms"] += int(value)
        elif minute.isdigit() and int(minute) >= since:
            row["recent_worker_ms"] += int(value)
    return out


def held_tenants(s: Scripts, held: dict | None = None) -> dict[str, str]:
    """{tenant: why} of a fair queue's tenants that cannot be served now: ``"cap"`` (concurrency),
    ``"rate"`` (waiting for a token) or ``"paused"``. ``held``: ``recorded(s)``, if the caller has it."""
    if not s.settings.fair:
        return {}
    why = {"C": "cap", "R": "rate", "P": "paused"}
    out = {
        unescape_tenant(as_text(t)): why[as_text(state)[:1]]
        for t, state in s.client.hgetall(s.keys.tenant_states).items()
        if as_text(state)[:1] in why
    }
    for t in (held or recorded(s))["paused_tenants"]:
        out[t] = "paused"
    return out


def configure_tenants(
    s: Scripts,
    *,
    weights: dict | None = None,
    concurrency: dict | None = None,
    rate: dict | None = None,
    keep_task_rates: dict | None = None,
) -> None:
    """Per-tenant weight, concurrency cap and rate (a tenant not named gets the default);
    ``keep_task_rates``: the ``task:<name>`` rates to keep, the others removed (None: none removed)."""
    fields: dict[str | bytes, bytes | float | int | str] = {}
    for label, table in (("weights", weights), ("concurrency", concurrency), ("rate", rate)):
        if table is not None and not isinstance(table, dict):
            raise ValueError(f"{label} must be a dict {{tenant: value}}, got {table!r}")
        for tenant, value in (table or {}).items():
            if not isinstance(tenant, str):
                raise ValueError(f"{label}: tenant names are strings, got {tenant!r}")
            fields[f"{label[0]}:{escape_tenant(tenant)}"] = tenant_setting(label, tenant, value)
    if fields:
        s.client.hset(s.keys.tenant_settings, mapping=fields)
    if keep_task_rates is None:
        return
    kept = {f"r:{escape_tenant(t)}" for t in keep_task_rates}
    gone = [
        f for f in map(as_text, s.client.hkeys(s.keys.tenant_settings)) if f.startswith(TASK_RATES) and f not in kept
    ]
    if gone:
        s.client.hdel(s.keys.tenant_settings, *gone)


def recorded(s: Scripts) -> dict:
    """What the queue recorded in Redis: ``mode`` (None before its first use), ``paused`` (the whole
    queue), ``paused_tenants`` (sorted) and ``event_log`` (the event log's cap, 0 when off)."""
    with s.pipeline() as p:
        p.get(s.keys.mode)
        p.hkeys(s.keys.tenant_settings)
        raw, fields = p.execute()
    record = None if raw is None else as_text(raw)
    paused, cap = (False, 0) if record is None else split_switches(record)
    return {
        "mode": None if record is None else readable_mode(record),
        "paused": paused,
        "paused_tenants": sorted(unescape_tenant(as_text(f)[2:]) for f in fields if as_text(f).startswith("p:")),
        "event_log": cap,
    }
