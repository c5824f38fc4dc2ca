"""Out of the event log: the ``celery_pq_events`` data source, the Parquet export, ``analyze`` and
its HTML report. docs/spark.md ("From the event log to analytics"), docs/events.md."""
