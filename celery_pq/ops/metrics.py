"""Prometheus metrics of celery-pq queues (the ``[ops]`` extra): ``PQCollector`` for an app's own
registry, and ``serve``, the exporter of ``pq metrics``. Every scrape reads Redis afresh; the
counters are the Lua scripts'. docs/operations.md ("Prometheus metrics") lists them."""

from __future__ import annotations

import logging
import socket
import threading
from contextlib import suppress
from http.server import ThreadingHTTPServer
from itertools import pairwise
from typing import TypeAlias

from ..queue.unique import UNIQUE_COUNTS
from ..storage.checks import count
from ..storage.errors import OPS_EXTRA
from ..transport.broker import Broker, queue_and_view, queue_names
from .http_deadline import REQUEST_TIMEOUT_SECONDS, DeadlineHandler

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.exposition import MetricsHandler
    from prometheus_client.registry import Collector
except ImportError as exc:  # the [ops] extra
    raise ImportError(OPS_EXTRA.format(what="celery_pq.ops.metrics")) from exc

logger = logging.getLogger("celery_pq.ops.metrics")

#: Counter name (without ``celery_pq_`` and ``_total``) -> the scripts' counter, and its help.
COUNTERS = {
    "enqueued": ("enqueued", "Entries stored by publishes (and replays)."),
    "deliveries": ("delivered", "Deliveries to consumers (leases granted)."),
    "redeliveries": ("redelivered", "Deliveries of an entry delivered before."),
    "acks": ("acked", "Entries acknowledged (done)."),
    "requeues": ("requeued", "Leases given back by consumers."),
    "lease_expiries": ("lease_expired", "Leases that expired and were reclaimed by the sweep."),
    "dead_letters": ("dead_lettered", "Entries moved to the dead-letter queue."),
    "removed": ("removed", "Waiting entries removed (by id, purge)."),
    "refusals": ("refused_full", "Entries refused because the queue (or tenant) was full."),
    "malformed": ("malformed", "Stored entries that could not be read, set aside as dead letters."),
    "dead_dropped": ("dead_dropped", "Dead letters dropped to keep the dead-letter queue's bound."),
    "expired": ("expired", "Entries past their expiry deadline, never delivered (dead-lettered or dropped)."),
}

#: Gauge name (without ``celery_pq_``) -> its help, and its value from a queue's stats() and the queue.
GAUGES = {
    "waiting_messages": ("Entries waiting for delivery (due, not leased).", lambda s, q: s["waiting"]),
    "delayed_messages": ("Entries waiting for their due time (countdown/eta).", lambda s, q: s["delayed"]),
    "leased_messages": ("Entries delivered and not yet acked.", lambda s, q: s["leased"]),
    "dead_messages": ("Entries in the dead-letter queue <queue>.dead.", lambda s, q: s["dead"]),
    "paused": ("1 while the queue is paused.", lambda s, q: 1 if s.get("paused") else 0),
    "paused_tenants": ("Tenants paused in the queue.", lambda s, q: len(s.get("paused_tenants") or ())),
    "backlog_messages": (
        "Due entries a consumer of the whole queue could take now (tenants held back by caps or pause left out).",
        lambda s, q: q.backlog(),
    ),
    "oldest_waiting_age_seconds": (
        "Age of the entry that goes next (0 when none waits).",
        lambda s, q: s["head_age_seconds"] or 0.0,
    ),
    "unique_keys": (
        "Unique keys held (records of keys; docs/unique.md).",
        lambda s, q: (s.get("unique") or {}).get("keys", 0),
    ),
}

#: Metrics with a second label: name -> (the label, help); ``unique`` and ``tenant_deliveries`` count.
LABELLED = {
    "waiting_messages_by_priority": ("band", "Waiting entries per priority band."),
    "waiting_messages_by_tenant": ("tenant", "Waiting entries per tenant (the largest by name, the rest as 'other')."),
    "leased_messages_by_tenant": ("tenant", "Leased entries per tenant."),
    "unique": (
        "outcome",
        "Publishes with a unique key not stored as they came: merged into the entry standing, "
        "replacing it, debouncing it, or throttled.",
    ),
    "tenant_deliveries": ("tenant", "Deliveries per tenant (the largest by name, the rest as 'other')."),
    "tenant_worker_seconds": (
        "tenant",
        "Seconds of worker time per tenant: its leases held, delivery to ack (queues with fair_cost='time').",
    ),
}

Family: TypeAlias = GaugeMetricFamily | CounterMetricFamily

#: Tenants exported by name per queue by default; the rest are summed as "other".
MAX_TENANTS = 20


def parse_bands(text: str | None) -> list[tuple[int, int]] | None:
    """``"0-99,200-255"`` as [(0, 99), (200, 255)]; None for None or "". ValueError naming the band."""
    if not text:
        return None
    bands: list[tuple[int, int]] = []
    for part in text.split(","):
        lo_text, sep, hi_text = part.strip().partition("-")
        if not sep or not lo_text.strip().isdigit() or not hi_text.strip().isdigit():
            raise ValueError(f"priority band {part.strip()!r} is not LO-HI (e.g. 200-255)")
        lo, hi = int(lo_text), int(hi_text)
        if not 0 <= lo <= hi <= 255:
            raise ValueError(f"priority band {part.strip()!r} must have 0 <= LO <= HI <= 255")
        bands.append((lo, hi))
    bands.sort()
    for (a, b), (c, d) in pairwise(bands):
        if c <= b:
            raise ValueError(f"priority bands {a}-{b} and {c}-{d} overlap")
    return bands


def band_counts(per_priority: dict, bands: list[tuple[int, int]] | None) -> dict[str, int]:
    """Waiting entries per band (``"lo-hi"``, every band) or, without bands, per priority (``"200"``)."""
    if bands is None:
        return {str(p): n for p, n in per_priority.items()}
    out = {f"{lo}-{hi}": 0 for lo, hi in bands}
    for p, n in per_priority.items():
        for lo, hi in bands:
            if lo <= int(p) <= hi:
                out[f"{lo}-{hi}"] += n
                break
    return out


def top_tenants(values: dict[str, int], limit: int) -> dict[str, int]:
    """The ``limit`` largest by name, the rest summed as ``other`` (cardinality stays bounded)."""
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    out = {t or "(default)": n for t, n in ranked[:limit]}
    rest = sum(n for _, n in ranked[limit:])
    if rest or len(ranked) > limit:
        out["other"] = out.get("other", 0) + rest
    return out


class PQCollector(Collector):
    """A collector of celery-pq queues. ``app_or_url``: a Celery app or a broker URL; ``queues``: None
    for every declared queue but Celery's; ``bands``: ``[(lo, hi), ...]`` or ``"0-99,100-255"`` for
    ``..._by_priority`` (None: one series per priority); ``max_tenants``: the rest are ``other``."""

    def __init__(
        self,
        app_or_url,
        queues=None,
        *,
        transport_options: dict | None = None,
        bands=None,
        max_tenants: int = MAX_TENANTS,
    ):
        self.broker = Broker.of(app_or_url, transport_options)
        self.queues = list(queues) if queues else None
        self.bands = parse_bands(bands) if isinstance(bands, str) else bands
        self.max_tenants = count("max_tenants", max_tenants, low=0, none=False)

    def describe(self):
        """The metric names, without reading Redis (for ``registry.register``)."""
        return list(self._families().values())

    def collect(self):
        fams = self._families()
        try:
            with self.broker.channel() as channel:
                for name in queue_names(channel, self.queues):
                    self._add_queue(fams, queue_and_view(channel, name)[0])
            fams["up"].add_metric([], 1)
        except Exception as exc:  # a scrape must answer: say the broker is down, not 500
            logger.warning("celery-pq metrics: cannot read the queues: %s", exc)
            fams = self._families()
            fams["up"].add_metric([], 0)
        return list(fams.values())

    def _families(self) -> dict[str, Family]:
        fams: dict[str, Family] = {
            k: GaugeMetricFamily(f"celery_pq_{k}", doc, labels=("queue",)) for k, (doc, _) in GAUGES.items()
        }
        fams |= {k: CounterMetricFamily(f"celery_pq_{k}", doc, labels=("queue",)) for k, (_, doc) in COUNTERS.items()}
        for k, (label, doc) in LABELLED.items():
            kind = (
                CounterMetricFamily
                if k in ("unique", "tenant_deliveries", "tenant_worker_seconds")
                else GaugeMetricFamily
            )
            fams[k] = kind(f"celery_pq_{k}", doc, labels=("queue", label))
        fams["up"] = GaugeMetricFamily("celery_pq_up", "1 when the last scrape read the queues from Redis.")
        return fams

    def _add_queue(self, fams: dict[str, Family], q) -> None:
        s, counters, name = q.stats(), q.counters(), q.name
        for key, (_, value) in GAUGES.items():
            fams[key].add_metric([name], value(s, q))
        for key, (field, _) in COUNTERS.items():
            fams[key].add_metric([name], counters.get(field, 0))

        def add(key: str, values: dict) -> None:
            for label, n in values.items():
                fams[key].add_metric([name, label], n)

        add("waiting_messages_by_priority", band_counts(s["per_priority"], self.bands))
        for key, field in (("waiting_messages_by_tenant", "waiting"), ("leased_messages_by_tenant", "leased")):
            add(key, top_tenants({t: c[field] for t, c in (s["per_tenant"] or {}).items()}, self.max_tenants))
        add("unique", {outcome: counters.get(f"unique_{outcome}", 0) for outcome in UNIQUE_COUNTS})
        if q.settings.fair:
            rows = q.tenants()
            add(
                "tenant_deliveries",
                top_tenants({t: r["deliveries"] for t, r in rows.items() if r["deliveries"]}, self.max_tenants),
            )
            held = top_tenants({t: r["worker_ms"] for t, r in rows.items() if r.get("worker_ms")}, self.max_tenants)
            add("tenant_worker_seconds", {t: ms / 1000 for t, ms in held.items()})


#: This machine only by default: the page names every queue and tenant (``--address 0.0.0.0``).
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 9808


class _ScrapeServer(ThreadingHTTPServer):
    """A thread per connection, each request within ``request_timeout`` (``http_deadline``)."""

    def __init__(self, address: str, port: int, request_timeout: float, registry: CollectorRegistry):
        info = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = info[0]
        self.request_timeout = float(request_timeout)
        handler = type("_ScrapeHandler", (DeadlineHandler, MetricsHandler), {"registry": registry})
        super().__init__((str(info[4][0]), port), handler)


def serve(
    app_or_url,
    *,
    port: int = DEFAULT_PORT,
    address: str = DEFAULT_ADDRESS,
    block: bool = True,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
    **collector,
):
    """Serve ``/metrics`` on ``address:port`` from a registry of its own with a ``PQCollector(app_or_url,
    **collector)``: with ``block``, until Ctrl-C; otherwise returns the (server, thread) serving."""
    registry = CollectorRegistry()
    registry.register(PQCollector(app_or_url, **collector))
    server = _ScrapeServer(address, port, request_timeout, registry)
    if not block:
        thread = threading.Thread(target=server.serve_forever, name="pq-metrics", daemon=True)
        thread.start()
        return server, thread
    print(f"celery-pq metrics on http://{server.server_address[0]!s}:{server.server_port}/metrics", flush=True)
    with server, suppress(KeyboardInterrupt):
        server.serve_forever()
