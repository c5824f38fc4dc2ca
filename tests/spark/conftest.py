"""One local SparkSession for every Spark test (``local[2,4]``: two threads, and a failed task is
tried up to four times, which the retry tests rely on), with the UI off and few shuffle partitions.

``failing_writes`` is that session with the ``celery_pq`` format failing a partition's first
attempt on demand (``faults.py``). Every test here is marked ``spark``. Without Java they are
skipped, saying so (``make test`` finds or installs Java first: scripts/ensure-java.sh).
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
    # (the Python workers run the interpreter running the tests: they import the same celery_pq)
    from celery_pq.spark.session import local_spark

    session = local_spark(
        "celery-pq-tests",
        "local[2,4]",
        **{
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
        },
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def failing_writes(spark):
    """``spark`` with ``faults.FailingDataSource`` as the ``celery_pq`` format (the options
    ``fail_after`` and ``fail_markers``), the data sources registered again after the test."""
    from celery_pq.spark import register
    from tests.spark.faults import FailingDataSource

    register(spark)
    spark.dataSource.register(FailingDataSource)
    yield spark
    register(spark, check_workers=False)
