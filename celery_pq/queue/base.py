"""What every layer of a queue stands on: its settings, keys, ranks and script context, and the
running of one script call (``run``).

A queue's layers (``reads``, ``admin``, ``inserts``, ``core``) are each a question asked of
this base; ``calls`` lays out each script's arguments and reads its reply.
"""

from __future__ import annotations

from typing import Any

import redis

from .. import constants as C
from ..connections import NodePipeline, is_cluster
from ..errors import NotReplicated
from ..keys import dead_queue_name, queue_keys, script_keys, split_dead
from ..records import join_mode
from ..scripts import Layout, get_scripts, signature
from . import calls
from .calls import ScriptCall
from .running import readable_mode, run_calls, run_replicated, translate_error, wait_out_migration
from .settings import QueueSettings
from .values import validate_priority


class QueueBase:
    """One queue's context: ``client``, ``name``, ``settings`` (and each setting as an
    attribute), ``keys``, ranks of priorities, the script context, and ``run``."""

    def __init__(self, client: redis.Redis, name: str, settings: QueueSettings | None = None, **given):
        if not isinstance(name, str) or not name:
            raise ValueError(f"queue name must be a non-empty string, got {name!r}")
        if settings is None:
            settings = QueueSettings(**given)
        elif given:
            raise TypeError("give settings or keyword settings, not both")
        self.settings = s = settings.one_shard()
        self.client = client
        self.name = name
        self.key_prefix = s.key_prefix
        #: {tenant ``task:<name>``: rate}: the ``task_rate`` limits a publish follows (``open_queue``)
        self.task_limits: dict[str, float] = {}
        self.fair, self.fair_scope, self.scope = s.fair, s.fair_scope, s.scope
        # None or 0: no cap, no limit
        self.tenant_concurrency, self.tenant_rate = s.tenant_concurrency or 0, float(s.tenant_rate or 0)
        self.max_length_per_tenant = s.max_length_per_tenant or 0
        # a fair queue reports technique T: its remove is lazy either way
        self.technique = C.TECHNIQUE_T if s.fair else s.technique
        self.priority_order = s.priority_order
        self.lease_seconds, self.max_deliveries, self.max_length = s.lease_seconds, s.max_deliveries, s.max_length
        self.dedupe_seconds, self.max_dead_length, self.event_log = s.dedupe_seconds, s.max_dead_length, s.event_log
        #: Inserts and acks return once this many replicas have them (Redis WAIT); 0: off.
        self.wait_replicas, self.wait_timeout = s.wait_replicas, s.wait_timeout
        self.keys = queue_keys(name, s.key_prefix)
        self.is_dead = split_dead(name)[1]
        self._dead_keys = None if self.is_dead else queue_keys(dead_queue_name(name), s.key_prefix)
        self._script_keys: dict[str, tuple[tuple[str, ...], list[str]]] = {}
        self._layouts: dict[str, Layout] = {}  # script -> its ARGV layout (``layout``)
        self._script_of: dict[str, Any] = {}  # script name -> its ``LuaScript`` (``call``)
        #: The registry of priority views (rank ranges) inserts wake, and its version.
        self.views: list[tuple[int, int]] = []
        self.views_version = ""
        self._ranks: dict[int, int] = {}  # priority -> rank, once checked
        self._mode = join_mode(self.fair, self.fair_scope, self.priority_order, self.technique)
        max_dead = self.max_dead_length or self.max_length or 0
        #: The queue context every script but extend takes last (see lua/includes/queue.lua):
        #: its mode gives the scripts fairness, scope and technique;
        #: "~" first on a cluster: the script then checks that its keys' slot is served here
        #: (the slot guard), so that a call that reaches a master just as the queue's hash
        #: slot migrates stops before it writes anything, and is made again (scripts/runner.py).
        self.context = ("~" if is_cluster(client) else "") + (
            f"{self._mode}|{max_dead}|{int(self.dedupe_seconds * 1000)}|{self.tenant_rate:g}|{self.event_log}"
            f"|{C.EXPIRED_POLICIES[s.expired]}"
        )

    @property
    def mode(self) -> dict:
        """This object's mode: the settings a queue records in Redis on first use."""
        return readable_mode(self._mode)

    @property
    def shards(self) -> list:
        """A plain queue is its own single shard."""
        return [self]

    # -- script calls -------------------------------------------------------------------------
    def keys_of(self, script: str, **given: str) -> list[str]:
        """The KEYS of ``script`` for this queue, by the names in its header (built once per
        script); ``given`` puts other keys in by name (a priority view's wake list)."""
        known = self._script_keys.get(script)
        if known is None:
            sig = signature(script)
            names = sig.keys if self.fair else sig.keys[: len(sig.keys) - len(sig.fair_only)]
            known = self._script_keys[script] = (names, script_keys(names, self.keys, self._dead_keys or self.keys))
        if given:
            return [given.get(n, key) for n, key in zip(*known)]
        return known[1]

    def layout(self, name: str) -> Layout:
        """The ARGV layout of script ``name`` for this queue, its own values laid out once
        (``calls.layout``); the builders of ``calls`` fill in the rest."""
        got = self._layouts.get(name)
        if got is None:
            got = self._layouts[name] = calls.layout(self, name)
        return got

    def call(self, name: str, keys: list, args: list) -> ScriptCall:
        """One script call with its ARGV as a builder of ``calls`` laid it out (the queue
        context last), to run now (``run``) or with others (``running.run_calls``)."""
        script = self._script_of.get(name)
        if script is None:  # (the process's scripts never change: looked up once per name)
            script = self._script_of[name] = getattr(self.scripts, name)
        return ScriptCall(script, keys, args)

    def run(self, name: str, args: list, *, keys: list | None = None, wait: bool = True):
        """Run script ``name`` now with ``args`` (and its KEYS for this queue, unless given);
        while the queue's mode is being migrated: ``wait_out_migration``, or with
        ``wait=False`` QueueMigrating at once."""
        script, keys, args = self.call(name, self.keys_of(name) if keys is None else keys, args)

        def once():
            try:
                return script(keys=keys, args=args, client=self.client)
            except redis.ResponseError as exc:
                raise translate_error(exc) from None

        return wait_out_migration(once) if wait else once()

    def run_replicated(self, calls: list) -> tuple[list, int | None]:
        """``run_calls``, followed by WAIT when ``wait_replicas`` is set: (replies, replicas
        that acknowledged them, None when off)."""
        if not self.wait_replicas:
            return run_calls(self.client, calls), None
        return run_replicated(self.client, calls, self.wait_replicas, self.wait_timeout)

    def check_replicated(self, acked: int | None) -> None:
        if acked is not None and acked < self.wait_replicas:
            raise NotReplicated(self.name, acked, self.wait_replicas, self.wait_timeout)

    def _pipeline(self, transaction: bool = False):
        """A pipeline of this queue's reads (TIME among them, or in MULTI) on the server that
        holds its keys: on a cluster, the master serving its hash tag."""
        return NodePipeline(self.client, self.keys.entries, transaction)

    @property
    def scripts(self):
        return get_scripts(self.client)

    # -- priorities ---------------------------------------------------------------------------
    def rank(self, priority: int) -> int:
        """Rank 0 is served first."""
        r = self._ranks.get(priority) if type(priority) is int else None
        if r is None:
            p = validate_priority(priority)
            r = self._ranks[p] = C.MAX_PRIORITY - p if self.priority_order == C.HIGHER_FIRST else p
        return r

    def priority_of_rank(self, rank: int) -> int:
        return C.MAX_PRIORITY - rank if self.priority_order == C.HIGHER_FIRST else rank

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
        if self.fair and self.scope != "P" and tuple(view) != (0, C.MAX_PRIORITY):
            raise ValueError(
                f"view {tuple(view)!r}: priority views need fair_scope='within_priority' on a fair "
                f"queue, and {self.name!r} is fair_scope={self.fair_scope!r}"
            )
        return view[0], view[1]
