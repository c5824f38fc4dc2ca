"""How a call is sent (celery_pq.scripts.wire): packed by hiredis, or redis-py's way (no Redis)."""


def test_a_script_call_is_packed_by_hiredis_and_anything_else_goes_redis_pys_way():
    from celery_pq.scripts import wire

    class Conn:
        def __init__(self):
            self.sent = []

        def send_packed_command(self, packed):
            self.sent.append(("packed", b"".join(packed)))

        def send_command(self, *words):
            self.sent.append(("words", words))

    conn = Conn()
    wire._send(conn, ("FCALL", "f", 1, "k", b"v", 7))
    wire._send(conn, ("FCALL", "f", 0, None))  # hiredis packs no None: redis-py's path says why
    if wire._pack is not None:
        assert conn.sent[0] == (
            "packed",
            b"*6\r\n$5\r\nFCALL\r\n$1\r\nf\r\n$1\r\n1\r\n$1\r\nk\r\n$1\r\nv\r\n$1\r\n7\r\n",
        )
        assert conn.sent[1] == ("words", ("FCALL", "f", 0, None))
    else:
        assert [kind for kind, _ in conn.sent] == ["words", "words"]
