"""The dashboard's HTTP server: ``GET /`` the page, ``GET /api/state`` (``Board.state``), ``POST
/api/<action>`` only with actions allowed and the token in ``X-PQ-Token``. Beyond loopback the state
needs the token too; on loopback only a loopback Host header is answered (DNS rebinding)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
from contextlib import suppress
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

import redis

from ...storage.errors import ConfigError
from ...transport.broker import Broker, queue_and_view, queue_names
from ..http_deadline import REQUEST_TIMEOUT_SECONDS, DeadlineHandler
from .board import ACTIONS, SAMPLE_SECONDS, WINDOW_SECONDS, Board, BoardError

logger = logging.getLogger("celery_pq.ops.dashboard")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8808
#: Shortest token accepted from --token (a generated one is 32 URL-safe characters).
MIN_TOKEN_LENGTH = 16
#: Largest request body an action reads (an action is a few short fields).
MAX_BODY_BYTES = 4096

#: Host header names a loopback server answers to (besides loopback addresses).
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}


def _is_loopback(host: object) -> bool:
    """Is ``host`` (from a socket address: maybe not text) a loopback address?"""
    if not isinstance(host, str):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listens_on_loopback(host: str) -> bool:
    """Is a server bound to ``host`` (an address or a name) reachable from this machine only?"""
    if _is_loopback(host) or host.lower() in LOOPBACK_NAMES:
        return True
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(_is_loopback(info[4][0]) for info in infos)


def check_token(token: str | None, allow_actions: bool, loopback: bool = True) -> str | None:
    """The token actions need, and the state beyond loopback: the one given, or a new random
    one; None when neither needs one. ValueError names what is wrong with a given token."""
    if not allow_actions and loopback:
        if token is not None:
            raise ValueError(
                "a token is only used with actions allowed (--allow-actions) or with a --host beyond loopback"
            )
        return None
    if token is None:
        return secrets.token_urlsafe(24)
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
        raise ValueError(f"the token must be at least {MIN_TOKEN_LENGTH} printable ASCII characters")
    return token


class DashboardServer(ThreadingHTTPServer):
    """Serves one Board; samples its delivery totals every ``sample_seconds`` in a thread."""

    def __init__(
        self,
        board: Board,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        allow_actions: bool = False,
        token: str | None = None,
        sample_seconds: float = SAMPLE_SECONDS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
    ):
        self.board = board
        self.allow_actions = bool(allow_actions)
        self.sample_seconds = float(sample_seconds)
        self.request_timeout = float(request_timeout)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, name="pq-dashboard-sampler", daemon=True)
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.address_family = info[0]  # (an IPv6 address is served too)
        super().__init__((str(info[4][0]), port), _Handler)
        self.host = str(self.server_address[0])  # the address bound (a name given is resolved)
        #: Bound to a loopback address: else the state, too, needs the token.
        self.loopback = _is_loopback(self.host)
        try:
            self.token = check_token(token, self.allow_actions, self.loopback)
        except ValueError:
            self.server_close()
            raise

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server_port}/"

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if not self._sampler.is_alive():
            self._sampler.start()
        super().serve_forever(poll_interval)

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()

    def _sample_loop(self) -> None:
        while True:
            try:
                self.board.sample()
            except redis.RedisError as exc:  # Redis away for a while: the page says so; keep trying
                logger.warning("dashboard: could not sample the delivery counters: %s", exc)
            except Exception:  # anything else, once per interval: the shares stop, the page goes on
                logger.exception("dashboard: sampling the delivery counters failed")
            if self._stop.wait(self.sample_seconds):
                return

    def host_allowed(self, header: str | None) -> bool:
        """Does a request's Host header name this server? Always, unless it listens on loopback."""
        if not self.loopback:
            return True
        if not header:
            return False
        host = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        return host.strip("[]").lower() in LOOPBACK_NAMES or _is_loopback(host.strip("[]"))

    def token_matches(self, given: str | None) -> bool:
        """Is ``given`` (a request's X-PQ-Token) the token? Compared in constant time."""
        return self.token is not None and given is not None and hmac.compare_digest(given.encode(), self.token.encode())


class _Handler(DeadlineHandler, BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "celery-pq-dashboard"

    def log_message(self, format, *args):  # requests at debug level, not on stderr
        logger.debug("dashboard: %s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._answer(self._get, "read")

    def do_POST(self):
        self._answer(self._post, "reach")

    def _answer(self, handle, verb: str) -> None:
        """Run ``handle(path)``; its refusal (BoardError) or Redis's (503) as ``{"error": ...}``."""
        path = self.path.split("?", 1)[0]
        try:
            if not self.server.host_allowed(self.headers.get("Host")):
                raise BoardError(
                    HTTPStatus.MISDIRECTED_REQUEST, "this dashboard answers only to a loopback Host header"
                )
            status, reply = int(HTTPStatus.OK), handle(path)
        except BoardError as exc:
            status, reply = exc.status, {"error": str(exc)}
        except redis.RedisError as exc:
            status, reply = HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"cannot {verb} the queues: {exc}"}
        if reply is not None:  # (None: a static file, sent)
            self._send(status, json.dumps(reply).encode(), "application/json")

    def _get(self, path: str) -> dict | None:
        if path in _STATIC:
            name, content_type = _STATIC[path]
            self._send(HTTPStatus.OK, resources.files(__package__).joinpath("static", name).read_bytes(), content_type)
            return None
        if path != "/api/state":
            raise BoardError(HTTPStatus.NOT_FOUND, f"nothing at {path}")
        if not (self.server.loopback or self.server.token_matches(self.headers.get("X-PQ-Token"))):
            raise BoardError(
                HTTPStatus.UNAUTHORIZED,
                "this dashboard listens beyond loopback: its state needs the token (header X-PQ-Token)",
            )
        return {**self.server.board.state(), "actions": list(ACTIONS) if self.server.allow_actions else []}

    def _post(self, path: str) -> dict:
        action = path.removeprefix("/api/")
        if not path.startswith("/api/") or action not in ACTIONS:
            raise BoardError(HTTPStatus.NOT_FOUND, f"nothing at {path}")
        if not self.server.allow_actions:
            raise BoardError(HTTPStatus.FORBIDDEN, "this dashboard is read-only (start it with --allow-actions)")
        if not self.server.token_matches(self.headers.get("X-PQ-Token")):
            raise BoardError(HTTPStatus.FORBIDDEN, "missing or wrong token (header X-PQ-Token)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:  # (read(-1) would read until the client closes)
            raise BoardError(HTTPStatus.BAD_REQUEST, "Content-Length is not a number of bytes >= 0")
        if length > MAX_BODY_BYTES:
            raise BoardError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a request body holds at most {MAX_BODY_BYTES} bytes"
            )
        try:
            request = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            raise BoardError(HTTPStatus.BAD_REQUEST, f"the request body is not JSON: {exc}") from None
        return self.server.board.act(action, request)


def run(broker, queues=(), *, window: float = WINDOW_SECONDS, echo=print, **options) -> None:
    """Serve the dashboard of ``broker`` (a ``Broker``, a Celery app or a URL) until interrupted, of
    ``queues`` or every declared one; ``options``: DashboardServer's (host, port, allow_actions, token)."""
    with Broker.of(broker).channel() as channel:
        board = Board(
            lambda: queue_names(channel, queues), lambda name: queue_and_view(channel, name)[0], window=window
        )
        try:
            server = DashboardServer(board, **options)
        except OSError as exc:  # the port is taken, the address is not this machine's, ...
            where = f"{options.get('host', DEFAULT_HOST)}:{options.get('port', DEFAULT_PORT)}"
            raise ConfigError(f"the dashboard cannot listen on {where}: {exc.strerror or exc}") from None
        except ValueError as exc:  # a token given where none is used, or too short
            raise ConfigError(str(exc)) from None
        with server, suppress(KeyboardInterrupt):
            mode = "with actions allowed" if server.allow_actions else "(read-only)"
            if server.token is not None:
                needs = "" if server.loopback else " (the page's state needs it too: this address is beyond loopback)"
                echo(f"celery-pq dashboard on {server.url} {mode}; token: {server.token}{needs}")
                echo(f"open {server.url}#token={server.token}")
            else:
                echo(f"celery-pq dashboard on {server.url} {mode}")
            server.serve_forever()
