"""The deployment options (Sentinel, WAIT, TLS): each bad value is refused with a ConfigError
naming it, before any connection is made (no Redis)."""

import pytest
import redis
from kombu import Connection
from redis.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

import celery_pq  # noqa: F401  registers pq:// and pqs://
from celery_pq import ConfigError
from celery_pq.storage.connections import SENTINEL_PORT, make_pool, tls_arguments, url_addresses
from celery_pq.transport.options import Options


@pytest.mark.parametrize(
    "given, named",
    [
        ({"master_name": ""}, "master_name"),
        ({"master_name": "my master"}, "master_name"),
        ({"master_name": 3}, "master_name"),
        ({"master_name": "m", "sentinel_kwargs": "password"}, "sentinel_kwargs"),
        ({"master_name": "m", "sentinel_kwargs": {1: 2}}, "sentinel_kwargs"),
        ({"master_name": "m", "min_other_sentinels": -1}, "min_other_sentinels"),
        ({"master_name": "m", "min_other_sentinels": 1.5}, "min_other_sentinels"),
        ({"sentinel_kwargs": {"password": "x"}}, "need master_name"),
        ({"min_other_sentinels": 1}, "need master_name"),
        ({"wait_replicas": -1}, "wait_replicas"),
        ({"wait_replicas": True}, "wait_replicas"),
        ({"wait_replicas": "1"}, "wait_replicas"),
        ({"wait_timeout": 0}, "wait_timeout"),
        ({"wait_timeout": "1s"}, "wait_timeout"),
    ],
)
def test_a_bad_deployment_option_is_named(given, named):
    with pytest.raises(ConfigError, match=named):
        Options.from_transport_options(given)


def test_wait_options_reach_the_queue():
    settings = Options.from_transport_options({"wait_replicas": 2, "wait_timeout": 0.5}).queue_settings("q")
    assert (settings.wait_replicas, settings.wait_timeout) == (2, 0.5)
    assert Options().queue_settings("q").wait_replicas == 0  # off by default


def test_the_hosts_of_a_sentinel_url_are_the_sentinels():
    conn = Connection("pq://:pw@s1:26380;pq://s2;pq://10.0.0.3:26381/2")
    assert url_addresses(conn, SENTINEL_PORT) == [("s1", 26380), ("s2", 26379), ("10.0.0.3", 26381)]
    assert url_addresses(Connection("pq://s9"), SENTINEL_PORT) == [("s9", 26379)]


def test_a_sentinel_pool_goes_to_the_named_master_with_the_first_urls_password_and_db():
    conn = Connection("pqs://:pw@s1:26380;pqs://s2:26380/2", ssl={"ssl_cert_reqs": "none"})
    pool = make_pool(
        conn, Options.from_transport_options({"master_name": "main", "min_other_sentinels": 1}), conn.transport.tls
    )
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "main"
    assert pool.connection_class is SentinelManagedSSLConnection
    assert (pool.connection_kwargs["password"], pool.connection_kwargs["db"]) == ("pw", 2)
    assert pool.connection_kwargs["ssl_cert_reqs"] == "none"
    manager = pool.sentinel_manager
    assert manager.min_other_sentinels == 1 and len(manager.sentinels) == 2
    # the sentinels get a socket timeout of their own: a hung one must not stall discovery
    assert manager.sentinels[0].connection_pool.connection_kwargs["socket_timeout"] == 1.0


def test_the_database_of_a_url_of_several_hosts():
    from celery_pq.storage.connections import broker_db

    assert broker_db(Connection("pq://s1;pq://s2/3")) == 3
    assert broker_db(Connection("pq://s1/3;pq://s2/3")) == 3
    assert broker_db(Connection("pq://s1;pq://s2")) == 0
    with pytest.raises(ConfigError, match="different databases"):
        broker_db(Connection("pq://s1/1;pq://s2/2"))


def test_a_plain_url_gives_a_plain_pool():
    conn = Connection("pq://h:6380/1")
    pool = make_pool(conn, Options(), conn.transport.tls)
    assert type(pool) is redis.ConnectionPool and pool.connection_class is redis.Connection


@pytest.mark.parametrize(
    "ssl, named", [({"cert_reqs": "required"}, "'cert_reqs' not known"), ("yes", "broker_use_ssl must be")]
)
def test_bad_tls_settings_are_named(ssl, named):
    with pytest.raises(ConfigError, match=named):
        tls_arguments(ssl)


def test_cluster_option_is_a_flag():
    assert Options().cluster is False
    assert Options.from_transport_options({"cluster": True}).cluster is True
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="cluster must be True or False"):
            Options.from_transport_options({"cluster": bad})


def test_the_hosts_of_a_cluster_url_are_seed_nodes_and_slots_group_blocking_keys():
    from celery_pq.storage.connections import make_cluster, slot_groups, url_addresses

    conn = Connection("pq://:pw@n1:7000;pq://n2;pq://10.0.0.3:7001")
    assert url_addresses(conn, 6379) == [("n1", 7000), ("n2", 6379), ("10.0.0.3", 7001)]
    with pytest.raises(ConfigError, match="only database 0"):
        make_cluster(Connection("pq://n1:7000/2"), Options(cluster=True), False)
    with pytest.raises(ConfigError, match="exclude each other"):
        make_cluster(conn, Options(cluster=True, master_name="m"), False)
    # one server: every key in one BLPOP
    assert slot_groups(redis.Redis(), ["pq:{a}:wk", "pq:{b}:wk"]) == {None: ["pq:{a}:wk", "pq:{b}:wk"]}
    assert slot_groups(redis.Redis(), []) == {}
