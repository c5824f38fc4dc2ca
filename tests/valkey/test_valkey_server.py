"""The leg really runs on Valkey 8: the shared server, a test's own and one a test starts itself."""

from celery_pq.testing import RedisServer


def major_valkey_version(client) -> int:
    info = client.info("server")
    assert info.get("server_name") == "valkey", info
    return int(str(info["valkey_version"]).split(".")[0])


def test_the_shared_server_is_valkey_8(redis_client):
    assert major_valkey_version(redis_client) >= 8


def test_a_fresh_server_and_one_a_test_starts_are_valkey_8(fresh_redis):
    with fresh_redis.client() as client:
        assert major_valkey_version(client) >= 8
    with RedisServer() as server, server.client() as client:
        assert major_valkey_version(client) >= 8
