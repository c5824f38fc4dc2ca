"""Passwords out of error and log text: ``redact(value)`` is ``repr(value)`` with every password
in it replaced by ``***``.

A broker URL may carry one (``pq://:PASSWORD@HOST``, each host of ``pq://:PW@s1;pq://:PW@s2``),
and so may connection arguments (``sentinel_kwargs={"password": ...}``, ``ssl_password``). Error
messages and log lines end up in terminals, log collectors and bug reports: wherever one shows a
value that may be a URL or connection arguments, it shows ``redact(value)`` instead of
``{value!r}``. (kombu's own ``Connection.as_uri()`` masks the first URL's password the same way.)
"""

from __future__ import annotations

import re

MASK = "***"

#: The user information of a URL (``scheme://USER:PASSWORD@``): up to the last "@" before the
#: path, so that a password holding an "@" is masked whole.
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
