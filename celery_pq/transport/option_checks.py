"""Checks of one transport option's value: ``(name, value)`` -> the value to keep, or ``ConfigError`` naming both."""

from __future__ import annotations

import math
from collections.abc import Callable

from kombu.utils.imports import symbol_by_name

from ..queue import MAX_WEIGHT, MIN_WEIGHT, UNIQUE_MODES, VT_PER_DELIVERY, validate_priority
from ..queue.unique import MAX_SECONDS as UNIQUE_MAX_SECONDS
from ..storage import checks
from ..storage import constants as C
from ..storage.errors import ConfigError
from ..storage.redact import redact


def _storage(check, **kwargs) -> Callable:
    """A check of ``storage.checks`` raising ConfigError."""
    return lambda name, value: check(name, value, error=ConfigError, **kwargs)


seconds = _storage(checks.seconds)
seconds_or_zero = _storage(checks.seconds, zero=True)
seconds_or_none = _storage(checks.seconds, none=True)
count_from_zero = _storage(checks.count, low=0, none=False)
count_or_none = _storage(checks.count)


def priority(name, value):
    try:
        return validate_priority(value)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def flag(none: bool):
    """True or False (or None, with ``none``)."""

    def check(name, value):
        if not isinstance(value, bool) and not (none and value is None):
            raise ConfigError(f"{name} must be True{', False or None' if none else ' or False'}, got {value!r}")
        return value

    return check


def name_or_none(name, value):
    """A name Redis takes (a client's, a Sentinel master's): no spaces."""
    return None if value is None else checks.text(name, value, forbidden=" \t\r\n", error=ConfigError)


def mapping_or_none(name, value):
    if value is not None and (not isinstance(value, dict) or not all(isinstance(k, str) for k in value)):
        raise ConfigError(f"{name} must be a dict of redis-py connection arguments or None, got {redact(value)}")
    return None if value is None else dict(value)


def queue_techniques(name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a dict {{queue: technique}}, got {value!r}")
    for queue, technique in value.items():
        if technique not in C.TECHNIQUES:
            raise ConfigError(f"technique for {queue!r} must be 'T' or 'S', got {technique!r}")
    return dict(value)


def count_up_to(high, low=1):
    def check(name, value):
        checks.count(name, value, low=low, none=False, error=ConfigError)
        if value > high:
            raise ConfigError(f"{name} must be an integer {low}..{high}, got {value!r}")
        return value

    return check


def key(none: bool):
    """A key option (``fair_key``, ``unique_key``): a header name or "module:function"."""

    def check(name, value):
        if not (none and value is None) and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a header name or 'module:function', got {value!r}")
        return value

    return check


def per_key(keys: str, valid: Callable[[object], bool], what: str, *, none: bool = False):
    """One value for every queue or tenant (``keys``), or {name: value, "*": default}; None too with ``none``."""

    def check(name, value):
        if value is None and none:
            return None
        table = value if isinstance(value, dict) else {"*": value}
        for key, v in table.items():
            if not isinstance(key, str):
                raise ConfigError(f"{name}: {keys} names are strings, got {key!r}")
            if not valid(v):
                raise ConfigError(f"{name} for {key!r} must be {what}, got {v!r}")
        return dict(value) if isinstance(value, dict) else value

    return check


def per_tenant(kind):
    """A positive number of ``kind`` per tenant (None in a table: not limited)."""
    positive = lambda v: v is None or (not isinstance(v, bool) and isinstance(v, kind) and 0 < v < math.inf)  # noqa: E731
    return per_key("tenant", positive, "a positive number", none=True)


def weights(name, value):
    """fair_weights: each in the range the fair schedule's integer steps hold."""
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{name} must be a dict {{tenant: weight}}, got {value!r}")
    value = per_tenant((int, float))(name, value)
    for tenant, weight in (value or {}).items():
        if weight is None:  # (a cap's or a rate's None is "not limited"; a weight has no such meaning)
            raise ConfigError(f"{name} for tenant {tenant!r} must be a number, got None")
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            step = round(VT_PER_DELIVERY / weight)
            why = (
                "too few: weights above them are not told apart, and at 0 the tenant would be served without end"
                if weight > MAX_WEIGHT
                else "the schedule's 17 digits would run out"
            )
            raise ConfigError(
                f"{name} for tenant {tenant!r} must be a number from {MIN_WEIGHT:g} to "
                f"{MAX_WEIGHT:g}, got {weight!r}: each delivery moves the tenant on by "
                f"{VT_PER_DELIVERY:,} / weight whole units of virtual time, here {step:,}: {why}"
            )
    return value


unique_mode = per_key("queue", lambda v: isinstance(v, str) and v in UNIQUE_MODES, f"one of {', '.join(UNIQUE_MODES)}")
unique_seconds = per_key(
    "queue",
    lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and 0 < v <= UNIQUE_MAX_SECONDS,
    f"a number of seconds > 0 and <= {UNIQUE_MAX_SECONDS}",
)


def fit_renewals(lease, renew_interval, socket_timeout, default_timeout: bool) -> tuple[float, float | None]:
    """(renew_interval, socket_timeout) to keep: a lease must last renew_interval + RENEW_MARGIN and socket_timeout
    be at most lease_seconds - renew_interval (the default is lowered to fit); ConfigError otherwise."""
    margin = C.RENEW_MARGIN
    renew = renew_interval if renew_interval is not None else min(max(0.1, lease / 3.0), 20.0, lease / 2.0)
    if lease - renew < margin:
        if renew_interval is not None:
            raise ConfigError(
                f"lease_seconds ({lease:g}) must be at least renew_interval + {margin:g} s "
                f"({renew + margin:g}), got renew_interval {renew!r}: leases would expire "
                "before a renewal got through"
            )
        raise ConfigError(
            f"lease_seconds must be at least {1.5 * margin:g} s, got {lease!r}: leases are "
            f"renewed every renew_interval (a third of the lease by default) and a renewal "
            f"needs {margin:g} s more to get through"
        )
    room = lease - renew
    if default_timeout:
        return renew, min(socket_timeout, room)
    if socket_timeout is None or socket_timeout > room:
        forever = " (wait forever)" if socket_timeout is None else ""
        raise ConfigError(
            f"socket_timeout must be at most lease_seconds - renew_interval ({lease:g} - {renew:g} "
            f"= {room:g} s), got {socket_timeout!r}{forever}: a renewal waiting longer on a "
            "silent connection would let the leases expire"
        )
    return renew, socket_timeout


def key_function(name: str, value: str | None) -> Callable | None:
    """The function a key option names as ``"module:function"``; None for a header name."""
    if value is None or ":" not in value:
        return None
    try:
        fn = symbol_by_name(value)
    except Exception as exc:
        raise ConfigError(f"{name} {value!r} cannot be imported: {exc!r}") from None
    if not callable(fn):
        raise ConfigError(f"{name} {value!r} is not callable")
    return fn
