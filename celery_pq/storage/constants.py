"""Every default and fixed number the transport and the queue share, each with its unit, so that
the Lua scripts, the Python side and the docs agree (figures: benchmarks/results/notes.md)."""

#: Prefix of every Redis key and pub/sub channel the project writes (one ACL rule ``~pq:*``).
KEY_PREFIX = "pq"

#: Priorities are integers in this closed range (AMQP allows 0..255).
MIN_PRIORITY = 0
MAX_PRIORITY = 255

#: A score is ``rank * SEQ_SPAN + seq`` (rank 0 served first): 256 * 2**44 < 2**53, exact in a double.
SEQ_BITS = 44
SEQ_SPAN = 1 << SEQ_BITS

#: ``priority_order``: AMQP's (255 first) or kombu's Redis transport's (0 first).
HIGHER_FIRST = "higher_first"
LOWER_FIRST = "lower_first"
PRIORITY_ORDERS = (HIGHER_FIRST, LOWER_FIRST)

#: Option ``expired`` (an entry past its expiry deadline) -> the letter the queue context carries.
EXPIRED_DEAD_LETTER = "dead_letter"
EXPIRED_DROP = "drop"
EXPIRED_POLICIES = {EXPIRED_DEAD_LETTER: "d", EXPIRED_DROP: "x"}

#: Techniques of REMOVE BY ID: "T" deletes the pointer too (O(its position) in its rank's list);
#: "S" the entry only, the stale pointer dropped when it surfaces or by a bounded clean-up.
TECHNIQUE_T = "T"
TECHNIQUE_S = "S"
TECHNIQUES = (TECHNIQUE_T, TECHNIQUE_S)

#: Seconds a delivered message stays leased without a renewal.
LEASE_SECONDS = 60.0

#: Deliveries without an ack before a message goes to ``<queue>.dead``.
MAX_DELIVERIES = 10

#: Seconds between sweeps of expired leases, by one consumer (a guard key): recovery takes at most
#: lease_seconds + this.
SWEEP_INTERVAL = 1.0

#: Expired leases returned, and due delayed entries promoted, per sweep call (the sweep repeats).
SWEEP_BATCH = 500

#: Due delayed entries one pop promotes before it takes, at most (lua/includes/delays.lua's
#: POP_PROMOTE; the pop says when more are due now); on a fair queue FAIR_PROMOTE, a pop's or a
#: sweep's call (each costs a dozen commands there).
POP_PROMOTE = 100
FAIR_PROMOTE = 50

#: Stale pointers one pop may discard (the rest: later pops, the clean-up sweep).
POP_STALE_BUDGET = 1000

#: Seconds a worker's event-loop tick goes on popping while each pass delivers (its timers wait).
TICK_DRAIN_SECONDS = 0.01

#: Seconds at most an idle Celery event loop sleeps where signals cannot wake it, to see a shutdown.
IDLE_WAKE_SECONDS = 1.0

#: Microseconds a script call polls for its reply before it sleeps in recv (option spin_wait_us);
#: a late reply stops the polling for the next 2, 4, .. SPIN_BACKOFF_MAX calls.
SPIN_WAIT_US = 100
SPIN_BACKOFF_MAX = 1024

#: Seconds a command may wait for its reply, not counting a blocking wait (redis-py waits forever: a
#: half-open connection would hold a worker); below lease_seconds - renew_interval (docs/leases.md).
SOCKET_TIMEOUT = 30.0

#: Seconds a lease must outlast its renewal interval: the keeper may wake a quarter interval late,
#: and two retries of a failed renewal fit (docs/leases.md, "Renewal").
RENEW_MARGIN = 0.5

#: Pointers one compaction step looks at (lua/includes/index.lua's COMPACT_STEP).
COMPACT_STEP = 512

#: Entries one step of ``migrate_mode`` looks at (and pointers it moves), at most.
MIGRATE_STEP = 64

#: Seconds a queue-API call waits out a migration of the queue's mode before QueueMigrating.
MIGRATION_WAIT = 60.0

#: Broadcast ids a receiving channel remembers, to drop one sent again after a lost reply.
BROADCASTS_REMEMBERED = 1024

#: Entries per script call of a bulk insert (Redis runs one script at a time).
BULK_CHUNK = 1000

#: Messages of one queue a publish batch sends as one insert call (option batch_send).
BATCH_SEND = 200

#: Entries per script call of a purge or a replay, under the 10 ms no script call may take.
STEP_CHUNK = 200

#: Seconds a consumer blocks on its wake lists before it re-arms (an insert wakes it sooner).
BLOCK_SECONDS = 5.0

#: The tenant of a task ``task_rate`` limits: this prefix and the task name.
TASK_TENANT_PREFIX = "task:"

#: Seconds a publish id is remembered (at most twice as long): a retry within stores nothing.
DEDUPE_SECONDS = 300.0

#: Answered publish ids a producer collects before an insert call forgets them; at most
#: FORGET_MAX go in one call and FORGET_PENDING wait (the rest: the window's rotation).
FORGET_BATCH = 32
FORGET_MAX = 256
FORGET_PENDING = 4096

#: Most messages one pop script call leases.
MAX_POP_BATCH = 100

#: Most messages one fair pop leases, under the 10 ms no script call may take.
FAIR_POP_MAX = 50

#: Seconds a publish or an ack waits for ``wait_replicas`` (Redis WAIT) before NotReplicated.
WAIT_TIMEOUT = 1.0

#: Port of a Redis server named without one.
REDIS_PORT = 6379

#: Seconds for a sentinel's answer before the next is asked (unless sentinel_kwargs says).
SENTINEL_SOCKET_TIMEOUT = 1.0

#: Seconds a Redis Cluster call retries while its slot moves or the cluster is down
#: (option cluster_retry_seconds; docs/cluster.md, "Resharding").
CLUSTER_RETRY_SECONDS = 60.0
#: Seconds before the first retry, doubled on each refusal up to SETTLE_PAUSE_MAX.
SETTLE_PAUSE_FIRST = 0.01
SETTLE_PAUSE_MAX = 0.5
