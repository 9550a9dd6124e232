"""Sending notifications to webhooks: route selection, rate limit, retries with backoff, backup routes.

HTTP via ``aiohttp`` (already a faust dependency). A send succeeds on a 2xx
answer whose JSON body, if any, carries no error code (Feishu answers 200 with
``{"code": 19001, ...}``, DingTalk and WeCom with ``{"errcode": 310000, ...}``).
Connection errors, timeouts, 429 and 5xx are retried up to the route's
``attempts`` with exponential backoff and equal jitter (delay ``d/2 + U(0,
d/2)``, ``d = min(backoff_max_s, backoff_s * 2**n)``, AWS Architecture Blog
"Exponential Backoff And Jitter"); other answers fail at once. Redirects are
never followed (``allow_redirects=False``): a 3xx answer is a failed delivery,
not retried, because following it would re-POST the body (a PagerDuty routing
key, a signed IM payload) to whatever host the ``Location`` names. A failed route
hands the notification to its ``backup`` (and that one to its own, each at
most once). Logs name routes, never URLs; error texts pass through
:func:`pipeline.redaction.redact_secrets`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Awaitable, Callable

import aiohttp

from pipeline.alert.config import RANK, AlertConfig, Route
from pipeline.alert.formats import payload
from pipeline.alert.grouping import Notification
from pipeline.redaction import redact_secrets

log = logging.getLogger("channel_health.alert")


@dataclass
class Counters:
    """What the dispatcher did: notifications sent per route name, failures, backups used, rate-limited drops."""

    sent: dict[str, int]
    failed: int = 0
    backup_used: int = 0
    rate_limited: int = 0


class Dispatcher:
    """Sends notifications through the routes of ``config``.

    ``sleep`` (backoff waits), ``rng`` (jitter, in [0, 1)) and ``clock``
    (monotonic seconds, rate limit) are injectable for tests. Use as an async
    context manager (it owns an ``aiohttp.ClientSession``).
    """

    def __init__(self, config: AlertConfig, *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.counters = Counters(sent={})
        self._sleep, self._rng, self._clock = sleep, rng, clock
        self._recent: dict[str, deque[float]] = {}
        #: Routes that took the firing notification of a key: its resolve goes to them.
        self._routes_of: dict[str, list[str]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Dispatcher":
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def targets(self, n: Notification) -> list[Route]:
        """Primary routes for ``n``: for a resolve those of its firing notification; else by severity and route.

        ``match_routes`` does not apply to process alerts (``n.title`` set: the heartbeat).
        """
        if n.kind == "resolved":
            names = self._routes_of.pop(n.key, [])
            return [r for r in self.config.routes if r.name in names]
        chosen = [r for r in self.config.routes if not r.backup_only and RANK[n.severity] >= RANK[r.min_severity]
                  and (n.title is not None  # a process alert (heartbeat) goes to every route by severity
                       or not r.match_routes or any(fnmatchcase(n.route, m) for m in r.match_routes))]
        self._routes_of[n.key] = [r.name for r in chosen]
        return chosen

    async def dispatch(self, n: Notification) -> list[str]:
        """Send ``n`` to every target (backups on failure); returns the names of the routes that took it."""
        delivered = []
        for route in self.targets(n):
            if n.kind == "firing" and not self._allow(route):
                continue
            name = await self._with_backup(route, n)
            if name is not None:
                delivered.append(name)
        return delivered

    def _allow(self, route: Route) -> bool:
        """Rate limit: at most ``route.max_per_hour`` firing notifications in any hour."""
        now = self._clock()
        recent = self._recent.setdefault(route.name, deque())
        while recent and recent[0] <= now - 3600.0:
            recent.popleft()
        if len(recent) >= route.max_per_hour:
            self.counters.rate_limited += 1
            log.warning("alert route %s: rate limit of %d per hour reached; notification dropped (%d so far)",
                        route.name, route.max_per_hour, self.counters.rate_limited)
            return False
        recent.append(now)
        return True

    async def _with_backup(self, route: Route, n: Notification) -> str | None:
        tried: set[str] = set()
        current: Route | None = route
        while current is not None and current.name not in tried:
            tried.add(current.name)
            if await self.send(current, n):
                if current is not route:
                    self.counters.backup_used += 1
                return current.name
            self.counters.failed += 1
            nxt = self.config.route(current.backup) if current.backup else None
            log.error("alert route %s failed for %s%s", current.name, n.key,
                      f"; trying backup {nxt.name}" if nxt is not None and nxt.name not in tried else "; no backup left")
            current = nxt
        return None

    async def send(self, route: Route, n: Notification) -> bool:
        """POST ``n`` in ``route``'s format with retries; True on success."""
        assert self._session is not None, "use Dispatcher as an async context manager"
        body = payload(n, route)
        for attempt in range(route.attempts):
            retry, why = await self._post(route, body)
            if why is None:
                self.counters.sent[route.name] = self.counters.sent.get(route.name, 0) + 1
                return True
            log.warning("alert route %s: attempt %d/%d failed: %s", route.name, attempt + 1, route.attempts, why)
            if not retry or attempt + 1 == route.attempts:
                return False
            d = min(route.backoff_max_s, route.backoff_s * 2 ** attempt)
            await self._sleep(d / 2 + self._rng() * d / 2)
        return False

    async def _post(self, route: Route, body: dict[str, Any]) -> tuple[bool, str | None]:
        """One attempt: ``(retryable, None)`` on success, else ``(retryable, why)``."""
        try:
            async with self._session.post(route.url, json=body,  # type: ignore[union-attr]
                                          timeout=aiohttp.ClientTimeout(total=route.timeout_s),
                                          allow_redirects=False) as resp:  # never re-POST to another host
                raw = await resp.read()
                if resp.status == 429 or resp.status >= 500:
                    return True, f"HTTP {resp.status}"
                if 300 <= resp.status < 400:  # the Location is not logged: it may carry a token
                    return False, (f"HTTP {resp.status}: the webhook answered with a redirect, which is not "
                                   "followed; set the route's url to the final address")
                if not 200 <= resp.status < 300:
                    return False, f"HTTP {resp.status}"
                code = _error_code(raw)
                return (False, f"HTTP {resp.status} with error code {code}") if code else (False, None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return True, redact_secrets(f"{type(exc).__name__}: {exc}")


def _error_code(raw: bytes) -> Any:
    """A non-zero ``code``/``errcode``/``StatusCode`` of a JSON answer (IM bots answer 200 on errors), else None."""
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    for key in ("errcode", "code", "StatusCode"):
        if isinstance(doc.get(key), int) and doc[key] != 0:
            return doc[key]
    return None
