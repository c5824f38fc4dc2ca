"""A write's ``rejects`` directory: ``summary.json`` (counts, schema) and ``rejects.jsonl`` (rows
and reasons, values as JSON). Data only: reading it runs no code. docs/spark.md ("Rejected rows")."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
from pathlib import Path

from pyspark.sql import types as T
from pyspark.sql.types import StructType

SUMMARY_FILE = "summary.json"
REJECTS_FILE = "rejects.jsonl"


def write_rejects(path: str, summary: dict, rejects: list, schema_json: str) -> None:
    """Write the ``rejects`` directory: ``summary`` and the schema, and ``rejects`` (rows ending in
    their reason), one JSON list (``json_value``) a line."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    fields = [f.dataType for f in StructType.fromJson(json.loads(schema_json)).fields] + [T.StringType()]
    tmp = out / f".{REJECTS_FILE}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rejects:
            f.write(json.dumps([json_value(t, v) for t, v in zip(fields, row)]) + "\n")
    os.replace(tmp, out / REJECTS_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps({**summary, "schema": json.loads(schema_json)}, indent=1))


def read_rejected_rows(path: str, schema: StructType) -> list[tuple]:
    """The rows of a ``rejects.jsonl`` (``write_rejects``) as tuples of ``schema``'s Python
    values; ValueError naming the file and line for one that is not such a row."""
    types = [f.dataType for f in schema.fields]
    rows = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):  # (bytes: json.loads reads UTF-8, and says where it is not)
            try:
                values = json.loads(line)
                if not isinstance(values, list) or len(values) != len(types):
                    raise ValueError(f"not a list of {len(types)} values")
                rows.append(tuple(value_of_json(t, v) for t, v in zip(types, values)))
            except (ValueError, TypeError, decimal.InvalidOperation) as exc:
                raise ValueError(f"{path}, line {number}: not a rejected row of this schema ({exc})") from None
    return rows


#: Spark's TIME type, where this PySpark has it (4.1 on)
_TIME = tuple(getattr(T, name) for name in ("TimeType",) if hasattr(T, name))


def json_value(t: T.DataType, v):
    """``v``, a value of Spark type ``t`` as PySpark gives it, as JSON: bytes as base64, a decimal
    as its text, dates, times and timestamps in ISO 8601, intervals in microseconds, a map as a
    list of [key, value], a struct as a list; a value of another type as it is."""
    if v is None:
        return None
    if isinstance(t, T.UserDefinedType):
        return json_value(t.sqlType(), t.serialize(v))
    if isinstance(t, T.BinaryType):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(t, T.DecimalType):
        return str(v)
    if isinstance(t, (T.DateType, T.TimestampType, T.TimestampNTZType, *_TIME)):
        return v.isoformat()
    if isinstance(t, T.DayTimeIntervalType):
        return (v.days * 86_400 + v.seconds) * 1_000_000 + v.microseconds
    if isinstance(t, T.ArrayType):
        return [json_value(t.elementType, x) for x in v]
    if isinstance(t, T.MapType):
        return [[json_value(t.keyType, k), json_value(t.valueType, x)] for k, x in v.items()]
    if isinstance(t, T.StructType):
        items = [v.get(f.name) for f in t.fields] if isinstance(v, dict) else v
        return [json_value(f.dataType, x) for f, x in zip(t.fields, items)]
    if isinstance(t, T.VariantType):
        return [base64.b64encode(v.value).decode("ascii"), base64.b64encode(v.metadata).decode("ascii")]
    return v


def value_of_json(t: T.DataType, v):
    """The value of Spark type ``t`` that ``json_value`` wrote as ``v``."""
    if v is None:
        return None
    if isinstance(t, T.UserDefinedType):
        return t.deserialize(value_of_json(t.sqlType(), v))
    if isinstance(t, T.BinaryType):
        return bytearray(base64.b64decode(v, validate=True))
    if isinstance(t, T.DecimalType):
        return decimal.Decimal(v)
    if isinstance(t, T.DateType):
        return datetime.date.fromisoformat(v)
    if isinstance(t, (T.TimestampType, T.TimestampNTZType)):
        return datetime.datetime.fromisoformat(v)
    if isinstance(t, _TIME):
        return datetime.time.fromisoformat(v)
    if isinstance(t, T.DayTimeIntervalType):
        return datetime.timedelta(microseconds=v)
    if isinstance(t, T.ArrayType):
        return [value_of_json(t.elementType, x) for x in v]
    if isinstance(t, T.MapType):
        return {value_of_json(t.keyType, k): value_of_json(t.valueType, x) for k, x in v}
    if isinstance(t, T.StructType):
        return tuple(value_of_json(f.dataType, x) for f, x in zip(t.fields, v))
    if isinstance(t, T.VariantType):
        return T.VariantVal(base64.b64decode(v[0]), base64.b64decode(v[1]))
    return v
