"""A round's metric values as published in verdicts: floats rounded to 4 places, None where not finite.

JSON has no NaN or infinity, and 4 decimal places are what a consumer reads; :func:`published_values` cleans a
whole metric array of a round, :func:`clean_value` one value (a pre-trip verdict's), with the same result.
"""

from __future__ import annotations

from math import isfinite

import numpy as np


def published_values(values: object) -> list:
    """A round's metric array (n,) as published numbers: floats rounded to 4 places, None where not
    finite (JSON has no NaN), exactly as :meth:`Engine._verdict` cleans one value."""
    a = np.asarray(values)
    if a.dtype.kind not in "fiub":
        return [clean_value(v) for v in a.tolist()]
    f = a.astype(np.float64)
    out = f.tolist()
    if a.dtype.kind != "f":  # ints and bools: whole and finite
        return out
    # round(v, 4) only where it can change v: an integral float is its own decimal rounding (counts, 0.0),
    # a non-finite one becomes None, and one round serves an array of one repeated value (a threshold)
    finite = np.isfinite(f)
    frac = np.flatnonzero(finite & (f != np.trunc(f)))
    if frac.shape[0]:
        v = f[frac]
        if v.min() == v.max():
            r = round(float(v[0]), 4)
            for i in frac.tolist():
                out[i] = r
        else:
            for i, x in zip(frac.tolist(), v.tolist()):
                out[i] = round(x, 4)
    if not finite.all():
        for i in np.flatnonzero(~finite).tolist():
            out[i] = None
    return out


def clean_value(v: object) -> object:
    """One metric value as published (see :func:`published_values`)."""
    if type(v) is float:
        return round(v, 4) if isfinite(v) else None
    v = float(v) if isinstance(v, (np.floating, np.integer, float, int)) else v
    return None if isinstance(v, float) and not isfinite(v) else (round(v, 4) if isinstance(v, float) else v)
