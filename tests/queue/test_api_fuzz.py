"""Fuzz test of the public API of PriorityQueue: bad values of every argument.

Each bad value (wrong type, negative, NaN, infinity, huge, empty string, a bool where a number
is wanted, a malformed lease, ...) must give a clear exception (ValueError, TypeError or a
celery_pq.PQError) whose message names the value or the argument, and nothing may be written
to Redis: every key of the test's prefix is compared (DUMP) before and after the call.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_pq import Item, PQError, PriorityQueue

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

nan, inf = math.nan, math.inf


def bad_numbers(*, negative=True, zero=False, fractions=False, none=False, extra=()):
    """Values no count, length or duration accepts; the options add the ones an argument refuses
    (none: None, for the arguments where None does not mean "no limit" or "the default")."""
    out = [st.sampled_from([nan, inf, -inf, True, False, "5", b"5", [1]]), st.sampled_from(list(extra) or [nan])]
    if none:
        out.append(st.none())
    if negative:
        out += [st.integers(max_value=-1), st.floats(max_value=-1e-9, allow_nan=False)]
    if zero:
        out.append(st.just(0))
    if fractions:
        out.append(st.floats(min_value=0.01, max_value=1e6).filter(lambda x: x != int(x)))
    return st.one_of(*out)


bad_id = st.sampled_from(["", 5, 1.5, True, b"bytes", ["x"]])  # None is "a generated id"
bad_text = st.one_of(bad_id, st.none())
bad_priority = st.one_of(
    st.integers(max_value=-1), st.integers(min_value=256), st.floats(), st.booleans(), st.text(max_size=3), st.none()
)
bad_ms = st.one_of(
    st.integers(max_value=-1), st.floats(), st.booleans(), st.text(max_size=3), st.integers(min_value=2**53)
)
bad_lease = st.sampled_from([None, (), ("a",), ("a", "b", "c"), (5, "t"), (None, "t"), "ab", 5, b"ab"])
bad_view = st.sampled_from([(5, 1), (-1, 5), (0, 256), ("a", 5), (1.5, 3), (1,), 5, "0-5", (True, 5)])
bad_table = st.one_of(
    st.sampled_from([[("a", 1)], "a", 5]),
    st.dictionaries(
        st.sampled_from(["a", "b"]), st.sampled_from([0, -1, nan, inf, -inf, True, "2", None, 1e7, 1e-9]), min_size=1
    ),
    st.dictionaries(st.sampled_from([5, b"a", None]), st.just(1), min_size=1),
)


@pytest.fixture
def world(redis_client, make_pq, key_prefix):
    """A queue with waiting entries and one lease, and a snapshot of every key of the prefix."""
    q = make_pq("fz")
    q.insert_many([Item(b"x", 5, f"e{i}") for i in range(3)])
    [lease] = q.pop(1)

    def snapshot():
        keys = sorted(redis_client.scan_iter(match=f"{key_prefix}*", count=1000))
        return {k: redis_client.dump(k) for k in keys}

    return q, lease, snapshot


def refused(world, call, argument: str, value) -> None:
    """call() raises a clear error naming argument or value, and writes nothing."""
    _, _, snapshot = world
    before = snapshot()
    with pytest.raises((ValueError, TypeError, PQError)) as err:
        call()
    msg = str(err.value).lower()
    shown = {repr(value).lower(), str(value).lower()}
    assert argument.lower() in msg or any(s in msg for s in shown), (
        f"{argument}={value!r}: {type(err.value).__name__}({str(err.value)!r}) names neither"
    )
    assert snapshot() == before, f"{argument}={value!r}: the failed call wrote to Redis"


CONSTRUCTOR = {
    "lease_seconds": bad_numbers(zero=True, none=True, extra=[1e300]),
    "max_deliveries": bad_numbers(fractions=True),
    "max_length": bad_numbers(zero=True, fractions=True),
    "tenant_concurrency": bad_numbers(fractions=True),
    "tenant_rate": bad_numbers(),
    "max_length_per_tenant": bad_numbers(fractions=True),
    "dedupe_seconds": bad_numbers(),
    "max_dead_length": bad_numbers(zero=True, fractions=True),
    "technique": st.sampled_from(["X", "", None, 1, "t"]),
    "priority_order": st.sampled_from(["up", "", None, 1]),
    "fair_scope": st.sampled_from(["x", "", None, 1]),
    "fair": st.sampled_from(["yes", "no", 2, 1.5, None]),
    "name": bad_text,
    "key_prefix": bad_text,
}


@pytest.mark.parametrize("argument", sorted(CONSTRUCTOR))
def test_constructor_refuses_bad_values(world, argument):
    q, _, _ = world
    fair = argument in ("tenant_concurrency", "tenant_rate", "max_length_per_tenant", "fair_scope")

    @FUZZ
    @given(value=CONSTRUCTOR[argument])
    def check(value):
        kw = {"name": "fz", "key_prefix": q.settings.key_prefix, "fair": fair, argument: value}

        def call():
            made = PriorityQueue(q.client, kw.pop("name"), **kw)
            made.insert(b"y", 5)  # a queue that was made anyway must not take writes

        refused(world, call, argument, value)

    check()


INSERT = {
    "payload": st.sampled_from([None, 123, 1.5, ["x"], {"a": 1}, True]),
    "priority": bad_priority,
    "id": bad_id,
    "tenant": st.sampled_from([5, 1.5, b"t", True, ["t"]]),
    "delay": bad_numbers(extra=[1e300]),
    "due_ms": bad_ms,
    "publish_id": st.sampled_from(["", b"", 5, 1.5, True, ["x"]]),
}


@pytest.mark.parametrize("argument", sorted(INSERT))
def test_insert_refuses_bad_values(world, argument):
    q, _, _ = world

    @FUZZ
    @given(value=INSERT[argument], bulk=st.booleans())
    def check(value, bulk):
        row = {
            "payload": b"p",
            "priority": 5,
            "id": None,
            "tenant": None,
            "due_ms": None,
            "publish_id": None,
            argument: value,
        }
        if bulk and argument != "delay":
            # insert_many: an Item with the bad value, behind good items
            given = {k: v for k, v in row.items() if v is not None or k == argument}
            refused(world, lambda: q.insert_many([Item(b"ok", 1)] * 1200 + [Item(**given)]), argument, value)
            return
        kw = {k: v for k, v in row.items() if k not in ("payload", "priority") and (v is not None or k == argument)}
        if argument == "delay":
            kw.pop("due_ms", None)
        refused(world, lambda: q.insert(row["payload"], row["priority"], **kw), argument, value)

    check()


def test_insert_many_refuses_malformed_items(world):
    q, _, _ = world

    @FUZZ
    @given(item=st.sampled_from([None, (), (b"x",), b"xy", 5, (b"x", 5, "id"), {"a": 1}]))
    def check(item):
        refused(world, lambda: q.insert_many([Item(b"ok", 1), item]), "item", item)

    check()


POP = {
    "count": bad_numbers(zero=True, fractions=True, none=True),
    "lease_seconds": bad_numbers(extra=[1e300]),
    "consumer": st.sampled_from(["a,b", 5, b"c", ["c"], True]),
    "view": bad_view,
}


@pytest.mark.parametrize("argument", sorted(POP))
def test_pop_refuses_bad_values(world, argument):
    q, _, _ = world

    @FUZZ
    @given(value=POP[argument])
    def check(value):
        refused(world, lambda: q.pop(**{argument: value}), argument, value)

    check()


@pytest.mark.parametrize("op", ["ack", "ack_list", "extend", "requeue", "dead_letter"])
def test_lease_calls_refuse_malformed_leases(world, op):
    q, _, _ = world

    @FUZZ
    @given(value=bad_lease)
    def check(value):
        call = {
            "ack": lambda: q.ack(value),
            "ack_list": lambda: q.ack([value]),
            "extend": lambda: q.extend([value]),
            "requeue": lambda: q.requeue(value),
            "dead_letter": lambda: q.dead_letter(value),
        }[op]
        refused(world, call, "lease", value)

    check()


def test_extend_refuses_bad_lease_seconds(world):
    q, lease, _ = world

    @FUZZ
    @given(value=bad_numbers(extra=[1e300]))
    def check(value):
        refused(world, lambda: q.extend([lease], value), "lease_seconds", value)

    check()


def test_dead_letter_refuses_bad_reasons(world):
    q, lease, _ = world

    @FUZZ
    @given(
        value=st.one_of(
            st.sampled_from(["", None, 5, True, b"r", ["r"]]), st.text(min_size=1, max_size=5).map(lambda s: s + ",")
        )
    )
    def check(value):
        refused(world, lambda: q.dead_letter(lease, value), "reason", value)

    check()


@pytest.mark.parametrize("op", ["remove", "change_priority"])
def test_calls_by_id_refuse_bad_ids(world, op):
    q, _, _ = world

    @FUZZ
    @given(value=bad_text)
    def check(value):
        call = (lambda: q.remove(value)) if op == "remove" else (lambda: q.change_priority(value, 5))
        refused(world, call, "id", value)

    check()


def test_change_priority_refuses_bad_priorities(world):
    q, _, _ = world

    @FUZZ
    @given(value=bad_priority)
    def check(value):
        refused(world, lambda: q.change_priority("e1", value), "priority", value)

    check()


@pytest.mark.parametrize("argument", ["weights", "concurrency", "rate"])
def test_configure_tenants_refuses_bad_tables(world, argument):
    q, _, _ = world

    @FUZZ
    @given(value=bad_table)
    def check(value):
        refused(world, lambda: q.configure_tenants(**{argument: value}), argument, value)

    check()
