"""Fixtures of the transport tests."""

import pytest


@pytest.fixture
def url(redis_server):
    """The ``pq://`` URL of the test's own redis-server."""
    return f"pq://127.0.0.1:{redis_server.port}/0"
