"""How often leases are renewed, and how long a reply may take, given the lease: the options
``renew_interval`` and ``socket_timeout`` fitted to ``lease_seconds`` (``Options`` calls
``fit_renewals`` once, when the options are checked).

A lease must last renew_interval + RENEW_MARGIN, and a reply may take at most lease_seconds -
renew_interval: a renewal stuck on a silent connection for longer would let its leases expire.
"""

from __future__ import annotations

from . import constants as C
from .errors import ConfigError


def fit_renewals(
    lease: float, renew_interval: float | None, socket_timeout: float | None, default_timeout: bool
) -> tuple[float, float | None]:
    """(renew_interval, socket_timeout) for leases of ``lease`` seconds: renew_interval a third
    of the lease when not given (at least 0.1 s, at most 20 s and half the lease), then the
    checks that leases outlive their renewals; the default socket_timeout (``default_timeout``)
    is lowered to fit, a given one that does not fit is refused (ConfigError)."""
    margin = C.RENEW_MARGIN
    given = renew_interval is not None
    renew = renew_interval if renew_interval is not None else min(max(0.1, lease / 3.0), 20.0, lease / 2.0)
    if lease - renew < margin:
        if given:
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
        return renew, min(socket_timeout, room) if socket_timeout is not None else room
    if socket_timeout is None or socket_timeout > room:
        forever = " (wait forever)" if socket_timeout is None else ""
        raise ConfigError(
            f"socket_timeout must be at most lease_seconds - renew_interval ({lease:g} - {renew:g} "
            f"= {room:g} s), got {socket_timeout!r}{forever}: a renewal waiting longer on a "
            "silent connection would let the leases expire"
        )
    return renew, socket_timeout
