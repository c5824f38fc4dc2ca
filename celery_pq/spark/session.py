"""Spark sessions: ``local_spark`` as the project's tools make one, and ``check_python_workers``
for ``register(spark)``. docs/spark.md ("From DataFrames to tasks")."""

from __future__ import annotations

import os
import re
import sys

from ..storage.errors import ConfigError


def local_spark(app_name: str, master: str = "local[*]", *, shuffle_partitions: int = 2, **conf):
    """A local SparkSession (loopback only, no UI, UTC, Python workers on this interpreter, the data
    sources registered); ``conf`` adds settings: ``**{"spark.driver.memory": "1g"}``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from . import register

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", "127.0.0.1")  # else the host name's address, with a warning
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config(map=conf)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


# applicationId of each SparkContext whose workers imported celery_pq
_checked: set[str] = set()

# In Spark's error text: the last line of a Python traceback ("ModuleNotFoundError: ..."), else
# what the task failed with ("java.io.IOException: Cannot run program ...")
_PYTHON_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception): .+)$", re.MULTILINE)
_TASK_FAILURE = re.compile(r"most recent failure: .*?\): (.+)$", re.MULTILINE)


def check_python_workers(spark) -> None:
    """Raise ``ConfigError`` (one line) unless a Python worker of ``spark`` can import celery_pq."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext on this side
        return
    if sc.applicationId in _checked:
        return

    # Nested: cloudpickle sends it by value, so a worker without celery_pq can run it.
    def probe(_):
        import importlib.util
        import sys

        return sys.executable, importlib.util.find_spec("celery_pq") is not None

    python = getattr(sc, "pythonExec", None) or "python3"
    try:
        [(worker_python, found)] = sc.parallelize([0], 1).map(probe).collect()
    except Exception as exc:
        raise ConfigError(_message(python, f"cannot run a one-row job ({_why(str(exc))})")) from None
    if not found:
        raise ConfigError(_message(worker_python, "cannot import celery_pq"))
    _checked.add(sc.applicationId)


def _why(text: str) -> str:
    """The line of Spark's error text that says what went wrong, at most 300 characters."""
    python = _PYTHON_ERROR.findall(text)
    task = _TASK_FAILURE.search(text)
    why = python[-1] if python else task[1] if task else (text.strip().splitlines() or ["?"])[0]
    return why.strip()[:300]


def _message(python: str, what: str) -> str:
    return (
        f"Spark's Python workers ({python}) {what}: set PYSPARK_PYTHON to the Python that has "
        f"celery-pq installed, e.g. PYSPARK_PYTHON={sys.executable} (os.environ['PYSPARK_PYTHON'] = "
        "sys.executable), before the SparkSession starts"
    )
