"""The core without the ``[ops]`` extra: a process where prometheus_client and rich cannot be
imported (as after ``pip install celery-pq``) still imports the transport and runs the commands
that need neither; ``pq metrics`` says in one line which extra it needs. make release-check
installs the wheel into a clean virtualenv and checks that neither package is there."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# Run in a child: block both packages as if they were not installed, then run the code.
BLOCKED = textwrap.dedent(
    """
    import sys
    sys.modules["prometheus_client"] = None
    sys.modules["rich"] = None
    """
)


def run_without_ops(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKED + textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_transport_and_cli_import_without_the_extra():
    done = run_without_ops(
        """
        import celery_pq, celery_pq.transport.channel, celery_pq.autoscale, celery_pq.ops.cli, celery_pq.ops.dashboard
        print("imported")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported"


def test_metrics_command_names_the_extra(redis_url):
    done = run_without_ops(
        f"""
        from celery_pq.__main__ import main
        main(["--broker", {redis_url!r}, "metrics", "--port", "0"])
        """
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: celery_pq.ops.metrics needs the [ops] extra (prometheus_client): pip install 'celery-pq[ops]'"
    )


def test_stats_prints_plain_tables_without_rich(redis_url, key_prefix):
    url = redis_url.replace("redis://", "pq://", 1)
    done = run_without_ops(
        f"""
        import sys
        from kombu import Connection
        import celery_pq
        with Connection({url!r}, transport_options={{"key_prefix": {key_prefix!r}}}) as conn:
            conn.SimpleQueue("jobs").put({{"n": 1}}, priority=7)
        sys.stdout.isatty = lambda: True  # a terminal: rich would draw here, were it installed
        from celery_pq.__main__ import main
        main(["--broker", {url!r}, "--transport-options", '{{"key_prefix": "{key_prefix}"}}', "stats"])
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.split()[:2] == ["jobs", "1"] for line in lines if line.strip()), done.stdout
