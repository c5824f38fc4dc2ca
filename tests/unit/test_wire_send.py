"""How a call is sent (celery_pq.scripts.wire): packed by hiredis, or redis-py's way (no Redis)."""

import pytest
import redis


def test_a_script_call_is_packed_by_hiredis_and_anything_else_goes_redis_pys_way():
    from celery_pq.scripts import FIRST_SEND, wire

    class Conn(redis.Connection):  # (not connected: packing needs no server)
        def send_packed_command(self, command, check_health=True):
            sent.append(b"".join(command))

    sent: list = []
    conn = Conn()
    wire.send(conn, ("FCALL", "f", 2, "k", b"v", 7, FIRST_SEND))
    assert sent == [b"*7\r\n$5\r\nFCALL\r\n$1\r\nf\r\n$1\r\n2\r\n$1\r\nk\r\n$1\r\nv\r\n$1\r\n7\r\n$1\r\nF\r\n"]
    with pytest.raises(redis.DataError):  # hiredis packs no None: redis-py's path says why
        wire.send(conn, ("FCALL", "f", 0, None))
