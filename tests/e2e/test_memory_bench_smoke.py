"""benchmarks/memory_tasks.py runs in its smoke mode and writes its figures (none asserted); the
memory it reads leaves client buffers out."""

import json
import socket

import pytest

from benchmarks import memory_tasks
from benchmarks.common import data_memory
from celery_pq.testing import wait_for


@pytest.mark.slow
def test_memory_benchmark_runs_and_writes_both_columns(tmp_path):
    memory_tasks.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "memory_tasks.json").read_text())
    assert set(data["results"]) == {"small", "medium", "large"}
    assert all({"ratio", "celery-pq", "kombu-redis"} <= set(row) for row in data["results"].values())
    assert "celery-pq, no compression" in data["results"]["large"]
    assert any(":ii" in key for key in data["small_keys"]["celery-pq"])
    assert "kombu-redis bytes/task" in (tmp_path / "memory_tasks.md").read_text()


def test_data_memory_leaves_out_a_client_s_query_buffer(redis_server, redis_client):
    """A connection part-way through sending a 300 KB command holds it in its query buffer:
    used_memory grows by about that much; the data's memory, once Redis has counted the client's
    buffers (its cron does, within a second), moves by a small part of it (a buffer is counted by
    its allocation's size, used_memory by what was asked for)."""
    used, data = redis_client.info("memory")["used_memory"], data_memory(redis_client)
    value = b"x" * 300_000

    def readings():
        return redis_client.info("memory")["used_memory"] - used, abs(data_memory(redis_client) - data)

    def counted():
        grown, moved = readings()
        return grown >= 250_000 and moved < grown / 5

    with socket.create_connection(("127.0.0.1", redis_server.port)) as sock:
        sock.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nbig!\r\n$%d\r\n" % (len(value) + 1) + value)
        wait_for(
            counted, 5, lambda: f"the buffer counted in used_memory, not in the data's (grown, moved: {readings()})"
        )
    assert redis_client.get("big!") is None
