"""A write's ``rejects`` directory is data: ``read_rejects`` reads its rows back as they were, of
every column type, and reads no pickle (a file that would run code when unpickled is refused
as not a row, and runs nothing)."""

from __future__ import annotations

import datetime
import decimal
import json
import pickle
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T

from celery_pq.spark import read_rejects
from celery_pq.spark.sink.rejects import REJECTS_FILE, write_rejects

SCHEMA = T.StructType(
    [
        T.StructField("s", T.StringType()),
        T.StructField("n", T.LongType()),
        T.StructField("x", T.DoubleType()),
        T.StructField("ok", T.BooleanType()),
        T.StructField("raw", T.BinaryType()),
        T.StructField("price", T.DecimalType(12, 4)),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("wait", T.DayTimeIntervalType()),
        T.StructField("tags", T.ArrayType(T.IntegerType())),
        T.StructField("counts", T.MapType(T.IntegerType(), T.StringType())),
        T.StructField("who", T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])),
    ]
)
ROWS = [
    (
        'é\n"x"',
        2**62,
        float("inf"),
        True,
        bytearray(b"\x00\xff\x80"),
        decimal.Decimal("12345678.1234"),
        datetime.date(2026, 12, 4),
        datetime.datetime(2026, 12, 4, 19, 5, 1, 123456),
        datetime.timedelta(days=1, seconds=5, microseconds=7),
        [1, None, 3],
        {1: "one", 2: None},
        Row(id=7, name="n"),
        "not JSON serializable",
    ),
    (None,) * 12 + ("no args",),
]


class Runs:
    """Unpickled, it makes the file ``path``: code run by whoever unpickles it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_rejected_rows_of_every_type_read_back_as_they_were(spark, tmp_path):
    write_rejects(str(tmp_path), {"rows": 3, "rejected": 2}, ROWS, SCHEMA.json())
    # the rows are JSON lines: data, not code
    lines = (tmp_path / REJECTS_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(isinstance(json.loads(line), list) for line in lines)
    summary, df = read_rejects(spark, str(tmp_path))
    assert summary == {"rows": 3, "rejected": 2}
    assert df.columns == [*SCHEMA.fieldNames(), "reason"]
    assert [tuple(r) for r in df.collect()] == ROWS


def test_a_pickle_in_the_rejects_directory_is_not_run(spark, tmp_path):
    # Given a rejects directory whose rows file is a pickle that would run code when loaded
    write_rejects(str(tmp_path), {"rows": 1, "rejected": 1}, ROWS[1:], SCHEMA.json())
    marker = tmp_path / "ran"
    payload = pickle.dumps([Runs(marker)])
    for name in (REJECTS_FILE, "rejects.pickle"):  # (the name the rows file had before)
        (tmp_path / name).write_bytes(payload)
    # When it is read, Then it is refused as not a row, naming the file, and nothing ran
    with pytest.raises(ValueError, match=f"{REJECTS_FILE}, line 1: not a rejected row"):
        read_rejects(spark, str(tmp_path))
    assert not marker.exists()
