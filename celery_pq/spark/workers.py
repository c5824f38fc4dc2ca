"""Whether Spark's Python workers can import celery_pq: asked once per SparkContext by
``register(spark)``.

Spark runs the data sources' code (the ``celery_pq`` writer, the event-log reader) in Python
worker processes started with ``PYSPARK_PYTHON`` (``python3`` from PATH when it is not set), not
with the driver's interpreter. With celery-pq installed in a virtualenv and ``PYSPARK_PYTHON``
unset, those workers run a Python that lacks it, and the first write fails deep in a Spark stack
with ``ModuleNotFoundError: No module named 'celery_pq'``. A one-partition job asks the workers
first, and a ``ConfigError`` says so in one line that names the fix.

Spark Connect sessions have no SparkContext on the client; their server's Python is not ours to
ask, so they are not checked.
"""

from __future__ import annotations

import re
import sys

from ..storage.errors import ConfigError

# applicationId of each SparkContext whose workers imported celery_pq: one job per context
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

    # Defined here, not at module level: cloudpickle sends a nested function by value, so the
    # worker needs nothing of celery_pq to run it (a module-level one is sent by reference and
    # would need this very module).
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
