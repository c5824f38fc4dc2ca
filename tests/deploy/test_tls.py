"""TLS: ``pqs://`` against a redis-server that speaks only TLS, with a CA and server certificate
made here (``openssl``); certificate options passed the kombu way (kombu's ``ssl=``, Celery's
``broker_use_ssl``)."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu import Connection

import celery_pq  # noqa: F401  registers pq:// and pqs://
from celery_pq import ConfigError
from celery_pq.testing import RedisServer, TLSRedisServer, celery_env, make_certificates, start_worker, wait_for
from tests.support.consume import drain, make_queue, publish_numbers

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("other-ca"), name="another CA")


@pytest.fixture(scope="module")
def tls_server(certs):
    server = TLSRedisServer(certs)
    try:
        yield server
    finally:
        server.close()


def tls_url(server) -> str:
    return f"pqs://127.0.0.1:{server.port}/0"


def test_publish_and_consume_over_tls_with_the_ca_given_the_kombu_way(tls_server, certs, key_prefix):
    use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(certs["ca"])}
    queue = make_queue("tq")
    with Connection(tls_url(tls_server), ssl=use_ssl, transport_options={"key_prefix": key_prefix}) as conn:
        publish_numbers(conn, queue, range(20))
        got = drain(conn, queue, 20)
        pool = conn.default_channel.client.connection_pool
    assert sorted(body["i"] for body, _ in got) == list(range(20))
    assert issubclass(pool.connection_class, redis.SSLConnection)
    with pytest.raises(redis.ConnectionError):  # and the server takes nothing but TLS
        redis.Redis(port=tls_server.port, socket_timeout=2).ping()


@pytest.mark.e2e
def test_a_celery_worker_over_tls_with_broker_use_ssl(tls_server, certs, key_prefix, tmp_path):
    use_ssl = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(certs["ca"])}
    records = RedisServer()
    worker = None
    try:
        options = {"key_prefix": key_prefix}
        env = celery_env(
            ROOT,
            PQ_TEST_BROKER=tls_url(tls_server),
            PQ_TEST_OPTIONS=json.dumps(options),
            PQ_TEST_RECORD=records.url,
            PQ_TEST_PREFIX=key_prefix,
            PQ_TEST_SSL=json.dumps(use_ssl),
        )
        worker = start_worker(
            "tests.e2e.app", cwd=ROOT, env=env, name="tls", prefetch_multiplier=None, log=tmp_path / "worker.log"
        )
        app = Celery("tls-producer", broker=tls_url(tls_server))
        app.conf.broker_transport_options = options
        app.conf.broker_use_ssl = use_ssl
        for n in range(20):
            app.send_task("e2e.record", args=[n, None], queue="q")
        rec = records.client()

        def all_ran():
            assert worker.poll() is None, worker.log_text()
            return rec.llen(f"{key_prefix}:rec:order") >= 20

        wait_for(all_ran, 60, lambda: f"the 20 tasks to run; the worker's log:\n{worker.log_text()}", interval=0.1)
        assert sorted(json.loads(x)[0] for x in rec.lrange(f"{key_prefix}:rec:order", 0, -1)) == list(range(20))
        app.close()
    finally:
        if worker is not None:
            worker.stop()
        records.close()


@pytest.mark.parametrize("use_ssl", ["other CA", "system CAs"])
def test_a_server_certificate_from_another_ca_is_refused_with_a_clear_error(tls_server, other_ca, key_prefix, use_ssl):
    ssl_option = (
        {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(other_ca["ca"])} if use_ssl == "other CA" else True
    )
    with Connection(
        tls_url(tls_server),
        ssl=ssl_option,
        transport_options={"key_prefix": key_prefix, "max_retries": 1, "interval_start": 0},
    ) as conn:
        with pytest.raises(Exception) as err:
            conn.default_channel
    message = str(err.value)
    assert "certificate" in message and "verify failed" in message and "ssl_ca_certs" in message, message
    assert isinstance(err.value, redis.ConnectionError) or isinstance(err.value.__cause__, redis.ConnectionError)


def test_an_unknown_tls_option_is_named(tls_server, certs):
    with Connection(tls_url(tls_server), ssl={"ssl_ca_cert": str(certs["ca"])}) as conn:
        with pytest.raises(ConfigError, match="'ssl_ca_cert' not known") as err:
            conn.default_channel
    assert "ssl_ca_certs" in str(err.value)
