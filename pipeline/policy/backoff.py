"""Backed-off cooldowns: one mechanism, several schedules (SPEC §4.1 probes, §4.2 repeated trips).

A :class:`Backoff` says how long the ``k``-th cooldown of a series lasts
(``k`` = 0 for the first): ``base_ms × factor**k``, lengthened by a jitter of
up to ``jitter × 100 %`` and capped at ``max_ms``. The schedules
(:meth:`pipeline.policy.defaults.PolicyConfig.backoff`):

- ``reopen``: a channel that re-opens after a failed probe (``half_open`` or
  ``recovering`` → ``open``) waits 90 s, then 180 s, 360 s ... up to 15 min
  (SPEC §4.2 "e.g. 90 s doubling to 15 min, with jitter"; linkerd2-proxy's
  failure-accrual backoff and Envoy's outlier ejection time grow the same
  way: ``base × 2^k`` capped, with jitter);
- ``credential`` / ``quota_exhausted``: at most one probe per 5 min, doubling
  to 30 min (SPEC §4.1; issue #32: new-api re-tests a disabled channel every
  10 min, far too often for a revoked key and too slowly for a topped-up one);
- ``rate_limited``: the provider's ``Retry-After`` as given (never doubled:
  the provider said how long), else 30 s doubling to 5 min.

Jitter is deterministic (issue #33: replays stay reproducible): the fraction
is a hash of ``(seed, k)`` (BLAKE2b, uniform in [0, 1)), where the caller
seeds with the event time of the trip. The first cooldown (``k`` = 0) of a
series has no jitter, so a single trip keeps the plain SPEC §4 cooldown.
Jitter only lengthens (a probe never comes sooner than the schedule's
floor: "at most one per 5 min").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Backoff", "jitter_fraction"]


def jitter_fraction(seed: int, attempt: int) -> float:
    """A reproducible fraction in [0, 1) for ``(seed, attempt)`` (first 8 bytes of BLAKE2b as an integer / 2**64).

    >>> jitter_fraction(1, 2) == jitter_fraction(1, 2), 0.0 <= jitter_fraction(7, 0) < 1.0
    (True, True)
    """
    digest = hashlib.blake2b(f"{int(seed)}:{int(attempt)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Backoff:
    """One schedule: ``base_ms`` (> 0) the first cooldown, ``max_ms`` (>= ``base_ms``) the cap, ``factor``
    (>= 1) the growth per attempt, ``jitter`` in [0, 1] the most a cooldown is lengthened (a fraction).

    Raises ``ValueError`` for values out of range.
    """

    base_ms: int
    max_ms: int
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base_ms <= 0 or self.max_ms < self.base_ms:
            raise ValueError(f"backoff needs 0 < base_ms <= max_ms, got {self.base_ms}, {self.max_ms}")
        if self.factor < 1.0 or not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"backoff needs factor >= 1 and jitter in [0, 1], got {self.factor}, {self.jitter}")

    def delay_ms(self, attempt: int, seed: int = 0) -> int:
        """The ``attempt``-th cooldown (ms; ``attempt`` >= 0, 0 the first): ``base_ms × factor**attempt``,
        times ``1 + jitter × jitter_fraction(seed, attempt)`` from the second on, capped at ``max_ms``.

        >>> b = Backoff(90_000, 900_000)
        >>> [b.delay_ms(k) for k in range(6)]
        [90000, 180000, 360000, 720000, 900000, 900000]
        """
        k = max(0, int(attempt))
        if k == 0:
            return int(self.base_ms)
        grown = self.base_ms * self.factor ** min(k, 64)
        if self.jitter:
            grown *= 1.0 + self.jitter * jitter_fraction(seed, k)
        return int(min(self.max_ms, round(grown)))
