"""Each Lua script's text (``source``, for EVALSHA) and the Redis Functions library of them all
(``library``), from ``lua/``: ``--!include name.lua`` pastes an include, ``--!keys`` binds the
header's key names, ``--!queue`` the queue prologue; error codes come from ``errors.ErrorCode``.
docs/architecture.md lists the scripts; docs/deployments.md ("An ACL user") the two forms.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache

from ..storage.errors import ErrorCode
from ..storage.keys import FAIR_SUFFIXES
from .headers import LUA, Signature, read_lua, signature

#: Every script: a file ``lua/<name>.lua`` (its includes in ``lua/includes/``).
SCRIPT_NAMES = tuple(sorted(f.name.removesuffix(".lua") for f in LUA.iterdir() if f.name.endswith(".lua")))

_INCLUDE = re.compile(r"^--!include\s+(\S+)\s*$", re.M)
_FUNCTION = re.compile(r"local function (\w+)\(")
_WORD = re.compile(r"\w+")
_COMMENT = re.compile(r"--.*")
_STRING = re.compile(r"'[^']*'")


@cache
def source(name: str) -> str:
    """One script's full text: key bindings, includes and error constants pasted in, minus the
    helpers it never calls (Redis runs a script's whole text, definitions too, on every call)."""
    return compose(_body(name, read_lua(f"{name}.lua")))


def _body(name: str, text: str) -> str:
    return text.replace("--!keys\n", _bindings(signature(name)), 1).replace("--!queue\n", _QUEUE_PROLOGUE, 1)


#: ``--!queue``: the context taken off ARGV; nothing done when the caller's mode is not the
#: queue's recorded one (includes/queue.lua).
_QUEUE_PROLOGUE = "take_context()\nlocal bad = mode_error(false)\nif bad then\n  return bad\nend\n"


def compose(text: str) -> str:
    """Lua ``text`` with its includes pasted (each once, after those it names), minus unused
    helpers, the error codes it names defined first (tests run the helpers alone through this)."""
    shared = _includes([text])
    text = _INCLUDE.sub("", _without_unused_functions(_INCLUDE.sub(lambda m: shared, text, count=1)))
    words = set(_WORD.findall(_STRING.sub("", _COMMENT.sub("", text))))
    return _constants([c for c in ErrorCode if c.name in words]) + text


def _includes(texts: list[str]) -> str:
    """The text of the includes ``texts`` name, transitively, each once and after those it names
    (a Lua ``local function`` must come before its callers), their own ``--!include`` lines
    taken out; ValueError for a cycle."""
    done: dict[str, str] = {}  # (in the order they are done)
    started: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in started:
            raise ValueError(f"includes/{name} includes itself (through {', '.join(started - set(done))})")
        started.add(name)
        text = read_lua(f"includes/{name}")
        for inner in _INCLUDE.findall(text):
            visit(inner)
        done[name] = _INCLUDE.sub("", text)

    for text in texts:
        for name in _INCLUDE.findall(text):
            visit(name)
    return "".join(done.values())


#: Scripts a full Redis (``maxmemory``, ``noeviction``) still runs: they free memory or add little.
#: An insert or a migration is refused whole before it starts (OOM), not half done.
WRITES_WHEN_FULL = frozenset(SCRIPT_NAMES) - {"insert", "migrate"}

# The includes' module state (``local CTX = { n = 0 }`` on one line at the top level): a library
# keeps it between calls, so each function makes it anew, as a script's fresh run does; a table
# whose line ends "-- kept between calls" (a cache) is left as it is.
_STATE = re.compile(r"^local (\w+) = (\{[^\n]*\})[ \t]*(--[^\n]*)?$", re.M)
_KEPT = "-- kept between calls"


@dataclass(frozen=True)
class Library:
    """The library: ``name``, ``text`` (for FUNCTION LOAD), ``functions[script]`` (its name)."""

    name: str
    text: str
    functions: dict


@cache
def library() -> Library:
    """Every script as a function of one library, the includes defined once at its top level.
    The names carry a hash of the text, so two versions of celery-pq can share a Redis."""
    texts = {name: read_lua(f"{name}.lua") for name in SCRIPT_NAMES}
    bodies = {name: _body(name, _INCLUDE.sub("", text)) for name, text in texts.items()}
    shared = _includes(list(texts.values()))
    state = [(n, t) for n, t, comment in _STATE.findall(shared) if comment.strip() != _KEPT]
    reset = f"{', '.join(n for n, _ in state)} = {', '.join(t for _, t in state)}\n" if state else ""
    top = "local KEYS, ARGV\n" + _constants(list(ErrorCode)) + shared
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


def _constants(codes: list) -> str:
    """``local NOT_LEASED, TOKEN_MISMATCH = -2, -3`` for ``codes`` ("" for none)."""
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
    """Drop each top-level ``local function`` (to its first line ``end``) that neither the
    script's own code nor a kept function names."""
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
