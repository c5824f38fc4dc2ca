"""Fixtures of the cluster tests: one local Redis Cluster for the session (3 masters, each with a
replica: ``celery_pq.testing.RedisCluster``), and queue names whose hash tags land on different
masters. A test that kills a master restarts it before it ends (it rejoins as a replica), so the
next test finds three masters with a replica each again."""

from __future__ import annotations

import uuid

import pytest

from celery_pq.testing import RedisCluster


@pytest.fixture(scope="session")
def cluster():
    with RedisCluster() as c:
        yield c


@pytest.fixture
def cluster_client(cluster):
    client = cluster.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def spread(cluster):
    """Three queue names of this test, one per master (their hash tags land on different masters)."""
    return cluster.tags_on_distinct_masters(prefix=f"q{uuid.uuid4().hex[:6]}-")


@pytest.fixture
def healed(cluster):
    """The cluster, made whole again after the test (killed nodes restarted as replicas)."""
    yield cluster
    for node in cluster.nodes:
        if not node.running:
            cluster.restart(node)
