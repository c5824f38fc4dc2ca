"""export-events (Parquet, incremental, resumable; no Spark) and the HTML report, whose stated
figures are checked against analyze()'s DataFrames; the two ``celery pq`` commands end to end."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from celery_pq.__main__ import main
from celery_pq.spark import analyze
from celery_pq.spark.events.export import LOCK, OFFSETS, ExportBusy, export_events, read_offsets
from celery_pq.spark.events.log import EventLogGap
from celery_pq.spark.events.report import QUEUE_FIGURES, TENANT_FIGURES, fmt, write_report
from celery_pq.storage.errors import ConfigError
from celery_pq.testing import celery_env
from tests.support.events import real_run, xadd_event

ROOT = Path(__file__).resolve().parents[2]


def add(client, prefix, queue, ids):
    return [xadd_event(client, queue, "enqueue", prefix=prefix, id=i, p=1, k=254, t="x") for i in ids]


def exported_sids(out):
    return sorted(pq.read_table(str(out)).column("sid").to_pylist())


def test_export_is_incremental_and_resumable(redis_client, key_prefix, tmp_path):
    out = tmp_path / "events.parquet"
    first = add(redis_client, key_prefix, "a", [f"a{i}" for i in range(25)]) + add(
        redis_client, key_prefix, "b", ["b0", "b1"]
    )
    r1 = export_events(redis_client, ["a", "b"], out, key_prefix=key_prefix, rows_per_file=10)
    assert r1.exported == {"a": 25, "b": 2} and len(r1.files) == 4
    assert exported_sids(out) == sorted(first)
    assert json.loads((out / OFFSETS).read_text())["offsets"]["a"]["sid"] == first[24]

    # a second run appends only the new events; a run with nothing new writes nothing
    more = add(redis_client, key_prefix, "a", ["a25", "a26"])
    r2 = export_events(redis_client, "a,b", out, key_prefix=key_prefix)
    assert r2.exported == {"a": 2, "b": 0} and len(r2.files) == 1
    assert export_events(redis_client, "a", out, key_prefix=key_prefix).files == []

    # a run cut short after writing a file but before updating the offsets resumes from the file
    last = add(redis_client, key_prefix, "a", ["a27"])
    data = json.loads((out / OFFSETS).read_text())
    export_events(redis_client, "a", out, key_prefix=key_prefix)
    (out / OFFSETS).write_text(json.dumps(data))  # the offsets as they were before that run
    assert read_offsets(out)["a"]["sid"] == last[0]
    assert export_events(redis_client, "a", out, key_prefix=key_prefix).exported == {"a": 0}
    assert exported_sids(out) == sorted(first + more + last)  # each event exactly once


def test_export_reports_trimmed_events(redis_client, key_prefix, tmp_path):
    out = tmp_path / "ev"
    for i in range(4):
        xadd_event(redis_client, "cap", "enqueue", prefix=key_prefix, id=f"c{i}", maxlen=5)
    assert export_events(redis_client, "cap", out, key_prefix=key_prefix).gaps == []
    for i in range(4, 12):  # 12 added, 5 kept: 7 trimmed, of which 3 were not exported
        xadd_event(redis_client, "cap", "enqueue", prefix=key_prefix, id=f"c{i}", maxlen=5)
    with pytest.raises(EventLogGap, match=r"3 event\(s\) after event"):
        export_events(redis_client, "cap", out, key_prefix=key_prefix, on_gap="fail")
    result = export_events(redis_client, "cap", out, key_prefix=key_prefix)
    assert len(result.gaps) == 1 and result.exported == {"cap": 5}
    assert sorted(pq.read_table(str(out)).column("id").to_pylist()) == sorted(
        [f"c{i}" for i in range(4)] + [f"c{i}" for i in range(7, 12)]
    )


def test_export_bad_input_is_named(redis_client, key_prefix, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        export_events(redis_client, "a", a_file, key_prefix=key_prefix)
    with pytest.raises(ConfigError, match="option 'queue' is required"):
        export_events(redis_client, " ", tmp_path / "o", key_prefix=key_prefix)
    (tmp_path / "o").mkdir(exist_ok=True)
    (tmp_path / "o" / OFFSETS).write_text("not json")
    with pytest.raises(ValueError, match="is not an offsets file"):
        export_events(redis_client, "a", tmp_path / "o", key_prefix=key_prefix)
    assert a_file.read_text() == "x"  # nothing lost


def test_one_export_at_a_time_per_directory(redis_client, key_prefix, tmp_path):
    import fcntl

    out = tmp_path / "ev"
    add(redis_client, key_prefix, "a", ["a0"])
    out.mkdir()
    with open(out / LOCK, "a") as held:  # another run holds the directory
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(ExportBusy, match="another export-events is writing to"):
            export_events(redis_client, "a", out, key_prefix=key_prefix)
        fcntl.flock(held, fcntl.LOCK_UN)
    assert export_events(redis_client, "a", out, key_prefix=key_prefix).exported == {"a": 1}


def figures_of(html_text):
    return {unescape(k): unescape(v) for k, v in re.findall(r'<td data-figure="([^"]*)">([^<]*)</td>', html_text)}


def test_report_states_the_dataframes_figures(spark, redis_client, key_prefix, tmp_path):
    # Given: a real run's log, exported to Parquet
    q = real_run(redis_client, key_prefix, entries=200)
    out = tmp_path / "events.parquet"
    export_events(redis_client, q.name, out, key_prefix=key_prefix)

    # When: the report is rendered
    html_path, png_path = tmp_path / "report.html", tmp_path / "report.png"
    write_report(out, html_path, png_path=png_path, spark=spark, window_seconds=0.5)
    page = html_path.read_text()

    # Then: every figure it states is the DataFrames' figure
    frames = analyze(spark.read.parquet(str(out)), window_seconds=0.5)
    stated = figures_of(page)
    [s] = frames["summary"].collect()
    for name, _, kind in QUEUE_FIGURES:
        assert stated[f"{q.name}||{name}"] == fmt(s[name], kind), name
    waits = {r.tenant: r for r in frames["waits"].collect()}
    redel = {r.tenant: r for r in frames["redeliveries"].collect()}
    held = {r.tenant: r.asDict() for r in frames["worker_time"].collect()}  # (none: the queue counts tasks)
    assert set(waits) == {"a", "b", "c"}
    for tenant in waits:
        for name, _, kind in TENANT_FIGURES:
            if name in ("held_ms", "worker_share"):
                row = held.get(tenant, {name: None})
            else:
                row = waits[tenant] if name in waits[tenant].asDict() else redel[tenant]
            assert stated[f"{q.name}|{tenant}|{name}"] == fmt(row[name], kind), (tenant, name)
    assert int(stated[f"{q.name}||delivered"]) > 200
    # and the plots are inline PNGs (the page is self-contained)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 1 and base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "http" not in page.replace("http-equiv", "")


def test_report_of_nothing_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no Parquet files"):
        write_report(tmp_path / "empty", tmp_path / "r.html")
    with pytest.raises(FileNotFoundError, match="no event log at"):
        write_report(tmp_path / "missing", tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def celery_pq_cli(redis_server, prefix, *args):
    env = celery_env(
        ROOT, PQ_TEST_BROKER=f"pq://127.0.0.1:{redis_server.port}/0", PQ_TEST_OPTIONS=json.dumps({"key_prefix": prefix})
    )
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )


@pytest.mark.e2e
def test_cli_export_events_then_report(spark, redis_server, redis_client, key_prefix, tmp_path):
    q = real_run(redis_client, key_prefix, entries=100)
    out = tmp_path / "events.parquet"
    n = len(q.events())
    # export-events through Celery's command line (``celery -A app pq``), in a process of its own
    first = celery_pq_cli(redis_server, key_prefix, "export-events", q.name, "--out", str(out))
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"{q.name}: {n} new events")
    again = celery_pq_cli(redis_server, key_prefix, "export-events", q.name, "--out", str(out), "--json")
    assert json.loads(again.stdout)["exported"] == {q.name: 0}
    # the report command in this process (its local Spark session is the tests' one: a second JVM
    # would add about half a minute)
    html_path = tmp_path / "r.html"
    broker = ["--broker", f"pq://127.0.0.1:{redis_server.port}/0"]
    rep = CliRunner().invoke(main, [*broker, "report", str(out), "--html", str(html_path)], catch_exceptions=False)
    assert rep.exit_code == 0, rep.output
    assert figures_of(html_path.read_text())[f"{q.name}||events"] == str(n)
    bad = CliRunner().invoke(main, [*broker, "report", str(out), "--html", str(html_path), "--window", "0"])
    assert bad.exit_code != 0 and "--window" in bad.output
