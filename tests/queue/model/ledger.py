"""Every publish accounted for: each publish's outcome and the entry that stands for it, and
each entry's fate (delivered and acked, dead, expired, removed, replaced, debounced).

The machines add a row per publish (``published``) and a fate per entry that leaves the queue
(``ended``); ``unaccounted`` lists the publishes whose standing entry has neither a fate nor a
place among the live entries. ``events_account`` reads the queue's own event log at the end of
an example: every entry it stored ends exactly once, and every merged or throttled publish
names an entry it stored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: What a publish may come to (docs/unique.md, docs/publishing.md); "repeat": a resend of a
#: publish id already stored, told the entry stored then.
KINDS = ("stored", "merged", "replaced", "debounced", "throttled", "repeat")
#: The ends an entry may come to.
FATES = ("acked", "dead", "expired", "removed", "replaced", "debounced", "purged")
#: The event-log events that end an entry (docs/events.md); "dead" covers expired ones.
ENDING_EVENTS = ("ack", "dead", "remove", "replaced", "debounced")


@dataclass
class Ledger:
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # (what, kind, standing entry)
    fates: dict[str, str] = field(default_factory=dict)  # entry id (of its queue) -> fate

    def published(self, what: str, kind: str, standing: str) -> None:
        assert kind in KINDS, kind
        self.rows.append((what, kind, standing))

    def ended(self, eid: str, fate: str) -> None:
        assert fate in FATES, fate
        assert eid not in self.fates, f"{eid!r} ended twice: {self.fates[eid]}, then {fate}"
        self.fates[eid] = fate

    def reborn(self, eid: str) -> None:
        """An id that ended is stored again (a replay, a free id taken by a new publish)."""
        self.fates.pop(eid, None)

    def unaccounted(self, live: set[str]) -> list[tuple[str, str, str]]:
        return [row for row in self.rows if row[2] not in live and row[2] not in self.fates]


def events_account(events: list[dict]) -> None:
    """The event log of one queue (nothing trimmed): each enqueued entry ends at most once per
    enqueue, and each merged or throttled event names an entry enqueued before it."""
    enqueued: Counter = Counter()
    ended: Counter = Counter()
    for e in events:
        kind, eid = e["e"], e["id"]
        if kind == "enqueue":
            enqueued[eid] += 1
        elif kind in ("merged", "throttled"):
            assert enqueued[eid], f"{kind} into {eid!r}, never enqueued"
        elif kind in ENDING_EVENTS and not (kind == "remove" and e.get("r") == "dead_dropped"):
            ended[eid] += 1
            assert ended[eid] <= enqueued[eid], f"{eid!r} ended ({kind}) more often than it was enqueued"
