"""The demo: ``python -m celery_pq.demo`` (``make demo`` runs it).

A producer and real Celery workers of ``celery_pq.demo.app`` on a Redis the demo finds or starts,
showing priorities, lease recovery, lease renewal and fairness, each with checks that pass or fail
(``run.py`` says which Redis it uses and how). It ships in the package, so that an installed
celery-pq can be tried against a Redis with nothing but ``pip install`` before it.
"""
