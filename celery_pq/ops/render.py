"""How the commands show rows: rich tables on a terminal when rich (``[ops]``) is installed, else
plain aligned text for ``grep`` and ``awk``; what a stored message says (``describe``)."""

from __future__ import annotations

import base64
import json
import sys
import time
from contextlib import suppress
from datetime import UTC, datetime
from importlib.util import find_spec

import click

from ..storage.codec import VERSION, CodecError, decode


def rich_terminal() -> bool:
    return sys.stdout.isatty() and find_spec("rich") is not None


def table(title: str | None, columns: list, rows: list, *, empty: str = "(none)"):
    """``rows`` (lists, or dicts read by key) under ``columns``, each a header (a dict row's key too)
    or (header, key or function of the row): a rich Table on a terminal, else padded text."""

    def cell(r, i, c):
        if isinstance(c, tuple):
            return c[1](r) if callable(c[1]) else r[c[1]]
        return r[c] if isinstance(r, dict) else r[i]

    heads = [c[0] if isinstance(c, tuple) else c for c in columns]
    cells = [[str(v) if (v := cell(r, i, c)) is not None else "-" for i, c in enumerate(columns)] for r in rows]
    if rich_terminal():
        from rich.table import Table

        t = Table(title=title, title_justify="left", caption=None if rows else empty)
        for h in heads:
            t.add_column(h, overflow="fold")
        for row in cells:
            t.add_row(*row)
        return t
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join(([title] if title else []) + [fmt(heads)] + ([fmt(r) for r in cells] or [empty]))


def show(*parts) -> None:
    """Print tables or text: through rich on a terminal, plainly otherwise."""
    if rich_terminal():
        from rich.console import Console

        console = Console()
        for p in parts:
            console.print(p)
    else:
        click.echo("\n\n".join(str(p) for p in parts))


def watch(make, seconds: float) -> None:
    """Show ``make()`` (a list of tables) every ``seconds`` until Ctrl-C: in place on a terminal."""
    with suppress(KeyboardInterrupt):
        if rich_terminal():
            from rich.console import Group
            from rich.live import Live

            with Live(Group(*make()), auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(seconds)
                    live.update(Group(*make()), refresh=True)
        else:
            while True:
                click.echo(f"-- {when(int(time.time() * 1000))} UTC")
                show(*make())
                click.echo("", nl=True)
                sys.stdout.flush()
                time.sleep(seconds)


def age(seconds: float | None) -> str:
    """``"-"``, ``"4.2s"``, ``"3m05s"`` or ``"2h10m"``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def when(ms: int | None) -> str:
    """A Unix time in ms as UTC ``YYYY-MM-DD HH:MM:SS``."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


#: Characters of an args preview at most (the rest is cut with "...").
PREVIEW_CHARS = 60


def describe(payload: bytes | str, width: int = PREVIEW_CHARS) -> dict:
    """``{"task": name or None, "args": preview}`` of a stored payload, never raising: not a kombu
    message, its text; a stored form that cannot be read, ``unreadable: <why>``."""
    try:
        message = decode(payload)
    except CodecError as exc:
        head = payload[:1] if isinstance(payload, bytes) else payload[:1].encode()
        if head == bytes((VERSION,)):  # the stored form, not readable
            why = str(exc).removeprefix("stored message's ").removeprefix("stored message ")
            return {"task": None, "args": _cut(f"unreadable: {why}", width)}
        message = None
    except Exception:
        message = None
    if not isinstance(message, dict) or "body" not in message:
        return {"task": None, "args": _cut(_text(payload), width)}
    headers = message.get("headers") or {}
    task = headers.get("task") if isinstance(headers, dict) else None
    if isinstance(headers, dict) and ("argsrepr" in headers or "kwargsrepr" in headers):
        args = _join(headers.get("argsrepr"), headers.get("kwargsrepr"))
    else:
        args = _body_preview(message)
    return {"task": task, "args": _cut(args, width)}


def _body_preview(message: dict) -> str:
    body = message.get("body")
    if not isinstance(body, (str, bytes, bytearray)):
        return _text(body)
    props = message.get("properties") or {}
    try:
        if isinstance(props, dict) and props.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        if message.get("content-type") == "application/json":
            decoded = json.loads(body)
            # Celery protocol 2: [args, kwargs, embed]
            if (
                isinstance(decoded, list)
                and len(decoded) == 3
                and isinstance(decoded[0], list)
                and isinstance(decoded[1], dict)
            ):
                return _join(repr(tuple(decoded[0])), repr(decoded[1]))
            return json.dumps(decoded)
    except (ValueError, TypeError):
        pass
    return _text(body)


def _join(args, kwargs) -> str:
    parts = [a for a in (args, kwargs) if a and a not in ("()", "{}")]
    return " ".join(parts) if parts else "()"


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
