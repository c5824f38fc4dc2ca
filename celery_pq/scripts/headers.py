"""What a script takes, read from its header (the leading comment block of its file): its KEYS,
ARGV and error codes by name (docs/key-layout.md), and its ARGV laid out from values by name
(``Layout``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources
from typing import Any, NoReturn

LUA = resources.files("celery_pq") / "lua"


def read_lua(path: str) -> str:
    return (LUA / path).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Signature:
    """What a script takes, by its header's names: KEYS in order, and ARGV."""

    keys: tuple[str, ...]
    #: The last of ``keys``, sent to a fair queue only ("fair only").
    fair_only: tuple[str, ...] = ()
    #: ARGV[1..] in order but the repeated group: single arguments, counted lists and their counts.
    argv: tuple[str, ...] = ()
    #: One group of the repeated arguments ending ARGV (``ARGV[2..] eid token...``), or empty.
    rest: tuple[str, ...] = ()
    #: Takes the queue context (``ARGV[0] context``: sent last, taken off first)?
    context: bool = False
    #: ``(count, list, group size)`` per counted list ("" for ``rest``).
    counts: tuple[tuple[str, str, int], ...] = ()
    script: str = ""

    @cached_property
    def wanted(self) -> tuple[str, ...]:
        """The names a call gives, in header order: ``argv`` less the counts, then ``context``."""
        counts = {count for count, _, _ in self.counts}
        return tuple(n for n in self.argv if n not in counts) + (("context",) if self.context else ())

    def bind(self, **fixed) -> Layout:
        """A ``Layout`` with ``fixed`` laid out once."""
        return Layout(self, fixed)


# "-- KEYS[i] name type ...", "-- KEYS[i..j] name name ...: ...", "-- KEYS[i..] name ..."
_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)(?:(\.\.)(\d*))?\]\s+(.*)$", re.M)
_ERR_LINE = re.compile(r"^-- ERR (-\d+) (\w+)$", re.M)
# "-- ARGV[p] name  ...", "-- ARGV[p..e] name name...  ...", "-- ARGV[p..] name name...  ..."
_ARGV_LINE = re.compile(r"^-- ARGV\[([^\]]+)\] (.*)$", re.M)
_POSITION = re.compile(r"^(\d+)((?:\+(?:\d+\*)?[a-z_]+)*)$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@cache
def signature(name: str) -> Signature:
    """What a script takes, read from its header; ValueError for a line out of order or of
    another form (an open list of keys, ``KEYS[n..] name``, comes last)."""
    keys: list[str] = []
    fair_only: list[str] = []
    open_list = False
    for m in _KEY_LINE.finditer(header(name)):
        first, dots, last, text = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if first != len(keys) + 1 or open_list:
            raise ValueError(f"{name}.lua: KEYS[{first}] is out of order in the header")
        if not dots:
            names = text.split()[:1]
        elif not last:
            open_list = True
            continue
        else:
            names = text.split(":")[0].split()
            if len(names) != int(last) - first + 1:
                raise ValueError(f"{name}.lua: KEYS[{first}..{last}] names {len(names)} keys")
        if fair_only and "fair only" not in text:
            raise ValueError(f"{name}.lua: keys sent only when fair must come last (before an open list)")
        keys += names
        fair_only += names if "fair only" in text else []
    return Signature(tuple(keys), tuple(fair_only), *_argv(name), script=name)


def _position(name: str, text: str) -> tuple[int, dict[str, int]]:
    """An ARGV position ("9+nviews+nforget", "10+2*nacks"): the number, and each count's multiple."""
    m = _POSITION.match(text)
    if not m:
        raise ValueError(f"{name}.lua: ARGV[{text}] is not a position")
    counts: dict[str, int] = {}
    for term in m.group(2).split("+")[1:]:
        k, _, count = term.rpartition("*")
        counts[count] = counts.get(count, 0) + int(k or 1)
    return int(m.group(1)), counts


def _argv(name: str) -> tuple[tuple[str, ...], tuple[str, ...], bool, tuple[tuple[str, str, int], ...]]:
    """``(argv, rest, context, counts)`` of ``Signature`` from the ARGV lines, each starting where
    the one before ended (a count is an argument before its list)."""
    argv: list[str] = []
    counts: list[tuple[str, str, int]] = []
    context = False
    rest: tuple[str, ...] = ()
    at: tuple[int, dict[str, int]] = (1, {})
    for m in _ARGV_LINE.finditer(header(name)):
        where, names = m.group(1), re.split(r"\s{2,}", m.group(2), maxsplit=1)[0].split()
        group = names[-1].endswith("...")
        names[-1] = names[-1].removesuffix("...")
        if not all(_NAME.match(n) for n in names) or (len(names) > 1 and not group) or rest:
            raise ValueError(f"{name}.lua: ARGV[{where}] {' '.join(names)} is not a line of the header form")
        if where == "0":
            if names != ["context"] or context:
                raise ValueError(f"{name}.lua: ARGV[0] is the queue context, named context, once")
            context = True
            continue
        first, sep, end = where.partition("..")
        if _position(name, first) != at or bool(sep) != group:
            raise ValueError(f"{name}.lua: ARGV[{where}] does not follow the argument before it")
        if not group:
            argv += names
            at = (at[0] + 1, at[1])
        elif not end:
            rest = tuple(names)
        else:
            last, times = _position(name, end)
            grown = {c: k - at[1].get(c, 0) for c, k in times.items() if k != at[1].get(c, 0)}
            count = next(iter(grown), "")
            if last != at[0] - 1 or len(grown) != 1 or grown[count] != len(names) or count not in argv:
                raise ValueError(f"{name}.lua: ARGV[{where}] is not {len(names)} per an earlier count")
            counts.append((count, names[0] if len(names) == 1 else "", len(names)))
            argv += names[:1] if len(names) == 1 else []
            rest = tuple(names) if len(names) > 1 else ()
            at = (last + 1, times)
    return tuple(argv), tuple(rest), context, tuple(counts)


def header_errors(name: str) -> dict[str, int]:
    """The ``-- ERR <code> <NAME>`` lines of a script's header."""
    return {label: int(code) for code, label in _ERR_LINE.findall(header(name))}


@cache
def header(name: str) -> str:
    """The leading comment block of a script file (without includes)."""
    lines = []
    for line in read_lua(f"{name}.lua").splitlines():
        if not line.startswith("--") or line.startswith("--!"):
            break
        lines.append(line)
    return "\n".join(lines)


_FIXED = 0  # values laid out once (a tuple)
_ONE = 1  # one named value
_LIST = 2  # a counted list, given by its name as a sequence
_COUNT = 3  # the count of a counted list: (its list's name, "" for the repeated group; group size)
_REST = 4  # the repeated group that ends ARGV


class Layout:
    """Called with the values not fixed (``free``) by name and the repeated group flat: the call's
    ARGV, counts worked out. TypeError names any value missing or unexpected."""

    __slots__ = ("_group", "_pieces", "free", "signature")

    def __init__(self, signature: Signature, fixed: dict):
        counted = {count: (lst, size) for count, lst, size in signature.counts}
        lists = {lst for _, lst, _ in signature.counts if lst}  # (each given as a sequence)
        wanted = signature.wanted
        unexpected = [n for n in fixed if n not in wanted]
        if unexpected:
            raise TypeError(f"{signature.script}.lua takes no {unexpected} (it takes {wanted})")
        self.signature = signature
        self.free = tuple(n for n in wanted if n not in fixed)
        self._group = len(signature.rest)
        pieces: list[tuple[int, Any]] = []
        for name in signature.argv:
            piece: tuple[int, Any]
            if name in counted:
                lst, size = counted[name]
                piece = (_FIXED, (len(fixed[lst]) // size,)) if lst in fixed else (_COUNT, (lst, size))
            elif name in fixed:
                piece = (_FIXED, tuple(fixed[name]) if name in lists else (fixed[name],))
            else:
                piece = (_LIST if name in lists else _ONE, name)
            if piece[0] == _FIXED and pieces and pieces[-1][0] == _FIXED:  # one piece for a run of them
                piece = (_FIXED, pieces.pop()[1] + piece[1])
            pieces.append(piece)
        if signature.rest:
            pieces.append((_REST, None))
        if signature.context:
            pieces.append((_FIXED, (fixed["context"],)) if "context" in fixed else (_ONE, "context"))
        self._pieces = tuple(pieces)

    def __call__(self, *rest, **named) -> list:
        if len(named) != len(self.free) or (len(rest) % self._group if self._group else rest):
            self._refuse(rest, named)
        out: list = []
        try:
            for kind, value in self._pieces:
                if kind == _FIXED:
                    out.extend(value)
                elif kind == _ONE:
                    out.append(named[value])
                elif kind == _LIST:
                    out.extend(named[value])
                elif kind == _COUNT:
                    lst, size = value
                    out.append(len(named[lst] if lst else rest) // size)
                else:
                    out.extend(rest)
        except KeyError:  # a name not given
            self._refuse(rest, named)
        return out

    def _refuse(self, rest: tuple, named: dict) -> NoReturn:
        sig = self.signature
        missing = [n for n in self.free if n not in named]
        unexpected = [n for n in named if n not in self.free]
        group = f"{' '.join(sig.rest)}..." if sig.rest else ""
        raise TypeError(
            f"{sig.script}.lua takes ({', '.join([*sig.argv, group] if group else sig.argv)}): "
            f"missing {missing}, unexpected {unexpected}, {len(rest)} repeated values"
        )
