"""The live dashboard: ``celery -A proj pq dashboard --port 8808``.

- ``board.py``    what it shows and does, through the queues' own methods (``Board``)
- ``history.py``  deliveries over the last minutes, from sampled totals (``DeliveryHistory``)
- ``server.py``   the standard library's HTTP server, the token, ``run`` (the command's body)
- ``static/``     the page: index.html, dashboard.js (refreshes every 1.5 s), dashboard.css

See docs/dashboard.md.
"""

from .board import Board, BoardError
from .history import DeliveryHistory, Sample
from .server import DashboardServer, run

__all__ = ["Board", "BoardError", "DashboardServer", "DeliveryHistory", "Sample", "run"]
