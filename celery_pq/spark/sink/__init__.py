"""Into the queue: the ``celery_pq`` data source, a DataFrame's rows (batch or streaming) as Celery
tasks, each row once across Spark's retries. docs/spark.md ("From DataFrames to tasks")."""
