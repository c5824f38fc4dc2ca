"""The lease keeper: one thread per connection that renews this process's leases and sweeps
expired ones back to their queues.

It runs beside whatever the process is doing (a solo-pool task can block the main thread for
longer than a lease), so a live process never loses a lease, and dies with the process, so a
killed process's leases run out. Sweeping is throttled in Redis (a guard key per queue), so
however many consumers run, each queue is swept about once per ``sweep_interval``.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic

logger = logging.getLogger(__name__)


class LeaseKeeper(threading.Thread):
    def __init__(self, transport):
        super().__init__(name="celery-pq-lease-keeper", daemon=True)
        self.transport = transport
        self._stopped = threading.Event()
        self._last_error = 0.0
        self.renewals = 0  # extend calls made (for tests and metrics)
        self.sweeps = 0  # reclaim calls that did sweep

    def stop(self):
        self._stopped.set()

    def run(self):
        next_renew = next_sweep = 0.0
        while not self._stopped.is_set():
            channels = self.transport.keeper_channels()
            if channels is None:  # closed, and the retired channels hold nothing more
                self.transport.release_pool()
                return
            tick = 0.25
            if channels:
                renew_every = min(c.renew_interval for c in channels)
                sweep_every = min(c.sweep_interval for c in channels)
                tick = max(0.02, min(renew_every, sweep_every) / 4)
                now = monotonic()
                try:
                    for channel in channels:  # acks deferred to a pop that is not coming soon
                        channel.flush_acks()
                    if now >= next_renew:
                        next_renew = now + renew_every
                        self.renew(channels)
                    if now >= next_sweep:
                        next_sweep = now + sweep_every
                        self.sweep(channels)
                except Exception as exc:  # noqa: BLE001 - keep renewing through Redis restarts
                    if now - self._last_error > 10:
                        self._last_error = now
                        logger.warning("celery-pq lease keeper: %r (will retry)", exc)
            self._stopped.wait(tick)

    def renew(self, channels):
        for channel in channels:
            for queue, pairs in channel.held_leases().items():
                results = channel._queue(queue).extend(pairs, channel.lease_seconds)
                self.renewals += 1
                for (eid, _), ok in zip(pairs, results):
                    if not ok:
                        logger.warning("celery-pq: lease of %s in %r was lost before renewal; it may run again",
                                       eid, queue)

    def sweep(self, channels):
        seen = set()
        for channel in channels:
            for name in channel.active_queues:
                q = channel._queue(name)  # a priority view sweeps the queue it views
                if q.name in seen:
                    continue
                seen.add(q.name)
                result = q.reclaim(guard_seconds=channel.sweep_interval * 0.9)
                if not result["skipped"]:
                    self.sweeps += 1
                while result["more"]:
                    result = q.reclaim()
                if result["returned"] or result["dead"] or result["promoted"]:
                    channel._need_pop = True
