"""The two number helpers every part of the bench reports with."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def rounded(value: float | None, digits: int = 4) -> float | None:
    """`value` rounded for the JSON report; None (not measured) stays None."""
    return None if value is None else round(float(value), digits)


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The q-th percentile of the measured values (None entries left out); None if none."""
    measured = [v for v in values if v is not None]
    return float(np.percentile(measured, q)) if measured else None


def median_p90(values: Iterable[float | None]) -> dict[str, float | int | None]:
    """{"median", "p90", "n"} of the measured values, as every summary row shows them."""
    measured = [v for v in values if v is not None]
    return {
        "median": rounded(percentile(measured, 50)),
        "p90": rounded(percentile(measured, 90)),
        "n": len(measured),
    }
