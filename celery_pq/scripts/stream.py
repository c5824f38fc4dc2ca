"""A call stream: script calls written to one connection now, their replies read later.

A producer's publish batch (batches.py) sends each sub-chunk of its inserts as soon as it is
full and reads the replies at its flush: Redis runs the calls while the client prepares the
next messages. ``CallStream.open(client)`` takes a connection of ``client``'s pool for that
(not the thread's own connection of wire.py: a call made meanwhile on the same thread, a
declare or a fanout publish, must not read a reply of the stream as its own), ``send`` writes
a call without reading, ``read`` reads the oldest reply not yet read, ``close`` hands the
connection back to the pool, the replies still outstanding read (dropped) first, or closed
when it broke (a lost connection, a reply that could not be read).

Only a plain redis-py client (not a pipeline, not a cluster client) streams; ``open`` returns
None otherwise, and the caller takes its round-trip path. No health check runs while replies
are outstanding (its PING would read a reply of the stream as its own).
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
    """One connection with calls sent and replies not yet read (``outstanding``)."""

    def __init__(self, client, conn):
        self.client = client
        self.conn = conn
        self.outstanding = 0
        self.broken = False

    @classmethod
    def open(cls, client) -> CallStream | None:
        """A stream on a connection of ``client``'s pool, or None where calls cannot stream (a
        cluster client, a pipeline); the library is loaded there first when needed."""
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
        """Write one script call (FCALL where the library is loaded, else EVALSHA); its reply
        waits. A lost connection raises (LOST): the stream is broken, the replies of the calls
        sent before are lost with it (some of those calls may have run)."""
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
        """The reply of the oldest call not yet read: its value, or its error reply as an
        exception object (not raised: the calls after it have replies of their own). A lost
        connection raises (LOST) and breaks the stream; a READONLY reply (the server was
        demoted) breaks it too and comes as the connection error it is."""
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
        """Hand the connection back: the outstanding replies read first (dropped), or the
        connection closed when it is broken or a read fails."""
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
