"""A local SparkSession as the project's own tools make one: the report command, the pipeline
example, the Spark benchmark and the tests.

Local mode on this machine's loopback only (driver host and bind address 127.0.0.1: Spark
otherwise binds the address its host name resolves to, and says so in a warning), no UI, UTC
session time, Python workers running this very interpreter (so they import the same
``celery_pq``), and the celery_pq data sources registered.
"""

from __future__ import annotations

import os
import sys


def local_spark(app_name: str, master: str = "local[*]", *, shuffle_partitions: int = 2, **conf):
    """A local SparkSession; ``conf`` adds settings (dots as in Spark's names, given as a dict
    by ``**{"spark.driver.memory": "1g"}``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from . import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
