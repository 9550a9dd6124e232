"""Exponential backoff delays for retrying writes.

>>> from itertools import islice
>>> list(islice(backoff_delays(0.1, 1.0), 6))
[0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

from typing import Iterator


def backoff_delays(initial_s: float, max_s: float, factor: float = 2.0) -> Iterator[float]:
    """Yield ``initial_s, initial_s*factor, ...`` seconds, capped at ``max_s``, forever.

    Raises ``ValueError`` for ``initial_s <= 0``, ``max_s < initial_s`` or ``factor < 1``.
    """
    if initial_s <= 0 or max_s < initial_s or factor < 1:
        raise ValueError(f"bad backoff: initial_s={initial_s}, max_s={max_s}, factor={factor}")
    delay = initial_s
    while True:
        yield delay
        delay = min(round(delay * factor, 9), max_s)
