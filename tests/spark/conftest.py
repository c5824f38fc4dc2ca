"""One local SparkSession for every Spark test (``local[2]``, UI off, two shuffle partitions)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

pyspark = pytest.importorskip("pyspark")

if shutil.which("java") is None:  # pragma: no cover - the setup says what to install
    pytest.skip("PySpark needs Java 17 (apt-get install openjdk-17-jre-headless)", allow_module_level=True)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this venv, this PYTHONPATH

    from celery_pq.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("celery-pq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
