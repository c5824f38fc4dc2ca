"""The demo, ``python -m celery_pq.demo`` (``make demo``): real Celery workers showing priorities,
lease recovery and renewal, and fairness, with checks (``run``: the producer; ``app``: the workers'
app). In the package, so an installed celery-pq can be tried. README.md ("Install").
"""
