"""Spark tests (marker ``spark``): the event-log data source, the export, the analysis and the
report, on PySpark in local mode against a real redis-server."""
