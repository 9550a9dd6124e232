"""One line on the error class behind a verdict (issue #32 part 3): "dead key on account acct-a (2 channels)".

Kept apart from the alert renderings (:mod:`pipeline.alert.formats`) so a format can add the line
where it wants it; plain text, to be escaped for its medium by the caller (:mod:`pipeline.escape`).
Reads the verdict metrics written by :mod:`pipeline.engine.error_classes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["error_class_line"]

_WHAT = {"credential": "dead key", "quota_exhausted": "quota exhausted", "rate_limited": "rate limited"}


def error_class_line(reasons: list[str], metrics: Mapping[str, Any]) -> str | None:
    """The error-class line of a verdict (its ``reasons`` and ``metrics``), or None when no class is behind it.

    ``credential`` / ``quota_exhausted``: what, the account and how many channels it opened, the next
    probe time (UTC epoch ms, as ``next_probe_ts_ms``); ``rate_limited``: the provider's Retry-After;
    ``caller_errors``: the count over 5 min. The provider's message follows after `` — ``.

    >>> error_class_line(["credential_invalid"], {"error_class": "credential", "account": "acct-a",
    ...                  "account_channels": 2, "error_message": "Incorrect API key provided"})
    'dead key on account acct-a (2 channels) — Incorrect API key provided'
    >>> error_class_line(["caller_errors"], {"caller_errors_5m": 360})
    "360 caller errors in 5 min (the client's requests, not the channel)"
    """
    cls = metrics.get("error_class")
    if cls in _WHAT:
        line = _WHAT[cls]
        if metrics.get("account"):
            n = metrics.get("account_channels") or 1
            line += f" on account {metrics['account']} ({n} channel{'s' if n != 1 else ''})"
        if cls == "rate_limited" and metrics.get("retry_after_s") is not None:
            line += f", Retry-After {metrics['retry_after_s']:g} s"
        if metrics.get("error_message"):
            line += f" — {metrics['error_message']}"
        return line
    if "caller_errors" in reasons and metrics.get("caller_errors_5m"):
        return f"{metrics['caller_errors_5m']} caller errors in 5 min (the client's requests, not the channel)"
    return None
