"""Per-event limits of the ingest decoder: the event-time sanity window and long texts (SPEC §3, §8).

:class:`EventLimits` is the part of :class:`~pipeline.ingest.decode.Decoder`
that judges a decoded event on its own: ``ts_ms`` inside ``[clock -
max_age_ms, now + max_future_ms]`` (``ts_in_future`` / ``ts_too_old``), and
``response_text`` / ``prompt_text`` cut to ``max_text_chars`` (an answer the
structure check would judge is checked on its full text first).
"""

from __future__ import annotations

from pipeline.contracts import RequestEvent, any_texts
from pipeline.ingest import reasons as R
from pipeline.ingest.counters import DecodeCounters
from pipeline.ingest.structure import check_structure

SECOND_MS = 1_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000


def _duration(ms: float) -> str:
    """Readable duration: ``"42 s"``, ``"3.5 h"``, ``"12.0 days"``."""
    ms = abs(ms)
    if ms < 2 * 60 * SECOND_MS:
        return f"{ms / SECOND_MS:.0f} s"
    if ms < 2 * DAY_MS:
        return f"{ms / HOUR_MS:.1f} h"
    return f"{ms / DAY_MS:.1f} days"


class EventLimits:
    """Mixin of the decoder: time-window and text-length checks of one event.

    Attributes (set by the decoder): ``max_future_ms`` / ``max_age_ms`` (ms > 0,
    or None: no bound), ``age_clock_ms`` (replay clock or None),
    ``max_text_chars`` (> 0) and ``counters`` (:class:`DecodeCounters`).
    """

    max_future_ms: int | None
    max_age_ms: int | None
    age_clock_ms: int | None
    max_text_chars: int
    counters: DecodeCounters

    def _all_in_window(self, ts_ms: list[int], now_ms: int) -> bool:
        """Whether every time of a non-empty list is inside the sanity window (its min and max are)."""
        return not (self._time_problem(max(ts_ms), now_ms) or self._time_problem(min(ts_ms), now_ms))

    def _cut_long_texts(self, events: list[RequestEvent], failed: list[int] | None = None) -> None:
        """:meth:`_truncate` every event that carries a text (after one C-level scan for any).

        An exception of the structure check propagates; with ``failed`` given, the event's index is
        appended to it instead and the other events are still cut.
        """
        if not any_texts(events):
            return
        for i, event in enumerate(events):
            if event.response_text is not None or event.prompt_text is not None:
                if failed is None:
                    self._truncate(event)
                    continue
                try:
                    self._truncate(event)
                except Exception:  # noqa: BLE001 - recorded for the caller
                    failed.append(i)

    def _time_problem(self, ts_ms: int, now_ms: int) -> tuple[str, str] | None:
        """``(reason, detail)`` if ``ts_ms`` is outside the sanity window, else None."""
        ahead = ts_ms - now_ms
        if self.max_future_ms is not None and ahead > self.max_future_ms:
            return R.TS_IN_FUTURE, (
                f"ts_ms: {ts_ms} is {_duration(ahead)} ahead of the decoder clock {now_ms} "
                f"(limit {_duration(self.max_future_ms)})"
            )[: R.MAX_DETAIL_CHARS]
        if self.max_age_ms is None:
            return None
        clock, name = (now_ms, "decoder clock") if self.age_clock_ms is None else (self.age_clock_ms, "event clock")
        if clock - ts_ms > self.max_age_ms:
            return R.TS_TOO_OLD, (
                f"ts_ms: {ts_ms} is {_duration(clock - ts_ms)} behind the {name} {clock} "
                f"(limit {_duration(self.max_age_ms)})"
            )
        return None

    def _truncate(self, event: RequestEvent) -> None:
        """Cut long texts to ``max_text_chars``; structure-check a long answer first."""
        limit = self.max_text_chars
        text = event.response_text
        if text is not None and len(text) > limit:
            if event.status == "ok" and event.expected_fields and event.missing_fields is None:
                result = check_structure(text, event.expected_fields)
                event.missing_fields = result.missing_fields
                event.parse_ok = result.parse_ok
            event.response_text = text[:limit]
            self.counters.texts_truncated += 1
        if event.prompt_text is not None and len(event.prompt_text) > limit:
            event.prompt_text = event.prompt_text[:limit]
            self.counters.texts_truncated += 1
