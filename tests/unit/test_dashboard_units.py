"""The dashboard's pure parts: the delivery history, the token rule, the checks of an action."""

import pytest

from celery_pq.ops.dashboard import Board, BoardError, DeliveryHistory, Sample
from celery_pq.ops.dashboard.server import MIN_TOKEN_LENGTH, check_token, listens_on_loopback


def test_shares_are_the_differences_over_the_window():
    h = DeliveryHistory(window=60)
    h.add(Sample(0, 100, {"a": 50, "b": 50}))
    h.add(Sample(30, 130, {"a": 70, "b": 60}))
    h.add(Sample(60, 160, {"a": 90, "b": 70, "c": 0}))
    s = h.summary()
    assert s["span_seconds"] == 60
    assert s["delivered"] == 60
    assert s["per_second"] == 1.0
    assert s["tenants"] == {"a": {"deliveries": 40, "share": 40 / 60}, "b": {"deliveries": 20, "share": 20 / 60}}


def test_old_samples_leave_the_window_but_one_stays_at_its_start():
    h = DeliveryHistory(window=10)
    for t in range(0, 101, 2):
        h.add(Sample(t, t, {"a": t}))  # one delivery a second
    assert len(h.samples) <= 10 // 2 + 2
    s = h.summary()
    assert s["span_seconds"] == 10
    assert s["delivered"] == 10
    assert s["tenants"]["a"] == {"deliveries": 10, "share": 1.0}


def test_a_new_tenant_counts_from_zero_and_a_reset_counts_from_its_new_total():
    h = DeliveryHistory(window=60)
    h.add(Sample(0, 500, {"a": 500}))
    h.add(Sample(5, 3, {"a": 1, "new": 2}))  # the queue was deleted and made again
    s = h.summary()
    assert s["delivered"] == 3
    assert s["tenants"] == {"new": {"deliveries": 2, "share": 2 / 3}, "a": {"deliveries": 1, "share": 1 / 3}}


def test_one_sample_or_none_says_nothing_yet():
    h = DeliveryHistory(window=60)
    assert h.summary() == {"span_seconds": 0.0, "delivered": None, "per_second": None, "tenants": {}}
    h.add(Sample(1, 5, {}))
    assert h.summary()["delivered"] is None


def test_samples_must_go_forward():
    h = DeliveryHistory(window=60)
    h.add(Sample(10, 1, {}))
    with pytest.raises(ValueError, match="forward in time"):
        h.add(Sample(9, 2, {}))
    assert len(h.samples) == 1


def test_token_rules():
    assert check_token(None, False) is None
    # beyond loopback a read-only dashboard has a token too (its state needs it)
    assert len(check_token(None, False, loopback=False)) >= MIN_TOKEN_LENGTH
    assert check_token("y" * MIN_TOKEN_LENGTH, False, loopback=False) == "y" * MIN_TOKEN_LENGTH
    assert listens_on_loopback("127.0.0.1") and listens_on_loopback("localhost") and listens_on_loopback("::1")
    assert not listens_on_loopback("0.0.0.0") and not listens_on_loopback("")
    made = check_token(None, True)
    assert len(made) >= MIN_TOKEN_LENGTH and made != check_token(None, True)
    assert check_token("x" * MIN_TOKEN_LENGTH, True) == "x" * MIN_TOKEN_LENGTH
    with pytest.raises(ValueError, match="only used with actions allowed"):
        check_token("x" * 40, False)
    with pytest.raises(ValueError, match=f"at least {MIN_TOKEN_LENGTH}"):
        check_token("short", True)
    with pytest.raises(ValueError, match="printable ASCII"):
        check_token("é" * 20, True)


def _board(opened):
    return Board(lambda: ["q"], lambda name: opened.append(name))


@pytest.mark.parametrize(
    ("action", "request_", "status", "message"),
    [
        ("explode", {"queue": "q"}, 404, "no action 'explode'"),
        ("pause", ["q"], 400, "must be a JSON object"),
        ("pause", {"queue": "q", "color": "red"}, 400, "unknown field"),
        ("pause", {}, 400, "queue must be a non-empty string"),
        ("pause", {"queue": 7}, 400, "queue must be a non-empty string"),
        ("resume", {"queue": "q", "tenant": ""}, 400, "tenant must be a non-empty string"),
        ("pause", {"queue": "q", "ids": ["x"]}, 400, "unknown field"),
        ("replay", {"queue": "q", "tenant": "a"}, 400, "unknown field"),
        ("replay", {"queue": "q"}, 400, "ids must be a list of 1 to 100"),
        ("replay", {"queue": "q", "ids": []}, 400, "ids must be a list of 1 to 100"),
        ("replay", {"queue": "q", "ids": "abc"}, 400, "ids must be a list of 1 to 100"),
        ("replay", {"queue": "q", "ids": ["x"] * 101}, 400, "ids must be a list of 1 to 100"),
        ("replay", {"queue": "q", "ids": ["ok", 3]}, 400, "id must be a non-empty string"),
        ("pause", {"queue": "other"}, 404, "no queue named 'other'"),
    ],
)
def test_a_bad_action_is_refused_before_any_queue_is_opened(action, request_, status, message):
    opened = []
    with pytest.raises(BoardError, match=message) as info:
        _board(opened).act(action, request_)
    assert info.value.status == status
    assert opened == []


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="window must be a number of seconds > 0"):
        Board(lambda: [], lambda n: None, window=0)


class _Totals:
    """A queue's delivery totals as the scripts keep them (counters, and the deliveries of tenants)."""

    def __init__(self):
        self.delivered, self.by_tenant = 0, {}

    def counters(self):
        return {"delivered": self.delivered}

    def tenants(self):
        return {t: {"deliveries": n} for t, n in self.by_tenant.items()}


def test_board_samples_each_queue_and_forgets_a_queue_that_went():
    now, names, queues = [0.0], ["a", "b"], {"a": _Totals(), "b": _Totals()}
    board = Board(lambda: list(names), queues.__getitem__, window=60, clock=lambda: now[0])
    board.sample()
    now[0], queues["a"].delivered, queues["a"].by_tenant = 10.0, 4, {"x": 3, "y": 1}
    board.sample()
    assert board._histories["a"].summary()["tenants"] == {
        "x": {"deliveries": 3, "share": 0.75},
        "y": {"deliveries": 1, "share": 0.25},
    }
    assert board._histories["b"].summary()["delivered"] == 0
    names.remove("b")
    board.sample()
    assert set(board._histories) == {"a"}
