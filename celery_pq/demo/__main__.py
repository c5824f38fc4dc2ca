"""``python -m celery_pq.demo``: see ``celery_pq.demo.run``."""

import sys

from .run import main

sys.exit(main())
