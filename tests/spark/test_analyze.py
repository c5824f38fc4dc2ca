"""analyze(): the rank error's one ordered pass against its definition, and every DataFrame of a
real run's event log against figures computed here from the same log."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest
from pyspark.sql import Row

from celery_pq.spark import analyze
from celery_pq.spark.events.analysis import choose_window_ms, rank_errors
from tests.support.events import real_run


def rank_errors_by_definition(events):
    """For each delivery, replay every other entry's events before it: waiting (enqueued and not
    delayed, due, requeued or expired; not since delivered, removed or dead) with a smaller rank?"""
    events = list(events)
    delayed = {e[1] for e in events if e[0] == "due"}
    out = []
    for i, (event, eid, rank, tenant, ms, sid) in enumerate(events):
        if event != "deliver":
            continue
        state, ranks = {}, {}
        for ev, other, r, *_ in events[:i]:
            if r is not None:
                ranks[other] = r
            if ev == "enqueue":
                state[other] = other not in delayed
            elif ev in ("requeue", "expire", "due"):
                state[other] = True
            elif ev in ("deliver", "remove", "dead"):
                state[other] = False
        waiting = [o for o, w in state.items() if w and o != eid]
        out.append((eid, sid, ms, tenant, rank, sum(ranks[o] < rank for o in waiting), len(waiting)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_rank_error_pass_matches_its_definition(seed):
    rnd = random.Random(seed)
    events, state, rank_of = [], {}, {}
    for step in range(400):
        eid = f"e{rnd.randrange(60)}"
        kind = rnd.choice(
            [
                "enqueue",
                "enqueue",
                "deliver",
                "deliver",
                "ack",
                "requeue",
                "expire",
                "remove",
                "dead",
                "reprioritize",
                "due",
            ]
        )
        if kind == "enqueue" and eid in state:
            continue
        if kind != "enqueue" and eid not in state:
            continue
        rank = rank_of.setdefault(eid, rnd.randrange(256))
        if kind == "reprioritize":
            rank = rank_of[eid] = rnd.randrange(256)
        state[eid] = kind
        events.append((kind, eid, rank, "t", step, f"{step}-0"))
    assert rank_errors(events) == rank_errors_by_definition(events)


def test_rank_error_counts_only_strictly_better_waiting_entries():
    ev = [
        ("enqueue", "x", 5, "", 1, "1-0"),
        ("enqueue", "y", 5, "", 2, "2-0"),
        ("enqueue", "z", 2, "", 3, "3-0"),
        ("enqueue", "d", 0, "", 4, "4-0"),
        ("due", "d", 0, "", 9, "9-0"),  # delayed: not waiting before due
        ("deliver", "x", 5, "", 5, "5-0"),
        ("deliver", "z", 2, "", 6, "6-0"),
    ]
    ev.sort(key=lambda e: e[4])
    # x (rank 5) passes over z (rank 2); y has the same rank; d is not due yet. z passes over nobody.
    assert [(r[0], r[5], r[6]) for r in rank_errors(ev)] == [("x", 1, 2), ("z", 0, 1)]


def test_window_length_is_round_and_gives_at_most_60_windows():
    assert choose_window_ms(0) == 100
    assert choose_window_ms(59_000) == 1_000
    assert choose_window_ms(61_000) == 2_000
    assert choose_window_ms(3_600_000) == 60_000


def deliveries_frame(spark, tenants_ranks, gap_after=None):
    """Deliveries 1 ms apart (10 s apart after the first ``gap_after``)."""

    def ms(n):
        return 1000 + n + (10_000 if gap_after is not None and n >= gap_after else 0)

    rows = [
        Row(
            event="deliver",
            queue="q",
            id=f"i{n}",
            priority=255 - rank,
            rank=rank,
            tenant=t,
            consumer="c",
            task=None,
            deliveries=1,
            reason=None,
            ts=None,
            ms=ms(n),
            sid=f"{ms(n)}-0",
        )
        for n, (t, rank) in enumerate(tenants_ranks)
    ]
    return spark.createDataFrame(
        rows,
        schema="event string, queue string, id string, priority int, rank int, "
        "tenant string, consumer string, task string, deliveries int, reason string, "
        "ts timestamp, ms bigint, sid string",
    )


def test_jain_index_and_shares_per_window(spark):
    # window 1 (rank 254 only): a gets 3, b 1. window 2: a and b share rank 0 equally; c alone at
    # rank 5 gets 2: unequal overall, fair within each rank
    df = deliveries_frame(spark, [(t, 254) for t in "aaab"] + [("a", 0), ("b", 0), ("c", 5), ("c", 5)], gap_after=4)
    out = analyze(df, window_seconds=10)
    first, second = out["fairness"].orderBy("bucket").collect()
    assert (first.tenants, first.deliveries) == (2, 4)
    assert first.jain == pytest.approx(16 / (2 * (9 + 1)))
    assert first.jain_within_rank == pytest.approx(first.jain)  # one rank: the same
    assert (second.tenants, second.deliveries) == (3, 4)
    assert second.jain == pytest.approx(16 / (3 * 6))
    assert second.jain_within_rank == pytest.approx(1.0)
    shares = {(r.bucket - first.bucket, r.tenant): r.share for r in out["share"].collect()}
    assert shares == {(0, "a"): 0.75, (0, "b"): 0.25, (1, "a"): 0.25, (1, "b"): 0.25, (1, "c"): 0.5}
    # weights 3:1 make the first window exactly fair
    weighted = analyze(df, window_seconds=10, weights={"a": 3})["fairness"].orderBy("bucket").first()
    assert weighted.jain == pytest.approx(1.0)


def test_bad_arguments_are_named(spark):
    df = spark.createDataFrame([Row(event="ack", queue="q")])
    with pytest.raises(ValueError, match="events has no column 'id'"):
        analyze(df)


def test_real_run_figures(spark, redis_server, redis_client, key_prefix):
    # Given: a real queue's run with its event log on, read back through the data source
    q = real_run(redis_client, key_prefix)
    log = q.events()
    df = (
        spark.read.format("celery_pq_events")
        .option("broker", redis_server.url)
        .option("queue", q.name)
        .option("key_prefix", key_prefix)
        .load()
    )
    out = analyze(df, window_seconds=0.5)

    # Then: the counts are the log's
    kinds = Counter(e["e"] for e in log)
    [s] = out["summary"].collect()
    assert (s.events, s.enqueued, s.delivered, s.acked, s.requeued, s.expired, s.dead, s.removed) == (
        len(log),
        kinds["enqueue"],
        kinds["deliver"],
        kinds["ack"],
        kinds["requeue"],
        kinds["expire"],
        kinds["dead"],
        kinds["remove"],
    )
    assert kinds["deliver"] > 300 and kinds["expire"] == 3 and kinds["requeue"] == 2 and kinds["dead"] >= 1

    # the waits: enqueue -> first delivery of each entry
    enq, first = {}, {}
    for e in log:
        if e["e"] == "enqueue":
            enq.setdefault(e["id"], (e["ms"], e["t"]))
        elif e["e"] == "deliver":
            first.setdefault(e["id"], e["ms"])
    entries = {r.id: r for r in out["entries"].collect()}
    assert {i for i, r in entries.items() if r.wait_ms is not None} == set(first)
    assert all(entries[i].wait_ms == first[i] - enq[i][0] for i in first)

    # the shares per tenant and the redeliveries
    per_tenant = Counter(e["t"] for e in log if e["e"] == "deliver")
    waits = {r.tenant: r for r in out["waits"].collect()}
    assert {t: r.deliveries for t, r in waits.items()} == dict(per_tenant)
    assert sum(r.share for r in waits.values()) == pytest.approx(1.0)
    redel = {r.tenant: r for r in out["redeliveries"].collect()}
    assert sum(r.redeliveries for r in redel.values()) == sum(1 for e in log if e["e"] == "deliver" and e["n"] > 1)
    [dead] = [r for r in out["dead"].collect() if r.reason == "bad_input"]
    assert dead.tenant in "abc"

    # the rank error of every delivery, by its definition
    expected = rank_errors_by_definition((e["e"], e["id"], e["k"], e["t"], e["ms"], e["sid"]) for e in log)
    got = sorted((r.id, r.sid, r.ms, r.tenant, r.rank, r.rank_error, r.waiting) for r in out["rank_error"].collect())
    assert got == sorted(expected)
    assert any(r[5] > 0 for r in got)  # tenant_first passes over better ranks of other tenants

    # Jain's index is within its bounds in every window, and throughput adds up
    for r in out["fairness"].collect():
        assert r.jain is None or 1 / r.tenants - 1e-9 <= r.jain <= 1 + 1e-9
    assert sum(r.acked for r in out["throughput"].collect()) == kinds["ack"]
    per_window = defaultdict(int)
    for r in out["share"].collect():
        per_window[r.bucket] += r.deliveries
    assert sum(per_window.values()) == kinds["deliver"]


def test_an_empty_log_gives_empty_frames_and_an_empty_report(spark):
    from celery_pq.spark.events.report import build_report
    from celery_pq.spark.events.source import SCHEMA

    empty = spark.createDataFrame([], SCHEMA)
    out = analyze(empty)
    assert all(df.count() == 0 for df in out.values())
    assert "The event log is empty." in build_report(empty).html
