"""What a script takes, read from its header (the leading comment block of its file).

A script's header names its KEYS (``-- KEYS[1] ii  hash ...``), its ARGV (``-- ARGV[1] lease_ms
...``) and the error codes it returns (``-- ERR -2 NOT_LEASED``), one line each, in the forms
docs/key-layout.md describes. ``signature`` parses the KEYS and ARGV lines, so that a caller
builds its key list (``keys.script_keys``) and its argument list (``Signature.args``, or
``Signature.bind`` with the values that never change fixed once) from the header's names, and
the script binds its keys from the same names (``assembly.source``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources

from .layout import Layout

#: The directory of the scripts; the includes are in its ``includes``.
LUA = resources.files("celery_pq") / "lua"


@dataclass(frozen=True)
class Signature:
    """What a script takes, by the names in its header: its KEYS in order, and its ARGV."""

    keys: tuple[str, ...]
    #: The last of ``keys``, sent only when the queue is fair (marked "fair only").
    fair_only: tuple[str, ...] = ()
    #: The name of an open list of keys after them (``KEYS[n..] name``), or None.
    tail: str | None = None
    #: The names of ARGV[1..] in order, but the repeated group at the end (``rest``): single
    #: arguments, counted lists (``ARGV[7..6+nviews] views...``) and their counts.
    argv: tuple[str, ...] = ()
    #: The names of one group of the repeated arguments that end ARGV (``ARGV[2..] eid
    #: token...``, or a counted list last), or empty.
    rest: tuple[str, ...] = ()
    #: Does the script take the queue context (``ARGV[0] context``: sent last, taken off first)?
    context: bool = False
    #: ``(count, list, group size)`` of each counted list: the argument ``count`` is the number
    #: of groups in the list ``list`` ("" for ``rest``), worked out from the values given.
    counts: tuple[tuple[str, str, int], ...] = ()
    #: The script's name (for the errors of ``args``).
    script: str = ""

    @cached_property
    def wanted(self) -> tuple[str, ...]:
        """The names a call gives values for, in header order: the arguments but the counts
        (worked out from their lists), then ``context`` when the script takes it."""
        counts = {count for count, _, _ in self.counts}
        return tuple(n for n in self.argv if n not in counts) + (("context",) if self.context else ())

    @cached_property
    def lists(self) -> frozenset[str]:
        """The names of the counted lists among ``argv`` (each given as a sequence)."""
        return frozenset(lst for _, lst, _ in self.counts if lst)

    def bind(self, **fixed) -> Layout:
        """This script's ARGV laid out with the values ``fixed`` once: the ``Layout`` is called
        with the others by name (and the repeated group) at each call (see ``layout.py``)."""
        return Layout(self, fixed)

    @cached_property
    def _unbound(self) -> Layout:
        return Layout(self, {})

    def args(self, *rest, **named) -> list:
        """The ARGV list of a call, in the order the script reads it, from the values of its
        names (a counted list as a flat sequence of its values; ``rest`` flat, group after
        group; the context, when the script takes one, as ``context=`` and sent last). The
        counts are worked out, not given. TypeError names any value missing or unexpected."""
        return self._unbound(*rest, **named)


# "-- KEYS[i] name type ...", "-- KEYS[i..j] name name ...: ...", "-- KEYS[i..] name ..."
_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)(?:(\.\.)(\d*))?\]\s+(.*)$", re.M)
_ERR_LINE = re.compile(r"^-- ERR (-\d+) (\w+)$", re.M)
# "-- ARGV[p] name  ...", "-- ARGV[p..e] name name...  ...", "-- ARGV[p..] name name...  ..."
_ARGV_LINE = re.compile(r"^-- ARGV\[([^\]]+)\] (.*)$", re.M)
_POSITION = re.compile(r"^(\d+)((?:\+(?:\d+\*)?[a-z_]+)*)$")
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@cache
def signature(name: str) -> Signature:
    """What a script takes, read from its header (ValueError when a line is out of order or
    not of the forms docs/key-layout.md describes)."""
    keys: list[str] = []
    fair_only: list[str] = []
    tail = None
    for m in _KEY_LINE.finditer(header(name)):
        first, dots, last, text = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if first != len(keys) + 1 or tail is not None:
            raise ValueError(f"{name}.lua: KEYS[{first}] is out of order in the header")
        if not dots:
            names = text.split()[:1]
        elif not last:
            tail = text.split()[0]
            continue
        else:
            names = text.split(":")[0].split()
            if len(names) != int(last) - first + 1:
                raise ValueError(f"{name}.lua: KEYS[{first}..{last}] names {len(names)} keys")
        if fair_only and "fair only" not in text:
            raise ValueError(f"{name}.lua: keys sent only when fair must come last (before an open list)")
        keys += names
        fair_only += names if "fair only" in text else []
    return Signature(tuple(keys), tuple(fair_only), tail, *_argv(name), script=name)


def _position(name: str, text: str) -> tuple[int, dict[str, int]]:
    """A position of an ARGV line, "9+nviews+nforget" or "10+2*nacks": the number and the
    multiple of each count added to it."""
    m = _POSITION.match(text)
    if not m:
        raise ValueError(f"{name}.lua: ARGV[{text}] is not a position")
    counts: dict[str, int] = {}
    for term in m.group(2).split("+")[1:]:
        k, _, count = term.rpartition("*")
        counts[count] = counts.get(count, 0) + int(k or 1)
    return int(m.group(1)), counts


def _argv(name: str) -> tuple[tuple[str, ...], tuple[str, ...], bool, tuple[tuple[str, str, int], ...]]:
    """``(argv, rest, context, counts)`` of a script (see ``Signature``), from its ARGV lines:
    each starts where the one before ended, and a count is an argument before its list."""
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
    for line in (LUA / f"{name}.lua").read_text(encoding="utf-8").splitlines():
        if not line.startswith("--") or line.startswith("--!"):
            break
        lines.append(line)
    return "\n".join(lines)
