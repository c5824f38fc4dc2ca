"""``register(spark)`` when Spark's Python workers run a Python without celery_pq (celery-pq in a
virtualenv, ``PYSPARK_PYTHON`` not set): one line naming the fix, not a ModuleNotFoundError at the
first write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The driver: this interpreter, with the source tree first on sys.path (not on PYTHONPATH, which
# the workers would inherit); its Spark's workers run PYSPARK_PYTHON, set by the test.
DRIVER = """
import sys
sys.path.insert(0, sys.argv[1])
from celery_pq import ConfigError
from celery_pq.spark.session import local_spark
try:
    spark = local_spark("celery-pq-bare-workers", "local[1]")
except ConfigError as exc:
    print("REFUSED:", exc)
    sys.exit(3)
print("REGISTERED")
spark.stop()
"""


def test_register_names_the_fix_when_the_workers_python_lacks_celery_pq(tmp_path):
    if shutil.which("java") is None:
        pytest.skip("no Java: PySpark needs Java 17 (bash scripts/ensure-java.sh says what to install)")
    # Given a virtualenv without celery-pq (nor anything else) as the workers' Python
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)
    bare_python = str(bare / "bin" / "python")
    assert subprocess.run([bare_python, "-c", "import celery_pq"], capture_output=True).returncode != 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = bare_python

    # When the driver, which has celery_pq, registers the data sources
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150
    )

    # Then it is refused in one line that names the workers' Python and the fix
    out = run.stdout + run.stderr
    assert run.returncode == 3, out[-3000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("REFUSED:")]
    assert run.stdout.strip() == line, run.stdout  # one line, no Spark stack
    assert "cannot import celery_pq" in line and "ModuleNotFoundError" not in line
    assert bare_python in line
    assert f"PYSPARK_PYTHON={sys.executable}" in line


def test_register_passes_when_the_workers_run_this_python(spark):
    # The session fixture's workers run this interpreter (local_spark sets PYSPARK_PYTHON)
    from celery_pq.spark import register
    from celery_pq.spark.session import _checked

    register(spark)
    assert spark.sparkContext.applicationId in _checked
