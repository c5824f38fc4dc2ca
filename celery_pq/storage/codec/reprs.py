"""argsrepr and kwargsrepr from a Celery JSON body: the writer leaves them out when ``repr`` of
the body's args and kwargs gives them exactly (``derivable_reprs``); the reader derives them again
(``derived_reprs``). docs/storage.md ("What makes it small") says when."""

from __future__ import annotations

import json

from .bounds import remember
from .layout import CELERY_EMBED_TAIL, F_ARGSREPR, F_KWARGSREPR

#: kwargsrepr (and argsrepr of a body not as Celery writes it) is derived from bodies of at most
#: this many bytes: beyond it Celery has usually cut it (argsrepr_maxsize, 1 KB).
REPR_BODY_MAX = 1024


def derivable_reprs(headers: dict, raw: bytes) -> int:
    """F_ARGSREPR / F_KWARGSREPR for the reprs in ``headers`` a reader derives from the body alike
    (``_reprs_of``); a repr Celery cut ("...") never is."""
    argsrepr, kwargsrepr = headers.get("argsrepr"), headers.get("kwargsrepr")
    want = (F_ARGSREPR if type(argsrepr) is str and "..." not in argsrepr else 0) | (
        F_KWARGSREPR if type(kwargsrepr) is str and "..." not in kwargsrepr else 0
    )
    derived = _reprs_of(raw, want, kwargs_limit=REPR_BODY_MAX) if want else None
    if derived is None:
        return 0
    return (F_ARGSREPR if want & F_ARGSREPR and derived.get("argsrepr") == argsrepr else 0) | (
        F_KWARGSREPR if want & F_KWARGSREPR and derived.get("kwargsrepr") == kwargsrepr else 0
    )


#: (value, end) of the JSON at a position; StopIteration if none (untyped)
_JSON_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_TAIL_TEXT = CELERY_EMBED_TAIL.decode("ascii")


def _reprs_of(raw: bytes, flags: int, kwargs_limit: int | None = None) -> dict | None:
    """``{"argsrepr": ..., "kwargsrepr": ...}`` (as ``flags`` ask) as ``repr`` makes them from a
    Celery JSON body ``[args, kwargs, embed]``, or None when ``raw`` is not one. A body as Celery
    writes it has its args read alone, kwargs only when asked; any other is parsed whole.
    ``kwargs_limit`` (the writer's): a longer body's kwargs are left out (any other body: None)."""
    text = None
    if raw.startswith(b"[[") and raw.endswith(CELERY_EMBED_TAIL):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    if text is not None:
        try:
            args, end = _JSON_SCAN(text, 1)
        except StopIteration:
            return None
        stop = len(text) - len(_TAIL_TEXT)  # where kwargs end
        if type(args) is list and text.startswith(", ", end):
            out = {"argsrepr": repr(tuple(args))} if flags & F_ARGSREPR else {}
            if not flags & F_KWARGSREPR:
                return out
            if stop == end + 4 and text.startswith("{}", end + 2):
                out["kwargsrepr"] = "{}"
                return out
            if kwargs_limit is not None and len(raw) > kwargs_limit:
                return out
            try:
                kwargs, kwargs_end = _JSON_SCAN(text, end + 2)
            except StopIteration:
                return None
            if type(kwargs) is not dict or kwargs_end != stop:
                return None
            out["kwargsrepr"] = repr(kwargs)
            return out
    if kwargs_limit is not None and len(raw) > kwargs_limit:
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:
        return None
    if type(decoded) is not list or len(decoded) != 3 or type(decoded[0]) is not list or type(decoded[1]) is not dict:
        return None
    out = {}
    if flags & F_ARGSREPR:
        out["argsrepr"] = repr(tuple(decoded[0]))
    if flags & F_KWARGSREPR:
        out["kwargsrepr"] = repr(decoded[1])
    return out


#: Reprs derived lately, by (body, flags), for bodies of at most REPRS_CACHED_BODY bytes: tasks
#: sent with the same small args (none, an id) are common.
_REPRS: dict[tuple[bytes, int], dict] = {}
REPRS_CACHED_BODY = 256


def derived_reprs(raw: bytes, flags: int) -> dict | None:
    """``_reprs_of(raw, flags)``, cached for small bodies."""
    if len(raw) > REPRS_CACHED_BODY:
        return _reprs_of(raw, flags)
    key = (raw, flags)
    derived = _REPRS.get(key)
    if derived is None:
        derived = _reprs_of(raw, flags)
        if derived is not None:
            remember(_REPRS, key, derived)
    return derived
