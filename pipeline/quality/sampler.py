"""Which responses get a quality score: a per-channel token bucket on event time (SPEC §4.5).

Encoding an answer costs tens to hundreds of milliseconds of CPU, so only
a sample is scored: among a channel's ``ok`` events that carry a ``response_text``
(and are not structured answers — those have the structure check, SPEC
§4.4, and are out of the model's scope), at most one per
``interval_ms`` of *event time* per channel on average (default 2 s, so at
most 150 + ``burst`` samples per 5 min window), with bursts of up to
``burst`` (default 3) samples after a quiet spell: a token bucket of size 1
would lose a third of the allowed samples to Poisson arrival gaps on a
channel with ~1 text answer per second. Event time, not wall-clock time, so a replayed backlog is
sampled like live traffic and the result does not depend on how fast it
is read.

Texts are made safe to score, publish and store here (never raised):
lone surrogates (invalid UTF-8) are replaced with U+FFFD, bytes are
decoded with replacement, and texts longer than ``max_text_chars`` are cut.
Empty answers are sampled (an empty ``ok`` answer is useless; the scorer
gives it 0.0). Every decision is counted by reason in
:attr:`QualitySampler.counters`:

``sampled``          taken
``no_text``          ``ok`` but no ``response_text``
``not_ok``           status other than ``ok``
``structured``       carries ``expected_fields`` (checked by the structure check instead)
``throttled``        over the channel's sampling rate
``invalid_utf8``     a sampled text held lone surrogates or undecodable bytes (repaired)
``truncated``        a sampled text was longer than ``max_text_chars`` (cut)
``empty_text``       a sampled response is empty or whitespace only
``not_text``         a ``response_text`` / ``prompt_text`` that is not a string (dropped)

Pure Python: no torch here (the engine's replay and the worker import it freely).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

#: Default: at most one sample per 2 s of event time per channel (on average) ...
DEFAULT_INTERVAL_MS = 2_000
#: ... with bursts of up to this many samples after a quiet spell.
DEFAULT_BURST = 3
#: Longest text kept for scoring/storage, characters (the model reads ~1 KB;
#: the scorer cuts at 4 × 4,096 anyway).
DEFAULT_MAX_TEXT_CHARS = 16_384

_SURROGATES = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class SamplerConfig:
    """``interval_ms`` (> 0): event time per sample per channel; ``burst`` (>= 1):
    bucket size; ``max_text_chars`` (> 0): longer texts are cut;
    ``include_structured``: also sample answers with ``expected_fields``."""

    interval_ms: int = DEFAULT_INTERVAL_MS
    burst: int = DEFAULT_BURST
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    include_structured: bool = False

    def __post_init__(self) -> None:
        if not self.interval_ms > 0:
            raise ValueError(f"interval_ms must be > 0, got {self.interval_ms}")
        if not self.burst >= 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")
        if not self.max_text_chars > 0:
            raise ValueError(f"max_text_chars must be > 0, got {self.max_text_chars}")


@dataclass(frozen=True)
class Sample:
    """One response picked for scoring (texts already safe: valid UTF-8, bounded)."""

    event_id: str
    ts_ms: int
    channel: str
    route: str
    response: str
    prompt: str | None
    reasons: tuple[str, ...] = ()


def safe_text(text: Any, max_chars: int) -> tuple[str | None, list[str]]:
    """``(text, reasons)``: valid UTF-8 (U+FFFD for lone surrogates / bad bytes), at most
    ``max_chars`` characters; ``None`` for a missing or non-text value.

    >>> safe_text("ok\\ud800", 10)
    ('ok\\ufffd', ['invalid_utf8'])
    >>> safe_text("abcdef", 3)
    ('abc', ['truncated'])
    >>> safe_text(42, 3)
    (None, ['not_text'])
    """
    reasons: list[str] = []
    if text is None:
        return None, reasons
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)[: 4 * max_chars]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            reasons.append("invalid_utf8")
    elif not isinstance(text, str):
        return None, ["not_text"]
    if len(text) > max_chars:
        text = text[:max_chars]
        reasons.append("truncated")
    if not text.isascii() and _SURROGATES.search(text):
        text = _SURROGATES.sub("\ufffd", text)
        if "invalid_utf8" not in reasons:
            reasons.append("invalid_utf8")
    return text, reasons


class QualitySampler:
    """Per-channel token bucket on event time; see the module doc.

    ``offer(events)`` returns the :class:`Sample` s to score, in input order.
    State: one ``(tokens, last_ts_ms)`` pair per channel seen with text.
    """

    def __init__(self, config: SamplerConfig | None = None) -> None:
        self.config = config or SamplerConfig()
        self.counters: Counter[str] = Counter()
        self._buckets: dict[str, list[float]] = {}

    def _take(self, channel: str, ts_ms: int) -> bool:
        cfg = self.config
        b = self._buckets.get(channel)
        if b is None:
            b = self._buckets[channel] = [float(cfg.burst), float(ts_ms)]
        else:
            dt = ts_ms - b[1]
            if dt > 0:  # out-of-order events refill nothing
                b[0] = min(float(cfg.burst), b[0] + dt / cfg.interval_ms)
                b[1] = float(ts_ms)
        if b[0] >= 1.0:
            b[0] -= 1.0
            return True
        return False

    def offer(self, events: Iterable[Any]) -> list[Sample]:
        """Pick the events to score among ``events`` (RequestEvent-like objects)."""
        out: list[Sample] = []
        cfg = self.config
        c = self.counters
        for e in events:
            if e.status != "ok":
                c["not_ok"] += 1
                continue
            text = e.response_text
            if text is None:
                c["no_text"] += 1
                continue
            if e.expected_fields and not cfg.include_structured:
                c["structured"] += 1
                continue
            if not self._take(e.channel, e.ts_ms):
                c["throttled"] += 1
                continue
            response, why = safe_text(text, cfg.max_text_chars)
            if response is None:  # not a string: nothing to score
                c.update(why)
                continue
            prompt, pwhy = safe_text(getattr(e, "prompt_text", None), cfg.max_text_chars)
            reasons = list(dict.fromkeys(why + pwhy))
            if not response.strip():
                reasons.append("empty_text")
            c.update(reasons)
            c["sampled"] += 1
            out.append(Sample(e.event_id, int(e.ts_ms), e.channel, e.route, response, prompt, tuple(reasons)))
        return out

    def forget(self, channels: Iterable[str]) -> None:
        """Drop the buckets of channels no longer handled (e.g. after a rebalance)."""
        for ch in channels:
            self._buckets.pop(ch, None)
