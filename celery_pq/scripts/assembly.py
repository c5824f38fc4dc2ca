"""The text of each Lua script, and the Redis Functions library of them all.

One file per atomic operation under ``lua/``; a line ``--!include name.lua`` is replaced by
``lua/includes/name.lua``. The line ``--!keys`` in a script becomes the bindings of the key
names its header lists (``local ii, pi = KEYS[1], KEYS[2]``; the fairness keys go in the table
``FK`` of includes/fair.lua), and ``--!queue`` the queue prologue (the context taken off ARGV,
the caller's mode checked). The error codes a script's code names (``NOT_LEASED``, ...) are
pasted in as constants from ``errors.ErrorCode``, the one source of their values.

Where the server has Redis Functions (Redis 7 and later), every script runs as a function of
one library (``library()``): its shared helpers are defined once, when the library is loaded,
instead of on every call as a script's text is (Redis runs a script's whole text, each
``local function`` definition a new closure, on every EVALSHA: about a third of an empty pop's
time). The two forms differ in one way: a function that is not allowed to run when Redis is
full (``maxmemory``, ``noeviction``) is refused before it starts (``WRITES_WHEN_FULL``), where a
script would fail at its first write, perhaps half done.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache

from ..storage.errors import ErrorCode
from ..storage.keys import FAIR_SUFFIXES
from .headers import LUA, Signature, signature

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
    "peek_head",
    "retrieve_by_priority",
    "remove_highest",
    "change_priority",
    "cleanup",
    "purge",
    "migrate",
    "pause",
    "event_log",
    "replay",
)

_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.M)


_FUNCTION = re.compile(r"local function (\w+)\(")
_WORD = re.compile(r"\w+")
_COMMENT = re.compile(r"--.*")
_STRING = re.compile(r"'[^']*'")


@cache
def source(name: str) -> str:
    """The full text of one script: its key bindings, includes and error constants pasted in,
    minus the included helper functions it never calls (Redis runs a script's whole text on
    every call, definitions too)."""
    text = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    text = text.replace("--!keys\n", _bindings(signature(name)), 1)
    return compose(text.replace("--!queue\n", _QUEUE_PROLOGUE, 1))


#: What a ``--!queue`` line stands for: the queue context taken off ARGV, and nothing done when
#: the caller's mode is not the one the queue recorded (see includes/queue.lua).
_QUEUE_PROLOGUE = "take_context()\nlocal bad = mode_error(false)\nif bad then\n  return bad\nend\n"


def compose(text: str) -> str:
    """Lua ``text`` with its ``--!include`` lines replaced by the includes (each once, after
    the includes it names itself), minus the helper functions it never calls, the error codes
    it names defined first (tests run the shared helpers alone through this)."""
    shared = "".join(_include_text(inc) for inc in _includes([text]))
    text = _without_unused_functions(_INCLUDE.sub(lambda m: shared, text, count=1))
    text = _INCLUDE.sub("", text)
    return _error_constants(text) + text


@cache
def _include_text(name: str) -> str:
    """An include's text, its own ``--!include`` lines taken out (``_includes`` orders them)."""
    return _INCLUDE.sub("", (LUA / "includes" / name).read_text(encoding="utf-8"))


def _includes(texts: list[str]) -> list[str]:
    """The includes the ``texts`` name, with those they name in turn, each once and after the
    includes it names (Lua defines a ``local function`` where it stands: a helper comes before
    its callers)."""
    order: list[str] = []
    started: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in started:
            raise ValueError(f"includes/{name} includes itself (through {', '.join(started - set(order))})")
        started.add(name)
        for inner in _INCLUDE.findall((LUA / "includes" / name).read_text(encoding="utf-8")):
            visit(inner)
        order.append(name)

    for text in texts:
        for name in _INCLUDE.findall(text):
            visit(name)
    return order


#: Scripts Redis runs even when it is full (``maxmemory`` reached, ``noeviction``): they deliver,
#: renew, end or give back leases, move or delete entries: what frees memory or adds little
#: beside it. An insert (and a mode migration) is refused whole, before it starts, with Redis's
#: OOM error, so a full Redis refuses new work and still drains what it holds.
WRITES_WHEN_FULL = frozenset(SCRIPT_NAMES) - {"insert", "migrate"}

# Module state of the includes (a table made at the top level, ``local CTX = { n = 0 }``, on one
# line): a library keeps it between calls, so each function starts by making it anew with the
# same constructor, as a script's fresh run does; a table whose line ends "-- kept between
# calls" (a cache) is left as it is.
_STATE = re.compile(r"^local (\w+) = (\{[^\n]*\})[ \t]*(--[^\n]*)?$", re.M)
_KEPT = "-- kept between calls"


@dataclass(frozen=True)
class Library:
    """The Redis Functions library of every script: ``name``, ``text`` (for FUNCTION LOAD) and
    the function name of each script (``functions[script]``)."""

    name: str
    text: str
    functions: dict


@cache
def library() -> Library:
    """Every script as a function of one library. The includes (helpers, constants, error codes)
    are defined once at its top level; each script's own text, with its key bindings and queue
    prologue, is the body of its function. The names carry a hash of the text, so processes of
    two versions of celery-pq can share a Redis, each calling its own functions."""
    root = LUA
    texts = {name: (root / f"{name}.lua").read_text(encoding="utf-8") for name in SCRIPT_NAMES}
    bodies = {}
    for name, text in texts.items():
        text = _INCLUDE.sub("", text).replace("--!keys\n", _bindings(signature(name)), 1)
        bodies[name] = text.replace("--!queue\n", _QUEUE_PROLOGUE, 1)
    shared = "".join(_include_text(inc) for inc in _includes(list(texts.values())))
    state = [(n, t) for n, t, comment in _STATE.findall(shared) if comment.strip() != _KEPT]
    reset = f"{', '.join(n for n, _ in state)} = {', '.join(t for _, t in state)}\n" if state else ""
    codes = list(ErrorCode)
    top = (
        "local KEYS, ARGV\n"
        f"local {', '.join(c.name for c in codes)} = {', '.join(str(int(c)) for c in codes)}\n" + shared
    )
    digest = hashlib.sha1((top + "".join(bodies.values())).encode()).hexdigest()[:12]
    functions = {name: f"pq_{digest}_{name}" for name in SCRIPT_NAMES}
    parts = [f"#!lua name=celery_pq_{digest}\n", top]
    for name, body in bodies.items():
        flags = "'allow-oom'" if name in WRITES_WHEN_FULL else ""
        parts.append(
            f"redis.register_function{{function_name='{functions[name]}', flags={{{flags}}}, "
            f"callback=function(keys, args)\nKEYS, ARGV = keys, args\n{reset}{body}\nend}}\n"
        )
    return Library(f"celery_pq_{digest}", "".join(parts), functions)


def _error_constants(text: str) -> str:
    """``local NOT_LEASED, TOKEN_MISMATCH = -2, -3`` for the error codes the code of ``text`` names."""
    words = set(_WORD.findall(_STRING.sub("", _COMMENT.sub("", text))))
    codes = [c for c in ErrorCode if c.name in words]
    if not codes:
        return ""
    return f"local {', '.join(c.name for c in codes)} = {', '.join(str(int(c)) for c in codes)}\n"


def _bindings(sig: Signature) -> str:
    """The Lua lines binding a script's key names: locals, and the fairness keys in FK."""
    plain = [(i, n) for i, n in enumerate(sig.keys, 1) if n not in FAIR_SUFFIXES]
    fair = [(i, n) for i, n in enumerate(sig.keys, 1) if n in FAIR_SUFFIXES]
    out = f"local {', '.join(n for _, n in plain)} = {', '.join(f'KEYS[{i}]' for i, _ in plain)}\n" if plain else ""
    if fair:
        out += "FK = { " + ", ".join(f"{n} = KEYS[{i}]" for i, n in fair) + " }\n"
    return out


def _without_unused_functions(text: str) -> str:
    """Drop each top-level ``local function`` (from its line to the first line ``end``) that
    neither the script's own code nor a kept function names."""
    pieces: list[tuple[str | None, list[str]]] = [(None, [])]  # (function name or None, lines)
    for line in text.splitlines(keepends=True):
        m = _FUNCTION.match(line)
        if m:
            pieces.append((m.group(1), [line]))
        else:
            pieces[-1][1].append(line)
            if pieces[-1][0] is not None and line.rstrip("\n") == "end":
                pieces.append((None, []))
    words = {name: set(_WORD.findall(_COMMENT.sub("", "".join(lines[1:])))) for name, lines in pieces if name}
    todo = [
        w
        for name, lines in pieces
        if name is None
        for w in _WORD.findall(_COMMENT.sub("", "".join(lines)))
        if w in words
    ]
    used = set(todo)
    while todo:
        for w in words[todo.pop()] & words.keys():
            if w not in used:
                used.add(w)
                todo.append(w)
    return "".join("".join(lines) for name, lines in pieces if name is None or name in used)
