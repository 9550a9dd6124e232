"""Logging refused records without a flood (SPEC §8: a refused record is counted and logged once).

:class:`RefusalLog` writes one warning per refused record, naming its key and the reason, for the first
``burst`` refusals of each ``every_s`` window (wall clock, monotonic); later ones in the window are only
counted, and one summary line gives their number (:meth:`RefusalLog.summary`, at the end of a batch of
refusals, at most once per window; the rest at the next window). 10,000 bad records thus cost at most
``burst + 1`` lines a window, and every refusal is in a line or a count.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

#: Refusals logged one by one per window.
BURST = 10
#: Window length (s).
EVERY_S = 60.0


class RefusalLog:
    """Bounded warnings about refused records of one kind (``what``, e.g. ``"snapshot"``).

    ``burst`` >= 0 lines per ``every_s`` > 0 seconds of ``clock`` (monotonic seconds); ``outcome``: what
    happens to the channel, said in each line; ``total``: refusals noted so far. Keys are logged with
    ``repr`` cut to 100 characters (data, never markup)."""

    def __init__(self, logger: logging.Logger, what: str, burst: int = BURST, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic, outcome: str = "the channel starts fresh"):
        self.logger, self.what, self.burst, self.every_s, self.clock = logger, what, burst, every_s, clock
        self.outcome = outcome
        self.total = 0
        self.window_start = float("-inf")
        self.logged = 0  # one-by-one lines in this window
        self.unlogged = 0  # refusals not yet in a line
        self.summarised = False  # a summary line was written in this window

    def _roll(self) -> None:
        now = self.clock()
        if now - self.window_start >= self.every_s:
            self.window_start, self.logged, self.summarised = now, 0, False

    def refuse(self, key: str, reason: str) -> None:
        """Note one refused record ``key`` (its channel) and why; logs it unless this window's burst is spent."""
        self.total += 1
        self._roll()
        if self.logged < self.burst:
            self.logged += 1
            self.logger.warning("%s of channel %r refused (%s); %s", self.what, key[:100], reason[:300],
                                self.outcome)
        else:
            self.unlogged += 1

    def summary(self) -> None:
        """Log how many refusals were only counted, if any and no summary was written in this window."""
        self._roll()
        if self.unlogged and not self.summarised:
            self.logger.warning("%d more %ss refused and not logged one by one (%d refused in all)",
                                self.unlogged, self.what, self.total)
            self.unlogged, self.summarised = 0, True
