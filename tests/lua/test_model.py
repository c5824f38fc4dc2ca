"""Model-based stateful test: PriorityQueue on a real redis-server against a small reference model.

Hypothesis drives random sequences of operations (insert, insert_many, pop, ack, requeue,
dead_letter, extend, remove, change_priority, expiry and reclaim, promotion of delayed entries,
purge, priority views, corrupt entries) on a queue with a key prefix of its own, and applies each
one to a pure-Python model of the documented semantics (docs/leases.md, docs/fairness.md,
docs/priorities.md, docs/views-and-delays.md). After every step the invariants compare the two:

- each entry is in exactly one state: waiting, delayed, leased, dead or gone (the tables of
  docs/key-layout.md: ``ii``, ``lt``, ``dz``, the tenant order ``te``, the dead-letter queue);
- the counts agree: ``size()``, ``stats()``, ``tenant_stats()``, the dead-letter queue's size;
- the delivery order of every pop matches the model: exact for plain queues (strict priority,
  FIFO within a priority, a returned entry back at its place) and for fair queues (start-time
  fair queueing as in lua/includes/fair.lua: priority first under within_priority, FIFO within
  one tenant and priority, equal-weight tenants in turn, weights, concurrency caps);
- stale lease tokens are refused (ack, extend, requeue, dead_letter), and change nothing;
- every key of the test's prefix carries the queue's hash tag ``{name}``;
- stale pointers stay bounded (docs/leases.md): each rank list holds at most
  ``2 * peak + STALE_SLACK`` pointers, peak being the most entries the queue has held (a list is
  compacted when a push finds it over twice the queue's entries plus 64; removals between pushes
  never lengthen it);
- a consumer that can take work has a wake token waiting.

At the end of every example the queue is drained (delayed entries promoted, leases expired and
reclaimed, everything popped and acked): every entry ends acked, dead or removed, and nothing
is left in the identifier-indexed table.

Running it:

- ``pytest tests/lua/test_model.py``: the bounded CI run (profile ``ci``: 80 examples of up to 40 steps per
  machine, about a minute and a half here once it passes; a failure adds up to 5 minutes of shrinking).
- ``PQ_SOAK_MINUTES=30 pytest tests/lua/test_model.py -m slow`` (``make soak``): every machine in
  turn with many more and longer examples until that many minutes have passed.
- ``PQ_MODEL_SKIP=name,name`` leaves out rules or checks by name (those in SKIPPABLE), to look
  for further failures past a known one. The default runs everything.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from .model.common import SOAK_MINUTES, Session
from .model.fair_machine import CorruptMachine, FairCorruptMachine, FairMachine
from .model.publish_machine import PublishMachine
from .model.queue_machine import QueueMachine
from .model.rate_machine import RateMachine
from .model.unique_machine import UniqueMachine

MACHINES = [QueueMachine, FairMachine, CorruptMachine, FairCorruptMachine, UniqueMachine, RateMachine, PublishMachine]


def run(machine, profile: str) -> None:
    chosen = settings.get_profile(profile)
    examples = getattr(machine, "examples", {}).get(profile)
    if examples:
        chosen = settings(chosen, max_examples=examples)
    steps = getattr(machine, "steps", {}).get(profile)
    if steps:
        chosen = settings(chosen, stateful_step_count=steps)
    run_state_machine_as_test(machine, settings=chosen)


@pytest.mark.timeout(900)  # (a failure shrinks for up to 5 minutes)
@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.__name__)
def test_model(redis_server, machine):
    Session.server = redis_server
    run(machine, "ci")


@pytest.mark.slow
@pytest.mark.timeout(int(SOAK_MINUTES * 60) + 600)
@pytest.mark.skipif(not SOAK_MINUTES, reason="set PQ_SOAK_MINUTES to soak (make soak)")
def test_model_soak(redis_server):
    Session.server = redis_server
    end = time.monotonic() + SOAK_MINUTES * 60
    rounds = 0
    while time.monotonic() < end:
        run(MACHINES[rounds % len(MACHINES)], "soak")
        rounds += 1
