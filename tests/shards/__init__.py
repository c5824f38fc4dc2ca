"""A queue split into shards (``celery_pq.queue.sharded``, the options ``shards`` and ``peek``): shard
names and slots, the sharded queue on a real redis-server with N in {1, 4} (nothing lost or
doubled, leases and acks per shard, order relaxed but bounded, stats summed), through kombu, and
a real Celery worker with shards=4."""
