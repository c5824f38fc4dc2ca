"""Operator tools: the ``pq`` commands (cli/), the dashboard, the Prometheus metrics (the
``[ops]`` extra) and how rows are shown (docs/operations.md)."""
