"""A Redis user with fewer commands than today's scripts could use still publishes and consumes."""

from __future__ import annotations

import pytest
import redis

from celery_pq.queue import open_queue


def test_a_redis_user_without_mget_still_publishes_and_consumes(fresh_redis):
    # an ACL line written before the insert read three keys with one MGET
    admin = fresh_redis.client()
    admin.execute_command("ACL", "SETUSER", "old", "on", ">pw", "~*", "&*", "+@all", "-mget")
    client = redis.Redis(host=fresh_redis.host, port=fresh_redis.port, username="old", password="pw")
    q = open_queue(client, "nomget")
    assert q.insert(b"x", 3, id="a") == "a"
    other = q.insert(b"y", 3)
    assert [e.id for e in q.pop(2)] == ["a", other]
    with pytest.raises(redis.ResponseError):
        client.mget("k1", "k2")  # (it is refused indeed)
    client.close()
    admin.close()
