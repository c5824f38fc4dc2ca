"""How the commands show rows: rich tables on a terminal when rich (the ``[ops]`` extra) is
installed, plain aligned text otherwise, so ``grep`` and ``awk`` work on it (docs/operations.md)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from importlib.util import find_spec

import click


def rich_terminal() -> bool:
    """Draw with rich: a terminal, and rich installed."""
    return sys.stdout.isatty() and find_spec("rich") is not None


def table(title: str | None, columns: list[str], rows: list[list], *, empty: str = "(none)"):
    """A rich Table on a terminal, else the plain text of one (see ``plain``)."""
    if rich_terminal():
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        for c in columns:
            t.add_column(c, overflow="fold")
        for row in rows:
            t.add_row(*("" if v is None else str(v) for v in row))
        if not rows:
            t.caption = empty
        return t
    return plain(title, columns, rows, empty=empty)


def plain(title: str | None, columns: list[str], rows: list[list], *, empty: str = "(none)") -> str:
    """Columns padded to their widest cell, a title line above."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()  # noqa: E731
    lines = [title] if title else []
    lines.append(fmt(columns))
    lines += [fmt(r) for r in cells] or [empty]
    return "\n".join(lines)


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
    """Show ``make()`` (a list of tables) every ``seconds``: in place on a terminal (rich Live),
    as successive blocks with a time line otherwise. Ends on Ctrl-C."""
    try:
        if rich_terminal():
            from rich.console import Group
            from rich.live import Live

            with Live(Group(*make()), auto_refresh=False, screen=False) as live:
                while True:
                    time.sleep(seconds)
                    live.update(Group(*make()), refresh=True)
        else:
            while True:
                click.echo(f"-- {datetime.now(UTC).strftime('%Y-%m-%d %H:%M:%S')} UTC")
                show(*make())
                click.echo("", nl=True)
                sys.stdout.flush()
                time.sleep(seconds)
    except KeyboardInterrupt:
        pass


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
