"""Passwords out of error and log text: show a value that may be a broker URL or connection arguments
as ``redact(value)``, its ``repr`` with every password ``***`` (as kombu's ``Connection.as_uri()``)."""

from __future__ import annotations

import re

MASK = "***"

#: A URL's ``scheme://USER:PASSWORD@``, up to the last "@" before the path (a password may hold one).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/\s;'\"]*)@")


def _mask_url(match: re.Match) -> str:
    scheme, userinfo = match.group(1), match.group(2)
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{user}:{MASK}@" if colon else match.group(0)


def _secret_key(key) -> bool:
    return isinstance(key, str) and ("password" in key.lower() or "passwd" in key.lower())


def _masked(value):
    if isinstance(value, str):
        return _USERINFO.sub(_mask_url, value)
    if isinstance(value, dict):
        return {k: MASK if _secret_key(k) and v is not None else _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_masked(v) for v in value] if isinstance(value, list) else tuple(_masked(v) for v in value)
    return value


def redact(value) -> str:
    """``repr(value)`` without passwords: those of URLs in any string in it (``USER:***@``), and
    the values of mapping keys naming a password (``password``, ``ssl_password``, ...)."""
    return _USERINFO.sub(_mask_url, repr(_masked(value)))
