"""Parse the time arguments of the history commands (``--from``, ``--to``).

Accepted forms (all resolve to UTC epoch milliseconds):

- ISO 8601 with a time zone: ``2026-03-01T12:00:00Z``, ``2026-03-01T12:00+01:00``
  (a time without a zone is refused: it would silently be read as local time)
- a bare date ``2026-03-01`` (midnight UTC)
- epoch milliseconds: ``1772366400000`` (an integer of at least 10 digits;
  fewer digits are refused as ambiguous with seconds)
- relative to ``now_ms``: ``-24h``, ``-90m``, ``-7d``, ``now``
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

from pipeline.config import ConfigError, parse_duration_ms

_EPOCH_MS = re.compile(r"\d{10,}")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class TimeParseError(ValueError):
    """A time argument that is none of the accepted forms (message names the forms)."""


def parse_time_ms(text: str, now_ms: int) -> int:
    """Return UTC epoch milliseconds for ``text`` (see the module docstring for forms).

    ``now_ms``: the reference for relative forms (``-24h`` = ``now_ms - 86_400_000``).
    Raises :class:`TimeParseError` for an empty value, a zone-less ISO time,
    a short integer, or anything else.

    >>> parse_time_ms("2026-03-01T00:00:00Z", 0)
    1772323200000
    >>> parse_time_ms("-1h", 7_200_000)
    3600000
    """
    value = (text or "").strip()
    if not value:
        raise TimeParseError("empty time; use ISO 8601 with a zone (2026-03-01T12:00:00Z), epoch ms, or -24h")
    if value.lower() == "now":
        return int(now_ms)
    if value.startswith("-"):
        try:
            return int(now_ms) - parse_duration_ms(value[1:], name="relative time")
        except ConfigError as exc:
            raise TimeParseError(f"{exc} (relative times look like -24h, -90m, -7d)") from None
    if value.isdigit():
        if not _EPOCH_MS.fullmatch(value):
            raise TimeParseError(f"integer time {value!r} is too short for epoch milliseconds (13 digits today)")
        return int(value)
    if _DATE.fullmatch(value):
        value += "T00:00:00+00:00"
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeParseError(
            f"cannot read time {text!r}; use ISO 8601 with a zone (2026-03-01T12:00:00Z), epoch ms, or -24h"
        ) from None
    if parsed.tzinfo is None:
        raise TimeParseError(f"time {text!r} has no time zone; add Z or +HH:MM (local time is never assumed)")
    return int(parsed.astimezone(timezone.utc).timestamp() * 1000)


def format_time_ms(ts_ms: int) -> str:
    """ISO 8601 UTC text of epoch milliseconds (``2026-03-01T00:00:00.000Z``)."""
    return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")
