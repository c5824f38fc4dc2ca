"""Model-based stateful tests: queues on a real redis-server against reference models of the
documented behaviour, every feature together. The machines, their models and checks live in
tests/queue/model/ (its __init__ lists the modules); this file runs them.

QueueMachine, FairMachine, CorruptMachine, FairCorruptMachine (queue_machine.py, queue_checks.py,
fair_machine.py): one queue through the queue API (insert, insert_many, pop, ack, requeue,
dead_letter, extend, remove, change_priority, expiry and reclaim, promotion of delayed entries,
purge, priority views, corrupt entries, retried publish ids, the mode record), plain (both
orders, techniques T and S) and fair (both scopes, weights, caps; fair_cost tasks, declared and
time, each lease made to have been held a chosen time), against docs/leases.md,
docs/fairness.md, docs/priorities.md, docs/views-and-delays.md. After every step: each entry in
exactly one state (``ii``, ``lt``, ``dz``, ``te``, the dead-letter queue); the counts
(``size``, ``stats``, ``tenants``); the delivery order of every pop, exact (strict priority,
FIFO, a returned entry back at its place; start-time fair queueing as lua/includes/fair.lua);
a fair queue's virtual times, finish tags and running averages (``fv``), and by time the ms
charged (``th``);
stale tokens refused; every key under the queue's hash tag; stale pointers bounded
(``2 * peak + STALE_SLACK`` per rank list); a wake token for work that can be taken. At the end
of each example the queue is drained, the event log agrees with the counters.

UniqueMachine (unique_machine.py): unique keys in all five modes (docs/unique.md) through kombu
publishes with Celery's headers, fresh and fixed task ids and retries (``retries``), with pops,
acks, requeues, dead letters and replay, leases running out, removes by entry and task id under
both techniques, a period passing and a Redis clock step back (clock.py moves the stored times).
Checks: each publish's outcome and the entry it names; the entries and the delivery order; every
publish accounted for (ledger.py: stored and then acked, dead or removed, or merged, replaced,
debounced or throttled naming the entry that stands for it; at the end, the event log ends each
entry once); each key record and holder exactly the model's, a throttle record gone after its
period and the next sweep; the keys dead letters keep.

RateMachine (rate_machine.py): task and tenant rates, a weight and a cap, on a queue of one to
three shards (docs/rate-limits.md, docs/relaxed.md): no rated tenant delivered more than
max(N, 1) + N * w times in any window of w seconds over all shards (from the event logs), caps
held, everything delivered within its rates' time, a clock step back costing one period at most,
and a second process opening the queue with fewer or disagreeing options told at open and
changing none of the queue's stored settings (docs/settings.md).

PublishMachine (publish_machine.py): kombu publishes routed to one, two or three queues, each
sent again as kombu's retry sends it after lost replies (stored once in each queue), with short
and long expiry (an expired entry is dead-lettered by the pop that reaches it, never delivered),
dead letters, leases running out and removes.

Running it:

- ``pytest tests/queue/test_model.py``: the bounded CI run (profile ``ci``: 80 examples of up to 40
  steps for the queue machines, fewer for the others, the ``examples``/``steps`` of each machine;
  about two minutes here once it passes; a failure adds up to 5 minutes of shrinking).
- ``test_model_case`` replays the steps of each failure a soak found (model/cases/*.txt, cut
  down by hand, first line saying what it found and what fixed it).
- ``PQ_SOAK_MINUTES=30 pytest tests/queue/test_model.py -m slow`` (``make soak``): every machine in
  turn with many more and longer examples until that many minutes have passed.
- ``PQ_MODEL_SKIP=name,name`` leaves out rules or checks by name (those in model/common.py's
  SKIPPABLE, each naming the defect it hides), to look past a known failure. Unset, the names in
  KNOWN_DEFECTS are left out (defects found whose fixes have not landed: none now);
  ``PQ_MODEL_SKIP=`` runs everything.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from .model.common import SOAK_MINUTES, Session
from .model.fair_machine import CorruptMachine, FairCorruptMachine, FairMachine
from .model.publish_machine import PublishMachine
from .model.queue_machine import QueueMachine
from .model.rate_machine import RateMachine
from .model.unique_machine import UniqueMachine

CASES = sorted((Path(__file__).parent / "model" / "cases").glob("*.txt"))
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


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_model_case(redis_server, case):
    """The steps of a failure a soak found, cut down and kept (model/cases/*.txt), replayed."""
    Session.server = redis_server
    names = {m.__name__: m for m in MACHINES}
    exec(case.read_text(), names)  # our own files of machine steps
    names["state"].teardown()


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
