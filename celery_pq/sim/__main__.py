"""``python -m celery_pq.sim``: see ``celery_pq.sim.cli``."""

from .cli import main

if __name__ == "__main__":
    main()
