"""A call stream: script calls written to one connection now, their replies read later, so
Redis runs a publish batch's inserts (``batches.py``) while the client prepares the next ones
(docs/publishing.md). It takes a pooled connection, not the thread's own (``wire.py``): another
call on the thread must not read the stream's replies as its own.
"""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..storage.connections import is_cluster
from .wire import _demoted, _functions, _load_library, _packed, _plain_client, _readonly

#: What a lost connection raises while sending or reading.
LOST = (RedisConnectionError, RedisTimeoutError, OSError)


class CallStream:
    """One connection with calls sent and replies not yet read (``outstanding``). No health
    check runs while replies are outstanding (its PING would read one as its own)."""

    def __init__(self, client, conn):
        self.client = client
        self.conn = conn
        self.outstanding = 0
        self.broken = False

    @classmethod
    def open(cls, client) -> CallStream | None:
        """A stream on a connection of ``client``'s pool (the library loaded there if needed), or
        None for a cluster client or a pipeline: the caller then makes round trips."""
        pool = getattr(client, "connection_pool", None)
        if pool is None or is_cluster(client) or not _plain_client(client.__class__):
            return None
        conn = pool.get_connection()
        try:
            if _functions.get(pool) is None:
                _load_library(conn, pool)
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        return cls(client, conn)

    def send(self, script, keys, args) -> None:
        """Write one script call without reading its reply. A lost connection raises (LOST) and
        breaks the stream; the calls sent before may have run, their replies lost."""
        words = script.words(self.client, keys, args)
        packed = _packed(words)
        conn = self.conn
        try:
            if packed is None:
                conn.send_packed_command(conn.pack_command(*words), check_health=not self.outstanding)
            else:
                conn.send_packed_command([packed], check_health=not self.outstanding)
        except BaseException:
            self.broken = True
            raise
        self.outstanding += 1

    def read(self):
        """The oldest unread reply: its value, or its error reply returned (not raised) as an
        exception. A lost connection raises (LOST) and breaks the stream; READONLY (a demoted
        server) breaks it too and is returned as a connection error."""
        if not self.outstanding:
            raise RuntimeError("no reply is outstanding on this call stream")
        self.outstanding -= 1
        try:
            reply = self.conn.read_response()
        except ResponseError as exc:
            if _readonly(exc):
                self.broken = True
                return _demoted(self.conn, exc)
            return exc
        except BaseException:
            self.broken = True
            raise
        return reply

    def close(self) -> None:
        """Hand the connection back, the outstanding replies read and dropped first; closed
        instead when broken or a read fails."""
        conn, pool = self.conn, self.client.connection_pool
        try:
            while self.outstanding and not self.broken:
                self.read()
        except Exception:
            self.broken = True
        finally:
            if self.broken or self.outstanding:
                conn.disconnect()
            self.outstanding = 0
            pool.release(conn)
