"""A priority: checked, ranked by the queue's priority order, and held exactly in a score (no Redis)."""

import pytest

from celery_pq.queue import PriorityQueue, validate_priority
from celery_pq.storage import constants as C


@pytest.mark.parametrize("p", [0, 1, 128, 255])
def test_valid_priorities(p):
    assert validate_priority(p) == p


@pytest.mark.parametrize(
    "p,msg",
    [
        (-1, "out of range"),
        (256, "out of range"),
        (1.0, "integer"),
        ("3", "integer"),
        (None, "integer"),
        (True, "integer"),
    ],
)
def test_invalid_priorities_name_the_value(p, msg):
    with pytest.raises(ValueError, match=msg) as err:
        validate_priority(p)
    assert repr(p) in str(err.value) or str(p) in str(err.value)


def test_score_layout_fits_a_double():
    assert (C.MAX_PRIORITY + 1) * C.SEQ_SPAN <= 2**53


def test_rank_follows_priority_order():
    hi = PriorityQueue(None, "q", priority_order="higher_first")  # no Redis call is made
    lo = PriorityQueue(None, "q", priority_order="lower_first")
    assert hi.rank(255) == 0 and hi.rank(0) == 255
    assert lo.rank(0) == 0 and lo.rank(255) == 255
    assert hi._scripts.priority_of_score(3 * C.SEQ_SPAN + 17) == 252
