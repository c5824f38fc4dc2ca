"""A script's ARGV laid out by its header's names, the values that never change for a caller (a
queue's context, a consumer's lease length) fixed once: ``Signature.bind(**fixed)``.
docs/key-layout.md ("Which script takes which keys") describes the names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

_FIXED = 0  # values laid out once (a tuple)
_ONE = 1  # one named value
_LIST = 2  # a counted list, given by its name as a sequence
_COUNT = 3  # the count of a counted list: (its list's name, "" for the repeated group; group size)
_REST = 4  # the repeated group that ends ARGV


class Layout:
    """Called with the values not fixed, by name (``free``), and the repeated group: the call's
    ARGV. TypeError names any value missing or unexpected."""

    __slots__ = ("_build", "_group", "fixed", "free", "signature")

    def __init__(self, signature: Any, fixed: dict):  # a headers.Signature
        counted = {count: (lst, size) for count, lst, size in signature.counts}
        wanted = signature.wanted
        unexpected = [n for n in fixed if n not in wanted]
        if unexpected:
            raise TypeError(f"{signature.script}.lua takes no {unexpected} (it takes {wanted})")
        self.signature, self.fixed = signature, dict(fixed)
        #: The names a call gives, in header order.
        self.free = tuple(n for n in wanted if n not in fixed)
        self._group = len(signature.rest)
        pieces: list[tuple[int, Any]] = []
        for name in signature.argv:
            piece: tuple[int, Any]
            if name in counted:
                lst, size = counted[name]
                piece = (_FIXED, (len(fixed[lst]) // size,)) if lst in fixed else (_COUNT, (lst, size))
            elif name in fixed:
                piece = (_FIXED, tuple(fixed[name]) if name in signature.lists else (fixed[name],))
            else:
                piece = (_LIST if name in signature.lists else _ONE, name)
            if piece[0] == _FIXED and pieces and pieces[-1][0] == _FIXED:  # one piece for a run of them
                piece = (_FIXED, pieces.pop()[1] + piece[1])
            pieces.append(piece)
        if signature.rest:
            pieces.append((_REST, None))
        if signature.context:
            pieces.append((_FIXED, (fixed["context"],)) if "context" in fixed else (_ONE, "context"))
        self._build = _builder(tuple(pieces))

    def __call__(self, *rest, **named) -> list:
        if len(named) != len(self.free) or (len(rest) % self._group if self._group else rest):
            self._refuse(rest, named)
        try:
            return self._build(rest, named)
        except KeyError:
            self._refuse(rest, named)

    def _refuse(self, rest: tuple, named: dict) -> NoReturn:
        sig = self.signature
        missing = [n for n in self.free if n not in named]
        unexpected = [n for n in named if n not in self.free]
        group = f"{' '.join(sig.rest)}..." if sig.rest else ""
        raise TypeError(
            f"{sig.script}.lua takes ({', '.join([*sig.argv, group] if group else sig.argv)}): "
            f"missing {missing}, unexpected {unexpected}, {len(rest)} repeated values"
        )


def _builder(pieces: tuple) -> Callable[[tuple, dict], list]:
    """A function ``(rest, named) -> ARGV`` of ``pieces``; KeyError for a name not given."""

    def build(rest: tuple, named: dict) -> list:
        out: list = []
        for kind, value in pieces:
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
        return out

    return build
