"""task_rate at the kombu level (no Celery worker): a limited task's messages are a tenant of
their own, held back by its bucket while the rest of the queue flows; the per-queue form leaves
other queues as they were; a limit taken out of the option is lifted."""

from kombu import Connection, Producer

from celery_pq.queue import QueueSettings, open_queue
from tests.support.tenants import held_tenants, tenant_counts

try:
    from support.consume import drain, make_queue
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import drain, make_queue

SLOW = "proj.tasks.send_email"


def publish(conn, queue, tasks):
    p = Producer(conn.default_channel)
    for i, task in enumerate(tasks):
        p.publish(
            {"i": i, "task": task},
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            declare=[queue],
            headers={"task": task},
        )


def test_a_limited_task_is_held_by_its_bucket_and_the_rest_of_the_queue_flows(url, key_prefix, redis_client):
    # One token per 100 s: a new bucket holds the rate's worth (0.01 of a token), so none goes
    options = {"key_prefix": key_prefix, "task_rate": {SLOW: 0.01}}
    with Connection(url, transport_options=options) as conn:
        q = make_queue()
        publish(conn, q, [SLOW] * 4 + ["proj.tasks.other"] * 5)
        queue = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
        assert {t: s["waiting"] for t, s in tenant_counts(queue).items()} == {"task:" + SLOW: 4, "": 5}
        got = [b["task"] for b, _ in drain(conn, q, 9, timeout=2)]
    assert got == ["proj.tasks.other"] * 5
    assert held_tenants(queue) == {"task:" + SLOW: "rate"}
    assert queue.size() == 4


def test_the_per_queue_form_leaves_other_queues_plain(url, key_prefix, redis_client):
    options = {"key_prefix": key_prefix, "task_rate": {"kq": {SLOW: 5}}}
    with Connection(url, transport_options=options) as conn:
        publish(conn, make_queue("kq"), [SLOW])
        publish(conn, make_queue("other"), [SLOW])
    limited = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
    other = open_queue(redis_client, "other", QueueSettings(key_prefix=key_prefix), declare=False)
    assert limited.settings.fair and limited.peek()[0].tenant == "task:" + SLOW
    assert not other.settings.fair and other.peek()[0].tenant is None


def test_a_limit_taken_out_of_a_consumer_s_options_is_lifted_when_it_consumes_again(url, key_prefix, redis_client):
    before = {"key_prefix": key_prefix, "task_rate": {SLOW: 0.01, "proj.tasks.resize": 3}}
    with Connection(url, transport_options=before) as conn:
        publish(conn, make_queue(), [SLOW])
        drain(conn, make_queue(), 1, timeout=0.3)  # a consumer declares the queue's limits
    queue = open_queue(redis_client, "kq", QueueSettings(key_prefix=key_prefix), declare=False)
    rates = {f for f in redis_client.hkeys(queue.keys.tenant_settings) if f.startswith(b"r:")}
    assert rates == {b"r:task:" + SLOW.encode(), b"r:task:proj.tasks.resize"}
    after = {"key_prefix": key_prefix, "task_rate": {"proj.tasks.resize": 3}}
    with Connection(url, transport_options=after) as conn:
        publish(conn, make_queue(), ["proj.tasks.resize"])  # a producer: lifts nothing
        assert {f for f in redis_client.hkeys(queue.keys.tenant_settings) if f.startswith(b"r:")} == rates
        drain(conn, make_queue(), 1, timeout=0.3)  # a consumer with the new options: declared
    rates = {f for f in redis_client.hkeys(queue.keys.tenant_settings) if f.startswith(b"r:")}
    assert rates == {b"r:task:proj.tasks.resize"}
