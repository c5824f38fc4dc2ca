"""enqueue() keeps the broker's password out of Spark's options, plans and UI."""

from __future__ import annotations

import pytest

from celery_pq.queue import QueueSettings, open_queue
from celery_pq.spark import enqueue
from celery_pq.testing import RedisServer

pytestmark = pytest.mark.spark

PASSWORD = "s3cret-Pw"


def sql_plans(spark) -> list[str]:
    """The plan and description of every SQL execution so far, as Spark's UI shows them."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    out = []
    for i in range(executions.size()):
        e = executions.apply(i)
        out.append(f"{e.description()}\n{e.details()}\n{e.physicalPlanDescription()}")
    return out


def test_enqueue_keeps_the_broker_password_out_of_spark(spark, key_prefix):
    # Given a redis-server that needs a password, and Spark's UI showing the logical plans too
    server = RedisServer(config={"requirepass": PASSWORD})
    spark.conf.set("spark.sql.ui.explainMode", "extended")
    try:
        df = spark.createDataFrame([(1,), (2,), (3,)], "n long")
        # When rows are enqueued with a broker URL carrying it
        result = enqueue(df, f"pq://:{PASSWORD}@127.0.0.1:{server.port}/0", "proj.t", args=["n"], key_prefix=key_prefix)
        # Then the rows are queued (the executors had the password)
        client = server.client(decode_responses=False)
        try:
            assert (result.sent, result.rejected) == (3, 0)
            assert open_queue(client, "celery", QueueSettings(key_prefix=key_prefix), declare=False).size() == 3
        finally:
            client.close()
        # and no plan Spark recorded holds it, while the write's own plan is there
        plans = sql_plans(spark)
        assert any(f"127.0.0.1:{server.port}" in p for p in plans)
        assert not [p for p in plans if PASSWORD in p]
    finally:
        spark.conf.unset("spark.sql.ui.explainMode")
        server.close()
