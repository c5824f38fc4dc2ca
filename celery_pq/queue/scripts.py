"""A queue's script calls (``PriorityQueue``'s private ``_scripts``): its keys and script
context, each script's ARGV laid out once (``calls``), running one call or several, and what an
insert call carries (the priority views it wakes, the publish ids answered)."""

from __future__ import annotations

from collections import deque
from typing import Any

import redis

from ..scripts import Layout, get_scripts, signature
from ..storage import constants as C
from ..storage.checks import count as _count
from ..storage.checks import seconds as _seconds
from ..storage.checks import text as _text
from ..storage.connections import NodePipeline, is_cluster
from ..storage.errors import NotReplicated
from ..storage.ids import unique_bytes
from ..storage.keys import dead_queue_name, queue_keys, script_keys, split_dead
from ..storage.records import join_mode
from . import calls
from .calls import ScriptCall
from .running import translate_error, wait_out_migration
from .settings import QueueSettings
from .values import as_text, validate_priority


class AnsweredIds:
    """Publish ids whose inserts have replied (no retry of them can come): the next insert calls
    have the script forget them. Beyond FORGET_PENDING the oldest are left to the window's
    rotation. (A deque: adding and taking are each atomic, no lock.)"""

    def __init__(self) -> None:
        self._ids: deque[bytes] = deque(maxlen=C.FORGET_PENDING)

    def take(self, most: int = C.FORGET_MAX) -> list:
        """Up to ``most`` of them, once FORGET_BATCH are waiting (else none)."""
        ids = self._ids
        if len(ids) < C.FORGET_BATCH:
            return []
        out = []
        try:
            for _ in range(most):
                out.append(ids.popleft())
        except IndexError:  # (fewer than ``most``, or another thread took them)
            pass
        return out

    def add(self, pids) -> None:
        self._ids.extend(pids)


class Scripts:
    """One queue's (or shard's) script calls: ``client``, ``name``, ``settings``, ``keys``."""

    def __init__(self, client: redis.Redis, name: str, settings: QueueSettings):
        if not isinstance(name, str) or not name:
            raise ValueError(f"queue name must be a non-empty string, got {name!r}")
        s = self.settings = settings
        self.client, self.name = client, name
        self.keys = queue_keys(name, s.key_prefix)
        self.is_dead = split_dead(name)[1]
        self.dead_keys = None if self.is_dead else queue_keys(dead_queue_name(name), s.key_prefix)
        technique = C.TECHNIQUE_T if s.fair else s.technique  # (a fair queue's remove is lazy either way)
        self.mode = join_mode(s.fair, s.fair_scope, s.priority_order, technique, s.fair_cost)
        max_dead = s.max_dead_length or s.max_length or 0
        #: The queue context every script but extend takes last (lua/includes/queue.lua); "~"
        #: first on a cluster: the script's slot guard (scripts/runner.py).
        self.context = ("~" if is_cluster(client) else "") + (
            f"{self.mode}|{max_dead}|{int(s.dedupe_seconds * 1000)}|{float(s.tenant_rate or 0):g}"
            f"|{s.event_log}|{C.EXPIRED_POLICIES[s.expired]}"
        )
        self._script_keys: dict[str, tuple[tuple[str, ...], list[str]]] = {}
        self._layouts: dict[str, Layout] = {}
        self._script_of: dict[str, Any] = {}
        self._ranks: dict[int, int] = {}
        self._pop_calls: dict[tuple, tuple] = {}  # pop arguments -> (script, keys, layout), checked
        #: The registry of priority views (rank ranges) inserts wake, and its version.
        self.views: list[tuple[int, int]] = []
        self.views_version = ""
        self.head: tuple[list, Layout] | None = None  # calls.insert_head, made when first needed
        self.answered = AnsweredIds()
        self.last_publish_id: bytes | None = None

    # -- one call -------------------------------------------------------------------------------
    def keys_of(self, script: str, **given: str) -> list[str]:
        """The KEYS of ``script`` (built once per script), ``given`` ones by name in their place."""
        known = self._script_keys.get(script)
        if known is None:
            sig = signature(script)
            names = sig.keys if self.settings.fair else sig.keys[: len(sig.keys) - len(sig.fair_only)]
            known = self._script_keys[script] = (names, script_keys(names, self.keys, self.dead_keys or self.keys))
        if given:
            return [given.get(n, key) for n, key in zip(*known)]
        return known[1]

    def layout(self, name: str) -> Layout:
        got = self._layouts.get(name)
        if got is None:
            got = self._layouts[name] = calls.layout(self, name)
        return got

    def call(self, name: str, keys: list, args: list) -> ScriptCall:
        """One call of script ``name``, to run now (``run``) or with others (``run_calls``)."""
        script = self._script_of.get(name)
        if script is None:  # (the process's scripts never change: looked up once per name)
            script = self._script_of[name] = getattr(get_scripts(self.client), name)
        return ScriptCall(script, keys, args)

    def run(self, name: str, args: list | None = None, *, keys: list | None = None, wait: bool = True, **named):
        """Run script ``name`` now, with ``args`` or the ``named`` ones; during a mode migration
        ``wait_out_migration``, or with ``wait=False`` QueueMigrating at once."""
        args = self.layout(name)(**named) if args is None else args
        script, keys, args = self.call(name, self.keys_of(name) if keys is None else keys, args)

        def once():
            try:
                return script(keys=keys, args=args, client=self.client)
            except redis.ResponseError as exc:
                raise translate_error(exc) from None

        return wait_out_migration(once) if wait else once()

    def check_replicated(self, acked: int | None) -> None:
        s = self.settings
        if acked is not None and acked < s.wait_replicas:
            raise NotReplicated(self.name, acked, s.wait_replicas, s.wait_timeout)

    def pipeline(self, transaction: bool = False):
        """A pipeline on the server that holds the queue's keys."""
        return NodePipeline(self.client, self.keys.entries, transaction)

    # -- priorities and views -------------------------------------------------------------------
    def rank(self, priority: int) -> int:
        """Rank 0 is served first."""
        r = self._ranks.get(priority) if type(priority) is int else None
        if r is None:
            p = validate_priority(priority)
            r = self._ranks[p] = self.priority_of_rank(p)  # (the mapping is its own inverse)
        return r

    def priority_of_rank(self, rank: int) -> int:
        return C.MAX_PRIORITY - rank if self.settings.priority_order == C.HIGHER_FIRST else rank

    def priority_of_score(self, score) -> int:
        return self.priority_of_rank(int(float(score)) >> C.SEQ_BITS)

    def check_view(self, view) -> tuple[int, int]:
        """The rank range of a priority view (None: the whole queue), checked."""
        if view is None:
            return 0, C.MAX_PRIORITY
        if (
            not isinstance(view, (tuple, list))
            or len(view) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in view)
            or not 0 <= view[0] <= view[1] <= C.MAX_PRIORITY
        ):
            raise ValueError(f"view must be a rank range (lo, hi) with 0 <= lo <= hi <= 255, got {view!r}")
        s = self.settings
        if s.fair and s.scope != "P" and tuple(view) != (0, C.MAX_PRIORITY):
            raise ValueError(
                f"view {tuple(view)!r}: priority views need fair_scope='within_priority' on a fair "
                f"queue, and {self.name!r} is fair_scope={s.fair_scope!r}"
            )
        return view[0], view[1]

    def refresh_views(self) -> None:
        """Re-read the registry of priority views (inserts wake the views an entry satisfies)."""
        with self.pipeline() as p:
            p.hkeys(self.keys.views)
            p.get(self.keys.views_version)
            names, version = p.execute()
        self.views = sorted((int(lo), int(hi)) for lo, hi in (as_text(n).split("-") for n in names))
        self.views_version = as_text(version) if version is not None else ""
        self.head = None

    # -- the calls others run together ----------------------------------------------------------
    def insert_call(self, sent: list, forget=(), made="0", unique=None) -> ScriptCall:
        if self.head is None:
            self.head = calls.insert_head(self)
        keys, head = self.head
        return self.call("insert", keys, calls.insert_args(self, head, sent, forget, made, unique))

    def ack_call(self, pairs) -> ScriptCall:
        return self.call("ack", self.keys_of("ack"), self.layout("ack")(*calls.lease_pairs(pairs)))

    def head_call(self, view=None) -> ScriptCall:
        """The call reading the rank and enqueue time of the entry a pop of ``view`` takes first."""
        lo, hi = self.check_view(view)
        return self.call("peek_head", self.keys_of("peek_head"), self.layout("peek_head")(lo=lo, hi=hi))

    def lease_ms(self, lease_seconds) -> int:
        if lease_seconds is None:
            return int(1000 * self.settings.lease_seconds)
        return int(1000 * float(_seconds("lease_seconds", lease_seconds) or 0))

    def pop_call(self, count=1, *, lease_seconds=None, consumer=None, view=None, acks=(), bound=None) -> ScriptCall:
        """A pop, ``acks`` (``(entry id, token)`` pairs) acked first in the same call. ``bound``: the
        worst rank to take (a sharded queue's pop takes only what beats the next shard's head)."""
        # a consumer pops with the same arguments call after call: checked, and laid out, once
        key: tuple | None = (type(count), count, type(lease_seconds), lease_seconds, consumer, view, type(bound), bound)
        try:
            known = self._pop_calls.get(key)  # type: ignore[arg-type]
        except TypeError:  # an unhashable argument: the checks below name it
            known = key = None
        if known is None:
            _count("count", count, none=False)
            lo, hi = self.check_view(view)
            take_hi = hi if bound is None else bound
            if isinstance(take_hi, bool) or not isinstance(take_hi, int) or not 0 <= take_hi <= C.MAX_PRIORITY:
                raise ValueError(f"bound must be a rank 0..255 or None, got {bound!r}")
            wake = {} if view is None else {"wk": self.keys.view_wake(lo, hi)}
            lease_ms = self.lease_ms(lease_seconds)
            if consumer is not None:
                _text("consumer", consumer, forbidden=",")
            name = "pop_fair" if self.settings.fair else "pop"
            known = (
                name,
                self.keys_of(name, **wake),
                calls.pop_layout(self, count, lease_ms, consumer, (lo, hi, take_hi)),
            )
            if key is not None:
                if len(self._pop_calls) >= 64:
                    self._pop_calls.clear()
                self._pop_calls[key] = known
        name, keys, layout = known
        return self.call(name, keys, layout(*calls.lease_pairs(acks), token_base=unique_bytes().hex()))
