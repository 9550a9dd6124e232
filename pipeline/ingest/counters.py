"""Running counts of what the ingest decoder accepted and rejected (SPEC §3: "is counted")."""

from __future__ import annotations

from collections import Counter

__all__ = ["DecodeCounters"]


class DecodeCounters:
    """Counts since start, for the worker to expose (logs, metrics, ``/status``).

    ``messages``: Kafka messages decoded; ``events``: events accepted;
    ``dead_letters``: inputs rejected (a batch adds one per bad element);
    ``texts_truncated``: ``response_text``/``prompt_text`` values cut to the
    decoder's limit; ``by_reason``: dead letters per reason code. All >= 0.
    Not thread-safe (one decoder per event loop).
    """

    __slots__ = ("messages", "events", "dead_letters", "texts_truncated", "by_reason")

    def __init__(self) -> None:
        self.messages = 0
        self.events = 0
        self.dead_letters = 0
        self.texts_truncated = 0
        self.by_reason: Counter[str] = Counter()

    def add_dead_letter(self, reason: str) -> None:
        """Count one dead letter with ``reason``."""
        self.dead_letters += 1
        self.by_reason[reason] += 1

    def snapshot(self) -> dict[str, int]:
        """Flat copy: ``messages``, ``events``, ``dead_letters``, ``texts_truncated``
        and ``dead_letters.<reason>`` for every reason seen."""
        out = {
            "messages": self.messages,
            "events": self.events,
            "dead_letters": self.dead_letters,
            "texts_truncated": self.texts_truncated,
        }
        out.update({f"dead_letters.{r}": n for r, n in sorted(self.by_reason.items())})
        return out

    def __repr__(self) -> str:
        return f"DecodeCounters({self.snapshot()!r})"
