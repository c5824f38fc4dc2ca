"""A local SparkSession as the project's tools make one (``pq report``, the examples, the Spark
benchmark, the tests): loopback only, no UI, UTC, Python workers on this interpreter, the data
sources registered. docs/spark.md.
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
        .config("spark.driver.host", "127.0.0.1")  # else the host name's address, with a warning
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
