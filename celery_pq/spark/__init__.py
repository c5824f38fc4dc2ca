"""celery-pq on Spark (the ``[spark]`` extra; imported only when used).

``register(spark)`` registers the data sources with a SparkSession; ``analyze(events)`` turns
an event-log DataFrame into analysis DataFrames (see ``celery_pq/spark/analyze.py``).
"""

from __future__ import annotations

# The function shadows its module on purpose: ``celery_pq.spark.analyze(events)`` is the API.
from .analyze import analyze


def register(spark) -> None:
    """Register celery-pq's data sources with ``spark`` (calling it twice is harmless)."""
    from .events import EventsDataSource

    spark.dataSource.register(EventsDataSource)


__all__ = ["analyze", "register"]
