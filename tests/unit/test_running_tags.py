"""Which delivered messages keep their leases when the connection is lost under a Celery worker
(transport._running_tags): the tasks running now and those handed to the pool, not yet acked."""

from types import SimpleNamespace

from celery.worker import state

from celery_pq import transport


class _Request:
    """The parts of a Celery request the transport reads."""

    def __init__(self, tag, *, handed=False, acknowledged=False):
        self.message = SimpleNamespace(delivery_tag=tag)
        self._apply_result = (lambda: None) if handed else None
        self.acknowledged = acknowledged


def test_running_and_handed_to_the_pool_keep_their_leases_the_others_are_given_back():
    running, handed, waiting, acked = (_Request("run"), _Request("hand", handed=True), _Request("wait"),
                                       _Request("ack", handed=True, acknowledged=True))
    # Given a request a pool process runs (active), one written to the pool whose start is not
    # yet known (reserved, handed), one waiting for a pool slot, and one handed and acked
    state.active_requests.add(running)
    for r in (running, handed, waiting, acked):
        state.reserved_requests.add(r)
    try:
        # Then the running and the handed one keep their leases; the waiting one (which Celery
        # drops at the reconnect) and the acked one do not
        assert transport._running_tags() == {"run", "hand"}
    finally:
        for r in (running, handed, waiting, acked):
            state.reserved_requests.discard(r)
        state.active_requests.discard(running)
