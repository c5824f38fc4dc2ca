"""kombu's own transport-agnostic integration tests, run against ``pq://``.

The tests are kombu's, unchanged: ``t/integration/common.py`` of the installed kombu's source
distribution, which ``python -m tests.peers.run kombu`` downloads, unpacks and names in
``PQ_PEER_SOURCE``. This file only does what kombu's own ``t/integration/test_redis.py`` does
for ``redis://``: subclass its base classes and give them a ``connection`` (here to a
redis-server these tests start, with a key prefix of their own per test, never the machine's
Redis). The tests that cannot pass, and why, are in ``expected_failures.txt`` beside this file.

Not collected by ``make test`` (its name does not start with ``test_``): the runner names it.
"""

from __future__ import annotations

import os
import socket
import sys

import kombu
import pytest

_SOURCE = os.environ.get("PQ_PEER_SOURCE")
if not _SOURCE:
    pytest.skip(
        "kombu's integration tests come from its source distribution: run `python -m tests.peers.run kombu`",
        allow_module_level=True,
    )
sys.path.insert(0, _SOURCE)

from t.integration import common  # noqa: E402 - from the unpacked source named above
from t.integration.common import (  # noqa: E402
    BaseExchangeTypes,
    BaseFailover,
    BaseMessage,
    BasePriority,
    BaseTimeToLive,
    BasicFunctionality,
)

import celery_pq  # noqa: E402,F401 - registers the pq:// scheme with kombu


@pytest.fixture
def url(redis_server):
    return f"pq://127.0.0.1:{redis_server.port}/0"


@pytest.fixture
def connection(url, key_prefix):
    return kombu.Connection(url, transport_options={"key_prefix": key_prefix})


@pytest.fixture
def refused_port():
    """A port bound and not listening: a connection to it is refused, and no other process can
    take it while the test runs."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def invalid_connection(refused_port, key_prefix):
    return kombu.Connection(f"pq://127.0.0.1:{refused_port}/0", transport_options={"key_prefix": key_prefix})


@pytest.fixture
def failover_connection(refused_port, redis_server, key_prefix):
    """kombu's failover: the first URL refuses, the alternate is the live server."""
    return kombu.Connection(
        f"pq://127.0.0.1:{refused_port}/0;pq://127.0.0.1:{redis_server.port}/0",
        transport_options={"key_prefix": key_prefix},
    )


class TestPqBasicFunctionality(BasicFunctionality):
    pass


class TestPqExchangeTypes(BaseExchangeTypes):
    pass


class TestPqTimeToLive(BaseTimeToLive):
    pass


class TestPqPriority(BasePriority):
    """The default ``priority_order="higher_first"``: AMQP's meaning, as py-amqp."""

    PRIORITY_ORDER = "asc"


class TestPqPriorityLowerFirst(BasePriority):
    """``priority_order="lower_first"``: the meaning of kombu's Redis transport."""

    PRIORITY_ORDER = "desc"

    @pytest.fixture
    def connection(self, url, key_prefix):
        return kombu.Connection(url, transport_options={"key_prefix": key_prefix, "priority_order": "lower_first"})


class TestPqMessage(BaseMessage):
    pass


if hasattr(common, "BaseEventLoop"):  # (kombu 5.5 and later)

    class TestPqEventLoop(common.BaseEventLoop):
        pass


class TestPqFailover(BaseFailover):
    pass
