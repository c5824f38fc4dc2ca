"""``celery_pq.ops.otel`` without the ``[otel]`` extra (opentelemetry not importable, as after
``pip install celery-pq``): the import fails naming the extra; the transport never imports it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = 'import sys\nsys.modules["opentelemetry"] = None\n'


def run_without_otel(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED + textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_import_names_the_extra():
    done = run_without_otel(
        """
        try:
            import celery_pq.ops.otel
        except ImportError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'celery-pq[otel]'" in done.stdout
    assert done.stdout.startswith("celery_pq.ops.otel needs the [otel] extra")


def test_the_transport_imports_without_it():
    done = run_without_otel(
        """
        import celery_pq, celery_pq.transport.channel, celery_pq.transport.delivery
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
