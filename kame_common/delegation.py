"""Client delegation's timeout, checked by the same rule in the gateway (a
caller's DelegationConfig.timeout_s, refused at the start of the call) and in
the oracle (OracleConfig.delegation_timeout_s, when its session opens).

A delegation waits this long for a sign from the caller's back-end
(commentary or thinking) before it ends: long enough for a back-end that runs
a tool or a slow model, short enough that a caller is told, within seconds,
that no answer is coming.
"""

from __future__ import annotations

import math

DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 60.0


def delegation_timeout_s(requested: float, field: str = "timeout_s") -> float:
    """The timeout a session gets: `requested`, or the default for 0. ValueError
    naming `field` when it is negative, above MAX_TIMEOUT_S or not a number."""
    if math.isnan(requested) or not 0 <= requested <= MAX_TIMEOUT_S:
        raise ValueError(
            f"{field}: 0 (the default, {DEFAULT_TIMEOUT_S:g} s) to {MAX_TIMEOUT_S:g} s, "
            f"got {requested}"
        )
    return requested or DEFAULT_TIMEOUT_S
