"""``pq export-events QUEUE --out DIR``: the event log appended to Parquet files (pyarrow, no Spark),
resumable without a repeat, one run at a time. docs/spark.md ("Exporting to Parquet without Spark")."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from urllib.parse import quote, unquote

from ...storage.constants import KEY_PREFIX
from .log import COLUMNS, check_gap, events_key, parse_sid, queue_names, row, scan, stream_info, stream_queues, trimmed

OFFSETS = "_offsets.json"
LOCK = ".lock"  # held (flock) while a run writes: one export at a time per directory
#: Events per Parquet file at most (a file per export step and queue otherwise).
ROWS_PER_FILE = 200_000


class ExportBusy(RuntimeError):
    """Another export is writing to the same directory."""


@dataclass
class ExportResult:
    out: Path
    exported: dict[str, int] = field(default_factory=dict)  # queue -> events written this run
    offsets: dict[str, dict] = field(default_factory=dict)  # queue -> {"sid": last exported id, "n": its position}
    files: list[Path] = field(default_factory=list)  # files written this run
    gaps: list[str] = field(default_factory=list)  # warnings: events trimmed before export


def _parse_part(name: str) -> tuple[str, dict] | None:
    """``part-<queue>-<ms>-<seq>-<position>.parquet`` -> (queue, {"sid", "n"}), or None."""
    if not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    try:
        queue, ms, seq, n = name[len("part-") : -len(".parquet")].rsplit("-", 3)
        return unquote(queue), {"sid": f"{int(ms)}-{int(seq)}", "n": int(n)}
    except ValueError:
        return None


def read_offsets(out: Path) -> dict[str, dict]:
    """The last exported event of each queue, ``{"sid": stream id, "n": position}``: from the offsets
    file, or from a later file's name (a run stopped between writing the file and the offsets)."""
    offsets: dict[str, dict] = {}
    path = out / OFFSETS
    if path.exists():
        try:
            data = json.loads(path.read_text())
            offsets = {str(q): {"sid": str(o["sid"]), "n": int(o["n"])} for q, o in data["offsets"].items()}
            for o in offsets.values():
                parse_sid(o["sid"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{path} is not an offsets file of export-events ({exc!r}); move it away to export from the start"
            ) from None
    parts = (_parse_part(entry.name) for entry in out.iterdir()) if out.is_dir() else ()
    for queue, o in filter(None, parts):
        if queue not in offsets or parse_sid(o["sid"]) > parse_sid(offsets[queue]["sid"]):
            offsets[queue] = o
    return offsets


def export_events(
    client,
    queues,
    out,
    *,
    key_prefix: str = KEY_PREFIX,
    on_gap: str = "warn",
    rows_per_file: int = ROWS_PER_FILE,
    shards=1,
) -> ExportResult:
    """Append the events of ``queues`` (a name, a comma-separated list or a list) logged since the
    last export to the Parquet directory ``out``. ``shards`` (a count, or a function of a name):
    every shard's stream is exported, with its own files and offset. ``ExportBusy``, ValueError."""
    names = stream_queues(queue_names(",".join(queues) if isinstance(queues, (list, tuple)) else queues), shards)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file; export-events writes a directory of Parquet files")
    if on_gap not in ("warn", "fail"):
        raise ValueError(f"on_gap must be 'warn' or 'fail', got {on_gap!r}")
    if not isinstance(rows_per_file, int) or rows_per_file < 1:
        raise ValueError(f"rows_per_file must be a positive integer, got {rows_per_file!r}")
    out.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        offsets = read_offsets(out)
        result = ExportResult(out, offsets=dict(offsets))
        for queue in names:
            key = events_key(queue, key_prefix)
            info = stream_info(client, key)
            last = offsets.get(queue, {"sid": None, "n": 0})
            if gap := check_gap(queue, last["sid"], last["n"], info, on_gap):
                result.gaps.append(gap)
            result.exported[queue] = 0
            if info["last"] is None or (last["sid"] is not None and parse_sid(info["last"]) <= parse_sid(last["sid"])):
                continue
            position = max(last["n"], trimmed(info))  # of the event before the first one read
            # Up to the newest event at the start: a busy queue cannot keep it running.
            entries = (row(sid, fields) for sid, fields in scan(client, key, last["sid"], info["last"]))
            while rows := list(islice(entries, rows_per_file)):
                position = _flush(out, queue, rows, position, result)
        return result


@contextmanager
def _locked(out: Path):
    import fcntl

    with open(out / LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportBusy(f"another export-events is writing to {str(out)!r}; run one at a time") from None
        yield  # the lock goes with the file's closing


def _flush(out, queue, rows, position, result) -> int:
    """Write ``rows`` (after ``position``) as the queue's next Parquet file, renamed into place,
    then the offsets; the position of the last row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "timestamp": pa.timestamp("ms", tz="UTC")}
    schema = pa.schema([pa.field(name, types[kind]) for name, _, kind in COLUMNS])
    table = pa.Table.from_arrays([pa.array(col, type=f.type) for col, f in zip(zip(*rows), schema)], schema=schema)
    position += len(rows)
    ms, seq = parse_sid(rows[-1][-1])
    final = out / f"part-{quote(queue, safe='')}-{ms}-{seq}-{position}.parquet"
    tmp = out / ("." + final.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, final)
    result.files.append(final)
    result.exported[queue] += len(rows)
    result.offsets[queue] = {"sid": rows[-1][-1], "n": position}
    tmp = out / (".tmp" + OFFSETS)
    tmp.write_text(json.dumps({"offsets": result.offsets}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out / OFFSETS)
    return position
