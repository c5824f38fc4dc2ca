"""Defaults and fixed numbers, each with its unit and the reason for it.

Every number the transport and the queue share lives here, so that the Lua scripts, the
Python face of the queue and the docs agree.
"""

#: Prefix of every Redis key and pub/sub channel the project writes (one ACL rule ``~pq:*``).
KEY_PREFIX = "pq"

#: Priorities are integers in this closed range (AMQP allows 0..255).
MIN_PRIORITY = 0
MAX_PRIORITY = 255

#: A sorted-set score is ``rank * SEQ_SPAN + seq``: the rank (0 is served first) in the high
#: bits, the queue's insertion sequence in the low 44 bits. 255 * 2**44 + 2**44 < 2**53, so a
#: double holds every score exactly. 2**44 inserts is ~17.6 trillion per queue.
SEQ_BITS = 44
SEQ_SPAN = 1 << SEQ_BITS

#: ``priority_order``: "higher_first" is AMQP/RabbitMQ (255 first), "lower_first" is the
#: meaning of kombu's Redis transport (0 first).
HIGHER_FIRST = "higher_first"
LOWER_FIRST = "lower_first"
PRIORITY_ORDERS = (HIGHER_FIRST, LOWER_FIRST)

# What a pop does with an entry past its expiry deadline (option ``expired``): move it to the
# dead-letter queue with reason "expired", or delete it. The letter the queue context carries.
EXPIRED_DEAD_LETTER = "dead_letter"
EXPIRED_DROP = "drop"
EXPIRED_POLICIES = {EXPIRED_DEAD_LETTER: "d", EXPIRED_DROP: "x"}

#: Patent techniques for REMOVE BY ID (every entry carries its score either way): "T" deletes
#: the entry and its pointer in the priority index at once (the pointer is found in its rank's
#: list: O(its position)); "S" deletes the entry only, and the stale pointer is dropped lazily
#: when it surfaces, or by a bounded clean-up sweep.
TECHNIQUE_T = "T"
TECHNIQUE_S = "S"
TECHNIQUES = (TECHNIQUE_T, TECHNIQUE_S)

#: Seconds a delivered message stays leased without a renewal.
LEASE_SECONDS = 60.0

#: Deliveries without an ack before a message goes to ``<queue>.dead``.
MAX_DELIVERIES = 10

#: Seconds between sweeps of expired leases. A guard key (SET NX PX) makes one consumer per
#: interval do the sweep, so recovery takes at most lease_seconds + this.
SWEEP_INTERVAL = 1.0

#: Expired leases returned per sweep call (bounds the script's run time; the sweep repeats).
SWEEP_BATCH = 500

#: Stale priority-index pointers (technique S, fair pops) a pop may discard before it returns, so one pop
#: never runs long; the rest are discarded by later pops or the clean-up sweep.
POP_STALE_BUDGET = 1000

#: Seconds a Celery worker's event-loop tick goes on popping and delivering while each pass
#: delivers (poller.Poller.on_tick): a backlog is served without a trip through the loop's poll
#: per message, and the loop's timers and other sockets wait at most this long.
TICK_DRAIN_SECONDS = 0.01

#: Seconds at most a Celery worker's idle event loop sleeps where signals cannot wake it (a
#: loop outside the main thread, or a process whose signal wake-up fd is another's), so that a
#: shutdown asked for meanwhile is seen (poller.Poller.register_with_event_loop); kombu's own
#: Redis transport wakes as often (its BRPOP timeout).
IDLE_WAKE_SECONDS = 1.0

#: Microseconds a script call's thread polls its socket for the reply before it sleeps in recv
#: (the transport option spin_wait_us; scripts.wire._spin_recv). On a machine where the Redis server
#: is near (loopback, the same rack) most replies come within it, and a thread that sleeps and is
#: woken costs more than the polling: a publish took 40-60% less time and no more client CPU
#: with it (benchmarks/results/notes.md, "Polling for the reply instead of sleeping"). A connection
#: whose replies do not come in time (a far Redis, a busy machine) stops polling at once and tries
#: again after 2, 4, .. SPIN_BACKOFF_MAX calls.
SPIN_WAIT_US = 100
SPIN_BACKOFF_MAX = 1024

#: Seconds a command may wait for Redis's reply before the connection is given up (redis-py's
#: socket_timeout). redis-py and kombu wait forever by default, so a connection that went silent
#: (half-open: NAT, a firewall, a vanished host) holds a worker for good. 30 s is far above any
#: script's run time and below the default lease less its renewal interval (60 - 20 s), so a
#: worker leaves a silent connection before its leases could expire; with a shorter lease the
#: default is lease_seconds - renew_interval, and a longer socket_timeout is refused. A blocking
#: wait does not count: the poller reads it only once it is readable.
SOCKET_TIMEOUT = 30.0

#: Seconds a lease must last beyond its renewal interval (lease_seconds - renew_interval at the
#: least; a shorter lease is refused): the lease keeper wakes up to a quarter of renew_interval
#: late, a renewal is a round trip, and a failed one is tried again after 0.1 s, then 0.2 s
#: (leases.RETRY_FIRST): two retries fit. With the default renew_interval (a third of the lease)
#: this makes the shortest lease 0.75 s.
RENEW_MARGIN = 0.5

#: Pointers one compaction step of a priority's list looks at, at most (lua/includes/index.lua's
#: COMPACT_STEP; ``PriorityQueue.cleanup`` takes this many per script call): about 1-2 ms of
#: Redis's time, well under the 10 ms no script call may take.
COMPACT_STEP = 512

#: Entries one step of ``migrate_mode`` looks at (and pointers it moves), at most: a few ms.
MIGRATE_STEP = 64

#: Seconds a queue-API call to a queue whose mode is being migrated waits (retrying, nothing
#: done meanwhile) before it raises QueueMigrating: a migration of 1,000,000 entries runs for
#: about 30 s of steps here (120,000: 3 s).
MIGRATION_WAIT = 60.0
#: Broadcast ids a receiving channel remembers, to drop one sent again after a lost reply.
BROADCASTS_REMEMBERED = 1024

#: Entries per script call for bulk inserts (keeps each script short, as Redis runs one script
#: at a time).
BULK_CHUNK = 1000

#: Messages of one queue a producer's publish batch collects before it sends them as one insert
#: call, its reply read at the flush (batches.py): Redis stores a sub-chunk while the client
#: prepares the next; the last one sent at the flush is the wait left (about 1 ms at 200).
BATCH_SEND = 200

#: Entries per script call of a purge or a replay, whose work per entry is the heaviest (a purge
#: of a fair queue updates the tenant's order and counts): a few ms a call, under the 10 ms no
#: script call may take (benchmarks/slowlog.py).
STEP_CHUNK = 200

#: Seconds a consumer blocks on its wake lists before it re-arms (server-side BLPOP timeout).
#: Delivery is woken by the insert, not by this timeout.
BLOCK_SECONDS = 5.0

#: The tenant of a task the ``task_rate`` option limits is this prefix and the task name; the
#: rates of tenants so named belong to the option (a queue opened with the options drops those
#: it no longer names).
TASK_TENANT_PREFIX = "task:"

#: Seconds a publish id is remembered (at least; at most twice as long): a publish retried
#: after a lost reply within this window stores nothing new.
DEDUPE_SECONDS = 300.0

#: Answered publish ids a producer collects before an insert call has them forgotten (one
#: command for the batch instead of one per publish).
FORGET_BATCH = 32
#: At most this many answered publish ids go in one insert call, and at most FORGET_PENDING wait
#: (after a bulk insert the rest are left to the window's rotation, which drops them).
FORGET_MAX = 256
FORGET_PENDING = 4096

#: Largest number of messages one pop script call leases (prefetch window batch).
MAX_POP_BATCH = 100

#: Largest number of messages one fair pop script call leases: a fair pop does several commands
#: per entry (its tenant's order, the schedule, the tenant's counts), and one of 100 took up to
#: 12-15 ms of Redis's time here whatever the queue's size (benchmarks/slowlog.py's fair_control);
#: 50 keeps it under the 10 ms no script call may take. A pop asking for more gets up to this
#: many (a consumer pops again for the rest).
FAIR_POP_MAX = 50

#: Seconds a publish or an ack waits for ``wait_replicas`` replicas to acknowledge it (Redis
#: WAIT) before the publish raises NotReplicated (an ack logs): long enough for a replica on
#: the same network to answer, short enough that a lost replica does not stall producers long.
WAIT_TIMEOUT = 1.0

#: Port of a Redis server named without one.
REDIS_PORT = 6379

#: Seconds to wait for a sentinel's answer (connect and read) before asking the next one, when
#: sentinel_kwargs does not say: one that hangs must not hold up finding the master.
SENTINEL_SOCKET_TIMEOUT = 1.0

#: Seconds a script call on a Redis Cluster waits, trying again, while its queue's slot migrates
#: (a resharding moves the slot's keys one by one; every call on it is refused meanwhile:
#: TRYAGAIN, ASK, CLUSTERDOWN, the script's slot guard) before it fails as a connection error
#: (the transport option cluster_retry_seconds). A slot of a few queues moves in well under a
#: second; one holding a large queue (a hash of a million entries) in a few seconds, and a
#: master's failover takes about twice cluster-node-timeout: 60 s covers them with room to spare.
CLUSTER_RETRY_SECONDS = 60.0
#: Seconds before the first try again, doubled on each refusal up to SETTLE_PAUSE_MAX.
SETTLE_PAUSE_FIRST = 0.01
SETTLE_PAUSE_MAX = 0.5
