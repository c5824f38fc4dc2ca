"""Operating celery-pq: the ``pq`` commands, the Prometheus metrics and the backlog autoscaler,
against a real redis-server (and, for the autoscaler, a real Celery worker)."""
