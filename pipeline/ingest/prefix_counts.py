"""Counts per channel-name prefix with a bounded number of prefixes (issue #34 part 2).

A flood of new channel names (a gateway bug, or junk) is refused once the
worker's channel table is full of active channels; counting the refusals per
name *prefix* shows where the flood comes from (``openai`` vs ``junk``) while
a flood of random names can grow neither the counter nor a metric's label set.
"""

from __future__ import annotations

__all__ = ["MAX_PREFIXES", "OTHER_PREFIX", "PREFIX_CHARS", "PrefixCounts", "name_prefix"]

#: Distinct prefixes counted; further prefixes count under :data:`OTHER_PREFIX`.
MAX_PREFIXES = 50
OTHER_PREFIX = "(other)"
#: A prefix is cut to this many characters.
PREFIX_CHARS = 40


def name_prefix(channel: str) -> str:
    """The part of a channel name counts are kept under: up to its first ``/`` (the provider in the usual
    ``provider/model@tier`` names), else up to its first ``@``, ``:`` or ``-``, at most :data:`PREFIX_CHARS`
    characters (the whole name, cut, when none of these splits it).

    >>> name_prefix("openai/gpt-4o@paid"), name_prefix("junk-0001"), name_prefix("x" * 50) == "x" * 40
    ('openai', 'junk', True)
    """
    for sep in ("/", "@", ":", "-"):
        head, found, _ = channel.partition(sep)
        if found and head:
            return head[:PREFIX_CHARS]
    return channel[:PREFIX_CHARS]


class PrefixCounts:
    """Counts per :func:`name_prefix`, at most ``max_prefixes`` >= 1 prefixes plus :data:`OTHER_PREFIX`.

    >>> c = PrefixCounts(max_prefixes=2)
    >>> c.add(["a/1", "a/2", "b/1", "c/1", "d-9"]); c.counts
    {'a': 2, 'b': 1, '(other)': 2}
    >>> c.top(1)
    [('a', 2)]
    """

    def __init__(self, max_prefixes: int = MAX_PREFIXES):
        if max_prefixes < 1:
            raise ValueError(f"max_prefixes must be >= 1, got {max_prefixes}")
        self.max_prefixes = max_prefixes
        #: prefix → count (insertion order: first seen first).
        self.counts: dict[str, int] = {}

    def add(self, channels: list[str]) -> None:
        """Count one per name in ``channels``."""
        counts = self.counts
        for name in channels:
            p = name_prefix(name)
            if p not in counts and len(counts) >= self.max_prefixes + (OTHER_PREFIX in counts):
                p = OTHER_PREFIX
            counts[p] = counts.get(p, 0) + 1

    def top(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` largest counts, largest first (ties: first seen first)."""
        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:n]
