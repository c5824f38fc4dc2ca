"""One local SparkSession for every Spark test (``local[2,4]``: two threads, and a failed task is
tried up to four times, which the retry tests rely on), with the UI off and few shuffle partitions.

Every test here is marked ``spark``. Without Java they are skipped, saying so (``make test`` finds
or installs Java first: scripts/ensure-java.sh).
"""

from __future__ import annotations

import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/spark/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.skip("no Java: PySpark needs Java 17 (bash scripts/ensure-java.sh says what to install)")
    import os
    import sys

    from pyspark.sql import SparkSession

    # the Python workers (executors, and the data source planner on the driver) must import
    # celery_pq: the interpreter running the tests has it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from celery_pq.spark import register

    session = (SparkSession.builder.master("local[2,4]").appName("celery-pq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.execution.pyspark.udf.faulthandler.enabled", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
