"""Real Celery worker subprocesses on a real redis-server (``tests.e2e.app``), the demo and the
benchmarks run end to end."""
