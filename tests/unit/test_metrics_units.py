"""The pure parts of celery_pq.ops.metrics: priority bands and the tenant cardinality cap."""

import pytest

from celery_pq.ops.metrics import band_counts, parse_bands, top_tenants


def test_bands_parse_and_sort():
    assert parse_bands("200-255, 0-99,100-199") == [(0, 99), (100, 199), (200, 255)]
    assert parse_bands(None) is None and parse_bands("") is None


@pytest.mark.parametrize(
    "text, why",
    [
        ("0-99,50-120", "overlap"),
        ("5", "not LO-HI"),
        ("a-b", "not LO-HI"),
        ("10-300", "0 <= LO <= HI <= 255"),
        ("9-3", "0 <= LO <= HI <= 255"),
    ],
)
def test_bad_bands_are_named(text, why):
    with pytest.raises(ValueError, match=why):
        parse_bands(text)


def test_band_counts_cover_every_band():
    per = {255: 2, 200: 1, 7: 4}
    assert band_counts(per, [(0, 99), (100, 199), (200, 255)]) == {"0-99": 4, "100-199": 0, "200-255": 3}
    assert band_counts(per, None) == {"255": 2, "200": 1, "7": 4}


def test_top_tenants_sums_the_rest_as_other():
    values = {"a": 5, "b": 9, "c": 1, "d": 1, "": 7}
    assert top_tenants(values, 2) == {"b": 9, "(default)": 7, "other": 7}
    assert top_tenants(values, 10) == {"b": 9, "(default)": 7, "a": 5, "c": 1, "d": 1}
    assert top_tenants({"a": 1}, 0) == {"other": 1}
