"""Out of the event log: the ``celery_pq_events`` data source, the Parquet export, the analysis
(``analyze``) and its HTML report. docs/spark.md ("From the event log to analytics") explains
them; docs/events.md the log itself.
"""
