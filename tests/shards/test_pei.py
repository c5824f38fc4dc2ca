"""The benchmark's rank-error count (``benchmarks.relaxed.pei_values``), on hand-made stamps."""

from benchmarks.relaxed import pei_values


def test_best_first_deliveries_have_no_rank_error():
    prefill = [(9, b"1:p"), (5, b"2:p"), (5, b"3:p")]
    pops = [(10, 9, b"1:p"), (11, 5, b"2:p"), (12, 5, b"3:p")]
    assert pei_values(prefill, pops, []) == [0, 0, 0]


def test_each_waiting_entry_that_outranks_the_delivered_one_counts():
    prefill = [(9, b"1:p"), (5, b"2:p"), (5, b"3:p")]
    # the younger 5 first (outranked by the 9 and the older 5), then the 9, then the older 5
    pops = [(10, 5, b"3:p"), (11, 9, b"1:p"), (12, 5, b"2:p")]
    assert pei_values(prefill, pops, []) == [2, 0, 0]


def test_an_entry_published_before_a_delivery_counts_and_one_after_does_not():
    prefill = [(1, b"1:p")]
    pubs = [(5, 200, b"5:a"), (20, 255, b"20:b")]
    pops = [(10, 1, b"1:p"), (30, 200, b"5:a"), (31, 255, b"20:b")]
    assert pei_values(prefill, pops, pubs) == [1, 1, 0]
