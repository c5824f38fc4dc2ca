"""The dashboard's HTTP server on a real redis-server, through a kombu channel as the command
uses it: the state it serves, the read-only mode, the token, the actions and their errors."""

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from kombu import Connection, Producer

from celery_pq.ops.dashboard import Board, DashboardServer
from celery_pq.testing import wait_for
from celery_pq.transport.broker import queue_and_view
from tests.support.tenants import pauses

try:
    from support.consume import make_queue
    from support.slow_clients import SLOW_REQUEST, dropped
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.support.consume import make_queue
    from tests.support.slow_clients import SLOW_REQUEST, dropped

TOKEN = "t0ken-for-the-dashboard-test"


@pytest.fixture
def conn(redis_server, key_prefix):
    opts = {"key_prefix": key_prefix, "fair_key": "tenant", "max_deliveries": 1}
    with Connection(f"pq://127.0.0.1:{redis_server.port}/0", transport_options=opts) as c:
        yield c


@pytest.fixture
def serve(conn):
    started = []

    def start(names=("dq",), host="127.0.0.1", **kw):
        channel = conn.default_channel
        board = Board(lambda: list(names), lambda name: queue_and_view(channel, name)[0])
        server = DashboardServer(board, host=host, port=0, sample_seconds=0.2, **kw)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join(5)


def get(server, path):
    with urllib.request.urlopen(server.url + path.lstrip("/"), timeout=5) as reply:
        return reply.status, reply.headers, reply.read()


def post(server, path, body, token=None, raw=None):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["X-PQ-Token"] = token
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path.lstrip("/"), data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def fill(conn, name="dq"):
    """Six entries of priorities 0/100/200 for tenants a and b; one leased, one dead-lettered."""
    q = make_queue(name)
    producer = Producer(conn.default_channel)
    q(conn.default_channel).declare()
    for i in range(6):
        producer.publish(
            {"i": i},
            exchange=q.exchange,
            routing_key=name,
            priority=[0, 100, 200][i % 3],
            headers={"tenant": "ab"[i % 2]},
        )
    pq = conn.default_channel.queue(name)
    leased, doomed = pq.pop(2, consumer="host:1:abc")
    pq.requeue(doomed)  # max_deliveries=1: to the dead-letter queue
    return pq, leased


def test_state_is_the_stats_dict_plus_leases_dead_letters_and_deliveries(conn, serve):
    pq, leased = fill(conn)
    server = serve()
    status, headers, body = get(server, "/api/state")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-store"
    state = json.loads(body)
    assert state["actions"] == []
    [q] = state["queues"]
    expected = json.loads(json.dumps(pq.stats()))  # as `pq stats --json` prints it
    for field in ("waiting", "delayed", "leased", "dead", "per_priority", "index_members"):
        assert q["stats"][field] == expected[field], field
    assert {t: (c["waiting"], c["leased"]) for t, c in q["stats"]["per_tenant"].items()} == {
        t: (c["waiting"], c["leased"]) for t, c in expected["per_tenant"].items()
    }
    assert q["stats"]["waiting"] == 4 and q["stats"]["leased"] == 1 and q["stats"]["dead"] == 1
    [lease] = q["leases"]
    assert lease["id"] == leased.id and lease["consumer"] == "host:1:abc" and lease["priority"] == leased.priority
    assert 0 < lease["seconds_left"] <= 60 and lease["age_seconds"] >= 0
    assert leased.token not in body.decode()  # never the tokens
    [dead] = q["dead_letters"]
    assert dead["reason"] == "max_deliveries" and dead["age_seconds"] >= 0


def test_the_page_and_its_files_are_served_and_unknown_paths_are_404(conn, serve):
    server = serve()
    status, headers, page = get(server, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'src="dashboard.js"' in page and "default-src 'self'" in headers["Content-Security-Policy"]
    assert get(server, "/dashboard.js")[2].startswith(b"// The celery-pq dashboard page")
    assert get(server, "/dashboard.css")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as info:
        get(server, "/../etc/passwd")
    assert info.value.code == 404


def test_read_only_refuses_every_action(conn, serve):
    pq, _ = fill(conn)
    server = serve()
    status, body = post(server, "/api/pause", {"queue": "dq"}, token=TOKEN)
    assert status == 403 and "read-only" in body["error"]
    assert pauses(pq) == (False, [])


@pytest.mark.parametrize("token", [None, "", "wrong-token-of-enough-length", TOKEN + "x"])
def test_actions_need_the_right_token(conn, serve, token):
    pq, _ = fill(conn)
    server = serve(allow_actions=True, token=TOKEN)
    status, body = post(server, "/api/pause", {"queue": "dq"}, token=token)
    assert status == 403 and "token" in body["error"]
    assert pq.recorded()["paused"] is False


def test_pause_and_resume_a_queue_and_a_tenant_with_the_token(conn, serve):
    pq, _ = fill(conn)
    server = serve(allow_actions=True, token=TOKEN)
    assert json.loads(get(server, "/api/state")[2])["actions"] == ["pause", "resume", "replay"]
    status, body = post(server, "/api/pause", {"queue": "dq"}, token=TOKEN)
    assert status == 200 and body["paused"]["queue"] is True
    assert pq.pop(1) == []  # a paused queue delivers nothing
    state = json.loads(get(server, "/api/state")[2])
    assert state["queues"][0]["stats"]["paused"] is True
    assert post(server, "/api/resume", {"queue": "dq"}, token=TOKEN)[0] == 200
    assert post(server, "/api/pause", {"queue": "dq", "tenant": "a"}, token=TOKEN)[0] == 200
    assert pauses(pq) == (False, ["a"])
    assert json.loads(get(server, "/api/state")[2])["queues"][0]["stats"]["paused_tenants"] == ["a"]
    assert post(server, "/api/resume", {"queue": "dq", "tenant": "a"}, token=TOKEN)[0] == 200
    assert pauses(pq) == (False, [])


@pytest.mark.parametrize(
    ("path", "body", "raw", "status", "message"),
    [
        ("/api/pause", None, b"{not json", 400, "not JSON"),
        ("/api/pause", {"queue": "nope"}, None, 404, "no queue named 'nope'"),
        ("/api/pause", {"queue": "dq", "extra": 1}, None, 400, "unknown field"),
        ("/api/resume", {"tenant": "a"}, None, 400, "queue must be a non-empty string"),
        ("/api/launch", {"queue": "dq"}, None, 404, "nothing at /api/launch"),
        ("/api/pause", None, b"x" * 5000, 413, "at most"),
    ],
)
def test_bad_requests_name_the_problem_and_change_nothing(conn, serve, path, body, raw, status, message):
    pq, _ = fill(conn)
    server = serve(allow_actions=True, token=TOKEN)
    got, reply = post(server, path, body, token=TOKEN, raw=raw)
    assert got == status and message in reply["error"]
    assert pauses(pq) == (False, [])


def test_a_tenant_of_a_plain_queue_is_refused(redis_server, key_prefix, serve):
    with Connection(f"pq://127.0.0.1:{redis_server.port}/0", transport_options={"key_prefix": key_prefix}) as plain:
        fill(plain, "plain")
        channel = plain.default_channel
        board = Board(lambda: ["plain"], lambda name: queue_and_view(channel, name)[0])
        server = DashboardServer(board, host="127.0.0.1", port=0, allow_actions=True, token=TOKEN)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            status, body = post(server, "/api/pause", {"queue": "plain", "tenant": "a"}, token=TOKEN)
            assert status == 400 and "not fair" in body["error"]
            assert pauses(channel.queue("plain")) == (False, [])
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


def test_replay_brings_a_dead_letter_back_with_the_token(conn, serve):
    pq, _ = fill(conn)
    [dead] = pq.dead.peek(1)
    server = serve(allow_actions=True, token=TOKEN)
    assert post(server, "/api/replay", {"queue": "dq", "ids": [dead.id]})[0] == 403
    status, body = post(server, "/api/replay", {"queue": "dq", "ids": [dead.id, "no-such-id"]}, token=TOKEN)
    assert status == 200 and list(body["replayed"]) == [dead.id] and body["missing"] == ["no-such-id"]
    stats = json.loads(get(server, "/api/state")[2])["queues"][0]["stats"]
    assert (stats["dead"], stats["waiting"]) == (0, 5)


def test_deliveries_are_sampled_into_tenant_shares(conn, serve):
    pq, _ = fill(conn)
    server = serve()
    time.sleep(0.5)  # a first sample or two
    for lease in pq.pop(3, consumer="host:1:abc"):
        pq.ack(lease)

    def deliveries():
        d = json.loads(get(server, "/api/state")[2])["queues"][0]["deliveries"]
        return d if d["delivered"] == 3 else None

    d = wait_for(deliveries, 5, "3 deliveries on the page", interval=0.1)
    assert sum(t["deliveries"] for t in d["tenants"].values()) == 3
    assert abs(sum(t["share"] for t in d["tenants"].values()) - 1) < 1e-9
    assert d["span_seconds"] > 0 and d["per_second"] > 0


def test_a_redis_that_goes_away_is_a_503_and_the_page_recovers(fresh_redis, key_prefix):
    with Connection(fresh_redis.url.replace("redis://", "pq://"), transport_options={"key_prefix": key_prefix}) as c:
        fill(c, "gone")
        channel = c.default_channel
        board = Board(lambda: ["gone"], lambda name: queue_and_view(channel, name)[0])
        server = DashboardServer(board, host="127.0.0.1", port=0, sample_seconds=0.2)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            assert get(server, "/api/state")[0] == 200
            fresh_redis.kill()
            with pytest.raises(urllib.error.HTTPError) as info:
                get(server, "/api/state")
            assert info.value.code == 503 and "cannot read the queues" in json.loads(info.value.read())["error"]
            fresh_redis.start()  # an empty Redis (no persistence): the queue is back, empty
            deadline = time.monotonic() + 10
            while True:
                try:
                    status, _, body = get(server, "/api/state")
                    break
                except urllib.error.HTTPError:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
            assert status == 200 and json.loads(body)["queues"][0]["stats"]["waiting"] == 0
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("127.0.0.1:8808", True),
        ("localhost:8808", True),
        ("LOCALHOST", True),
        ("[::1]:8808", True),
        ("127.0.0.2", True),
        ("evil.example:8808", False),
        ("evil.example", False),
        ("10.0.0.1:8808", False),
    ],
)
def test_a_loopback_dashboard_answers_only_to_a_loopback_host_header(conn, serve, host, answered):
    server = serve(allow_actions=True, token=TOKEN)
    for method, path in (("GET", "/api/state"), ("POST", "/api/pause")):
        req = urllib.request.Request(
            server.url + path.lstrip("/"),
            method=method,
            headers={"Host": host, "X-PQ-Token": TOKEN},
            data=json.dumps({"queue": "dq"}).encode() if method == "POST" else None,
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                status = reply.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            body = json.loads(exc.read())
        if answered:
            assert status == 200, (method, status)
        else:
            assert status == 421 and "loopback Host" in body["error"], (method, status)
    assert conn.default_channel.queue("dq").recorded()["paused"] is answered


def test_a_request_without_a_host_header_is_refused(conn, serve):
    import http.client

    server = serve()
    c = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    c.putrequest("GET", "/api/state", skip_host=True)
    c.endheaders()
    assert c.getresponse().status == 421
    c.close()


@pytest.mark.parametrize("allow_actions", [False, True])
def test_beyond_loopback_the_state_needs_the_token(conn, serve, allow_actions):
    # Given a dashboard listening on every interface, read-only or with actions, with no token
    # given: it makes one (the command prints it)
    fill(conn)
    server = serve(host="0.0.0.0", allow_actions=allow_actions)
    assert not server.loopback and server.token is not None and len(server.token) >= 16
    port = server.server_address[1]

    def state(token):
        headers = {"Host": "dashboard.example:8808"} | ({} if token is None else {"X-PQ-Token": token})
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/state", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    # Then the state is refused without the token, or with a wrong one, and served with it
    for wrong in (None, "", server.token + "x"):
        status, body = state(wrong)
        assert status == 401 and "X-PQ-Token" in body["error"] and "queues" not in body, (wrong, status)
    status, body = state(server.token)
    assert status == 200 and body["queues"][0]["queue"] == "dq"
    # and the page itself (no data in it) loads without it, to ask for the token
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
        assert reply.status == 200


def test_on_loopback_the_state_needs_no_token(conn, serve):
    server = serve(allow_actions=True, token=TOKEN)
    status, _, body = get(server, "/api/state")
    assert status == 200 and server.loopback and "queues" in json.loads(body)


def test_a_negative_content_length_is_a_400_not_a_read_to_the_end(conn, serve):
    import socket

    pq, _ = fill(conn)
    server = serve(allow_actions=True, token=TOKEN)
    # Given a client that says its body is -1 bytes long and keeps the connection open (reading
    # -1 bytes would wait for it to close)
    head = f"POST /api/pause HTTP/1.1\r\nHost: 127.0.0.1\r\nX-PQ-Token: {TOKEN}\r\nContent-Length: -1\r\n\r\n"
    with socket.create_connection(server.server_address[:2], timeout=5) as sock:
        sock.sendall(head.encode())
        reply = sock.makefile("rb").read()  # the server answers, then closes
    # Then it is refused at once, naming the header, and nothing changes
    status, _, rest = reply.partition(b"\r\n")
    assert status.split()[1] == b"400" and b"Content-Length is not a number of bytes >= 0" in rest
    assert pauses(pq) == (False, [])


def test_a_client_that_sends_nothing_or_a_byte_at_a_time_is_dropped(conn, serve):
    fill(conn)
    server = serve(request_timeout=0.5)
    port = server.server_address[1]
    # A client that connects and sends nothing, and one whose request trickles in, are dropped
    # once the request has not come in request_timeout (each byte in time does not renew it)
    assert dropped(port)
    assert dropped(port, SLOW_REQUEST)
    # and a request that arrives in time is answered
    status, _, body = get(server, "/api/state")
    assert status == 200 and "queues" in json.loads(body)


def test_an_ipv6_loopback_address_is_served_and_needs_no_token(serve):
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"this machine cannot listen on ::1: {exc}")
    server = serve(host="::1")
    assert server.url.startswith("http://[::1]:") and server.loopback and server.token is None
    status, _, body = get(server, "/api/state")
    assert status == 200 and json.loads(body)["queues"][0]["stats"]["waiting"] == 0
