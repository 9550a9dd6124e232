"""What the engine does with a failed event's error class (SPEC §4.1): the engine's named part ``classes``.

The class is resolved at ingest (:func:`pipeline.ingest.error_class.resolve_errors`) onto each failed
event; per chunk, only the failed events' classes are read (failures are rare; a healthy chunk costs one
vectorised comparison):

- ``caller``: the event's outcome becomes neutral (-1) before the windows count it, so it is in neither
  the error rate nor a failure run; counted per channel over the last ``window_ms`` (5 min) and shown as
  the advisory reason ``caller_errors`` (metric ``caller_errors_5m``) from ``caller_errors_min`` on;
- ``credential`` / ``quota_exhausted``: the channel opens at the event (reason ``credential_invalid`` /
  ``quota_exhausted``) with the probe schedule (:meth:`PolicyConfig.backoff
  <pipeline.policy.defaults.PolicyConfig.backoff>`), and so does every resident channel last seen with
  the same ``account``; a channel without an account opens alone;
- ``rate_limited``: the channel opens with reason ``rate_limited`` for the event's ``retry_after_s``
  (bounded by ``rate_limit_max_ms``), or, without one, at the ``rate_limit_trip_events``-th such event
  within ``rate_limit_trip_window_ms`` for the 429 schedule; never over an ``open`` of another cause.
  A 429 without ``retry_after_s`` on a channel that ``overloaded(row)`` says took more share than it
  usually carries (SPEC §4.2 capacity, not breakage) starts no cooldown: it stays a failure of the
  windows, and the round's capacity test (:mod:`pipeline.policy.capacity`) caps or opens the channel;
- ``transient``: nothing here (the §4 detectors).

The account of a channel is read from its first event seen here and from each of its hard-class
failures (an account is a gateway's credential or quota pool: it does not change per request). Account
map and caller counts are not in snapshots: after a restart they are relearned from the next events.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.escape import terminal_text
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.state_machine import CLASS_REASON, OPEN, ChannelMachine
from pipeline.windows.store import EventColumns

__all__ = ["ErrorClasses", "MESSAGE_METRIC_CHARS", "redact_message"]

#: An error message is published in a verdict's metrics cut to this many characters.
MESSAGE_METRIC_CHARS = 200
_ERROR_CLASS = attrgetter("error_class")
_ACCOUNT = attrgetter("account")
#: Key-like tokens a provider may echo back in its message ("Incorrect API key provided: sk-...").
_SECRET = re.compile(r"(?i)\b(?:sk|ak|pk|rk|key|api[-_]?key)[-_][A-Za-z0-9_\-*]{6,}|\bBearer\s+\S+|\bAIza[0-9A-Za-z_\-]{10,}")


def redact_message(message: str | None) -> str:
    """``message`` as a verdict may carry it: key-like tokens replaced by ``<redacted>`` (secrets never
    reach a published record), control characters made visible (:func:`pipeline.escape.terminal_text`),
    cut to :data:`MESSAGE_METRIC_CHARS` characters ("" for None).

    >>> redact_message("Incorrect API key provided: sk-abc123456789. You can find\\nyour key")
    'Incorrect API key provided: <redacted>. You can find\\\\nyour key'
    """
    if not message:
        return ""
    return terminal_text(_SECRET.sub("<redacted>", message[: 4 * MESSAGE_METRIC_CHARS]))[:MESSAGE_METRIC_CHARS]


class ErrorClasses:
    """Per-channel error-class state of one engine: accounts, caller counts, recent 429s, the last hard fault.

    ``machines``: the engine's state machines (shared list, by row); ``policy``: the defaults
    (:class:`~pipeline.policy.defaults.PolicyConfig`); ``resident``: row → whether its windows are in
    memory (an evicted sibling is not opened: it is judged again when it comes back); ``overloaded``:
    row → whether its 429s without ``retry_after_s`` are the share it took, not a rate limit
    (:meth:`CapacityModel.share_rose <pipeline.policy.capacity.CapacityModel.share_rose>`; default: never).
    """

    def __init__(self, machines: list[ChannelMachine], policy: PolicyConfig, resident: Callable[[int], bool],
                 overloaded: Callable[[int], bool] | None = None):
        self.machines = machines
        self.policy = policy
        self.resident = resident
        self.overloaded = overloaded
        #: Per row: its account, once read (None: none sent); ``read`` whether it was read.
        self.account: list[str | None] = []
        self.read = np.zeros(0, bool)
        #: account → rows last seen with it.
        self.by_account: dict[str, set[int]] = {}
        #: row → event times of its caller-class failures within the window (oldest first).
        self.caller: dict[int, deque[int]] = {}
        #: row → event times of its last rate-limited failures without ``retry_after_s``.
        self.recent_429: dict[int, deque[int]] = {}
        #: row → event time of its latest ``rate_limited`` failure, whatever its state (SPEC §4.2 probe on
        #: evidence leaves a channel whose traffic is rate limited to its probe: :meth:`rate_limited_since`).
        self.last_429: dict[int, int] = {}
        #: row → the published details of the fault that opened it (class, message, account, ...).
        self.fault: dict[int, dict[str, Any]] = {}

    def grow(self, n: int) -> None:
        """Room for ``n`` channel rows."""
        if self.read.shape[0] < n:
            self.account.extend([None] * (n - self.read.shape[0]))
            self.read = np.concatenate([self.read, np.zeros(n - self.read.shape[0], bool)])

    def _set_account(self, row: int, account: str | None) -> None:
        old = self.account[row]
        if account == old:
            return
        if old is not None:
            self.by_account.get(old, set()).discard(row)
        self.account[row] = account
        if account is not None:
            self.by_account.setdefault(account, set()).add(row)

    def note(self, events: Sequence[RequestEvent], cols: EventColumns, rows: np.ndarray) -> list[int]:
        """Read one chunk (``events`` aligned with ``cols``; ``rows`` its distinct channel rows) before the
        windows count it: learn accounts of rows not read yet, make ``caller`` failures neutral in
        ``cols.outcome`` and count them. Returns the positions of the hard-class failures
        (``credential``, ``quota_exhausted``, ``rate_limited``), in the chunk's order, for :meth:`trips`."""
        unread = rows[~self.read[rows]]
        if unread.size:
            seen, first_at = np.unique(cols.channel, return_index=True)  # each row's first position in the chunk
            first = dict(zip(seen.tolist(), first_at.tolist()))
            for r in unread.tolist():
                if r in first:
                    self._set_account(r, _ACCOUNT(events[first[r]]))
                    self.read[r] = True
        fail = np.flatnonzero(cols.outcome == 1)
        if not fail.size:
            return []
        at = fail.tolist()
        classes = [_ERROR_CLASS(events[i]) for i in at]
        hard: list[int] = []
        for i, cls in zip(at, classes):
            if cls == "caller":
                cols.outcome[i] = -1
                self.caller.setdefault(int(cols.channel[i]), deque()).append(int(cols.ts_ms[i]))
            elif cls in CLASS_REASON:
                hard.append(i)
        return hard

    def trips(self, events: Sequence[RequestEvent], cols: EventColumns, hard: list[int]) -> list[tuple[int, int]]:
        """Open the channels the hard-class failures at positions ``hard`` call for (module docstring).
        Returns ``(row, event time ms)`` per channel whose state machine changed, in order."""
        cfg = self.policy
        out: list[tuple[int, int]] = []
        for i in hard:
            e = events[i]
            row, now = int(cols.channel[i]), int(cols.ts_ms[i])
            cls = e.error_class or ""
            if e.account is not None:
                self._set_account(row, e.account)
            m = self.machines[row]
            if cls == "rate_limited":
                self.last_429[row] = max(now, self.last_429.get(row, now))
                if m.state == OPEN:
                    continue  # never shortens nor overrides an open circuit
                if e.retry_after_s is not None:
                    cooldown: int | None = int(min(cfg.rate_limit_max_ms, max(1_000, round(e.retry_after_s * 1000))))
                else:
                    if self.overloaded is not None and self.overloaded(row):
                        continue  # SPEC §4.2: overload, not a rate limit: the round's capacity test decides
                    recent = self.recent_429.setdefault(row, deque(maxlen=cfg.rate_limit_trip_events))
                    recent.append(now)
                    if len(recent) < cfg.rate_limit_trip_events or now - recent[0] > cfg.rate_limit_trip_window_ms:
                        continue
                    recent.clear()
                    cooldown = None  # the 429 schedule
                if m.trip(now, [CLASS_REASON[cls]], cfg, cls, cooldown):
                    self.fault[row] = self._details(e, cls, 1)
                    out.append((row, now))
                continue
            targets = [row]
            if e.account is not None:
                targets += sorted(r for r in self.by_account.get(e.account, ()) if r != row and self.resident(r))
            details = self._details(e, cls, len(targets))
            for r in targets:
                if self.machines[r].trip(now, [CLASS_REASON[cls]], cfg, cls):
                    self.fault[r] = details
                    out.append((r, now))
        return out

    def rate_limited_since(self, row: int, since_ms: int) -> bool:
        """Whether channel ``row`` had a ``rate_limited`` failure at or after event time ``since_ms`` (ms).
        Not in snapshots, like the other per-row state here: after a restart, from the next events on."""
        return self.last_429.get(row, since_ms - 1) >= since_ms

    @staticmethod
    def _details(e: RequestEvent, cls: str, channels: int) -> dict[str, Any]:
        """The verdict metrics that say which class and which message opened a channel."""
        d: dict[str, Any] = {"error_class": cls}
        if e.error_message:
            d["error_message"] = redact_message(e.error_message)
        if e.http_status is not None:
            d["http_status"] = e.http_status
        if e.account is not None:
            d["account"] = terminal_text(e.account)[:MESSAGE_METRIC_CHARS]
            d["account_channels"] = channels
        if e.retry_after_s is not None:
            d["retry_after_s"] = float(e.retry_after_s)
        return d

    def metrics(self, row: int, now_ms: int) -> tuple[dict[str, Any], bool]:
        """What channel ``row``'s verdict at ``now_ms`` adds: the fault details while its machine holds an
        error-class cause, ``next_probe_ts_ms`` while ``open``, ``caller_errors_5m`` when it saw caller
        failures in the last window; and whether the advisory reason ``caller_errors`` is due."""
        m = self.machines[row]
        out: dict[str, Any] = {}
        if m.cause and row in self.fault:
            out.update(self.fault[row])
        elif not m.cause:
            self.fault.pop(row, None)
        nxt = m.next_probe_ms(self.policy)
        if nxt is not None:
            out["next_probe_ts_ms"] = int(nxt)
        q = self.caller.get(row)
        if q is None:
            return out, False
        horizon = now_ms - self.policy.window_ms
        while q and q[0] <= horizon:
            q.popleft()
        if not q:
            del self.caller[row]
            return out, False
        out["caller_errors_5m"] = len(q)
        return out, len(q) >= self.policy.caller_errors_min
