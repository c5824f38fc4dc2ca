"""What a script takes, read from its header (the leading comment block of its file).

A script's header names its KEYS (``-- KEYS[1] ii  hash ...``), its ARGV (``-- ARGV[1] lease_ms
...``) and the error codes it returns (``-- ERR -2 NOT_LEASED``), one line each, in the forms
docs/key-layout.md describes. ``signature`` parses the KEYS and ARGV lines, so that a caller
builds its key list (``keys.script_keys``) and its argument list (``Signature.args``) from the
header's names and the script binds its keys from the same names (``source``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: The directory of the scripts; the includes are in its ``includes``.
LUA = resources.files("celery_pq") / "lua"


@dataclass(frozen=True)
class Signature:
    """The KEYS of a script, by the names in its header, in order."""

    keys: tuple[str, ...]
    #: The last of ``keys``, sent only when the queue is fair (marked "fair only").
    fair_only: tuple[str, ...] = ()
    #: The name of an open list of keys after them (``KEYS[n..] name``), or None.
    tail: str | None = None


# "-- KEYS[i] name type ...", "-- KEYS[i..j] name name ...: ...", "-- KEYS[i..] name ..."
_KEY_LINE = re.compile(r"^-- KEYS\[(\d+)(?:(\.\.)(\d*))?\]\s+(.*)$", re.M)
_ERR_LINE = re.compile(r"^-- ERR (-\d+) (\w+)$", re.M)


@cache
def signature(name: str) -> Signature:
    """The KEYS a script takes, read from its header (ValueError when a line is out of order)."""
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
    return Signature(tuple(keys), tuple(fair_only), tail)


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
