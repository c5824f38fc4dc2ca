"""Loads the Lua scripts once per process and hands out redis-py ``Script`` objects.

One file per atomic operation under ``lua/``; a line ``--!include name.lua`` is replaced by
``lua/includes/name.lua``. redis-py's ``Script`` runs EVALSHA, reloads on NOSCRIPT and works
inside pipelines, so there is no SHA cache of our own.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from importlib import resources

import redis
from redis.exceptions import NoScriptError

SCRIPT_NAMES = (
    "insert",
    "pop",
    "pop_fair",
    "ack",
    "extend",
    "requeue",
    "reclaim",
    "remove",
    "peek",
    "retrieve_by_priority",
    "remove_highest",
    "change_priority",
    "cleanup",
    "purge",
)

_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.M)


@lru_cache(maxsize=None)
def source(name: str) -> str:
    """The full text of one script, includes pasted in."""
    root = resources.files(__package__) / "lua"
    text = (root / f"{name}.lua").read_text(encoding="utf-8")
    return _INCLUDE.sub(lambda m: (root / "includes" / m.group(1)).read_text(encoding="utf-8"), text)


@lru_cache(maxsize=None)
def header(name: str) -> str:
    """The leading comment block of a script file (without includes)."""
    root = resources.files(__package__) / "lua"
    lines = []
    for line in (root / f"{name}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--") or line.startswith("--!"):
            break
        lines.append(line)
    return "\n".join(lines)


class Scripts:
    """The registered scripts, as attributes: ``scripts.pop(keys=..., args=..., client=...)``."""

    def __init__(self, client: redis.Redis):
        for name in SCRIPT_NAMES:
            setattr(self, name, client.register_script(source(name)))


_lock = threading.Lock()
_scripts: Scripts | None = None


def get_scripts(client: redis.Redis) -> Scripts:
    """Process-wide ``Scripts``; each call site passes its own client (``client=``)."""
    global _scripts
    if _scripts is None:
        with _lock:
            if _scripts is None:
                _scripts = Scripts(client)
    return _scripts


def run_calls(client: redis.Redis, calls: list[tuple]) -> list:
    """Run several script calls ``(Script, keys, args)`` in one round trip.

    A pipeline of plain EVALSHA: redis-py's own script pipelining asks SCRIPT EXISTS first,
    a second round trip. A call that finds its script missing (Redis restarted) did not run;
    it is run again on its own, which loads the script.
    """
    if not calls:
        return []
    if len(calls) == 1:  # one call needs no pipeline (Script reloads itself on NOSCRIPT)
        script, keys, args = calls[0]
        return [script(keys=keys, args=args, client=client)]
    with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = pipe.execute(raise_on_error=False)
    for i, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            script, keys, args = calls[i]
            replies[i] = script(keys=keys, args=args, client=client)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
