"""The live dashboard, ``celery -A proj pq dashboard``: ``board`` (what it shows and does),
``server`` (the HTTP server, the token, ``run``) and ``static/`` (the page). docs/dashboard.md."""

from .board import Board, BoardError, DeliveryHistory, Sample
from .server import DashboardServer, run

__all__ = ["Board", "BoardError", "DashboardServer", "DeliveryHistory", "Sample", "run"]
