"""``alerts.toml``: routes, severity rules, grouping, heartbeat and silences of ``channel-health alert``.

Read with :func:`load_alert_config` (``tomllib``), validated into frozen
dataclasses; every error is a :class:`~pipeline.config.ConfigError` that names
the key (``route[2].format``). The minimal file of SPEC §7 works as written::

    [[route]]
    name = "im"
    url = "http://127.0.0.1:9001/hook"
    format = "json"            # json | slack | feishu | dingtalk | wecom | pagerduty
    min_severity = "warning"   # info | warning | critical
    backup = "pager2"          # optional: route used when this one fails

A ``backup`` naming no route is logged as a warning at load (the route then
has no backup) rather than refused, so that file runs as given.

Secrets: ``url`` and ``routing_key`` (PagerDuty) may hold ``${NAME}``, replaced
by the environment variable ``NAME`` (unset: an error), or be given as
``url_file`` / ``routing_key_file`` (the file's text, stripped). Every URL and
key is registered with :func:`pipeline.redaction.register_secret`, so it never
reaches a log; routes print by name only.

Defaults: grouping as Prometheus Alertmanager's (``group_wait`` 30 s,
``group_interval`` 5 min, ``repeat_interval`` 4 h, docs "Configuration →
route"); heartbeat after 300 s without a verdict (the worker publishes one per
channel per evaluation round while traffic flows).
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from pipeline.config import ConfigError
from pipeline.redaction import register_secret

log = logging.getLogger("channel_health.alert")

SEVERITIES = ("info", "warning", "critical")
#: Severity rank: a route takes notifications of rank >= its ``min_severity``.
RANK = {name: i for i, name in enumerate(SEVERITIES)}
FORMATS = ("json", "slack", "feishu", "dingtalk", "wecom", "pagerduty")
#: PagerDuty Events API v2 endpoint (developer.pagerduty.com, "Send an Alert Event").
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
#: Rule outcomes besides a severity: ``resolve`` (the channel counts as healthy)
#: and ``keep`` (no change to the channel's alert, e.g. while half-open).
OUTCOMES = (*SEVERITIES, "resolve", "keep")
STATES = ("healthy", "degraded", "open", "half_open", "recovering", "no_data")

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Route:
    """One alert destination (a webhook). ``url`` and ``routing_key`` are secrets: never printed.

    ``min_severity``: lowest severity sent here. ``backup``: name of the route
    tried when this one fails after its retries. ``backup_only``: receives only
    as a backup. ``match_routes``: verdict routes (``fnmatch`` globs) it takes;
    empty: all. ``max_per_hour`` >= 1: firing notifications per hour, more are
    dropped with a warning (resolves always go). ``timeout_s`` > 0 per attempt;
    ``attempts`` >= 1 in all, with exponential backoff from ``backoff_s``
    (doubling, capped at ``backoff_max_s``, equal jitter).
    """

    name: str
    format: str
    url: str = field(repr=False)
    min_severity: str = "warning"
    backup: str | None = None
    backup_only: bool = False
    match_routes: tuple[str, ...] = ()
    routing_key: str | None = field(default=None, repr=False)
    max_per_hour: int = 60
    timeout_s: float = 5.0
    attempts: int = 3
    backoff_s: float = 0.5
    backoff_max_s: float = 10.0


@dataclass(frozen=True)
class SeverityRule:
    """Severity override: when a verdict matches every given field, ``outcome`` applies (first match wins).

    ``state``/``route``/``tier``/``reason`` None: any. ``route`` is an ``fnmatch``
    glob; ``reason`` matches if the verdict lists it; ``tier`` is
    ``metrics["tier"]`` or the channel's ``@free`` / ``@paid`` suffix.
    ``outcome``: one of :data:`OUTCOMES`.
    """

    outcome: str
    state: str | None = None
    route: str | None = None
    tier: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Silence:
    """Mute firing alerts of matching channels until ``until_s`` (UTC epoch seconds). Globs, default ``*``."""

    until_s: float
    channel: str = "*"
    route: str = "*"
    comment: str = ""


@dataclass(frozen=True)
class Grouping:
    """Alertmanager-style timing (seconds, all > 0): first wait, wait between updates, resend of an unchanged group."""

    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 14_400.0


@dataclass(frozen=True)
class AlertConfig:
    """The whole ``alerts.toml``. ``heartbeat_s``: seconds without a verdict before "pipeline silent"; None: off.

    ``consumer_group``: the alert process's own Kafka consumer group.
    """

    routes: tuple[Route, ...]
    rules: tuple[SeverityRule, ...] = ()
    silences: tuple[Silence, ...] = ()
    grouping: Grouping = Grouping()
    heartbeat_s: float | None = 300.0
    consumer_group: str = "channel-health-alert"

    def route(self, name: str) -> Route | None:
        """The route called ``name``, or None."""
        return next((r for r in self.routes if r.name == name), None)


def load_alert_config(path: Path, env: Mapping[str, str] | None = None) -> AlertConfig:
    """Read and validate ``path``; ``env`` (default ``os.environ``) resolves ``${NAME}`` in secrets.

    Raises :class:`ConfigError` naming the file and key for a missing file, bad
    TOML, an unknown key, a wrong type or value, or an unset variable.
    """
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_alert_config(data, os.environ if env is None else env)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_alert_config(data: Mapping[str, Any], env: Mapping[str, str]) -> AlertConfig:
    """:func:`load_alert_config` on a parsed TOML document."""
    _known(data, "", {"route", "severity", "silence", "grouping", "heartbeat", "kafka"})
    raw_routes = data.get("route")
    if not isinstance(raw_routes, list) or not raw_routes:
        raise ConfigError("at least one [[route]] is required")
    routes = tuple(_route(r, f"route[{i}]", env) for i, r in enumerate(raw_routes))
    names = [r.name for r in routes]
    for r in routes:
        if names.count(r.name) > 1:
            raise ConfigError(f"route name {r.name!r} is used twice")
        if r.backup is not None and r.backup not in names:
            log.warning("alert route %r: backup %r is not defined; failures of %r have no backup",
                        r.name, r.backup, r.name)
    rules = tuple(_rule(r, f"severity[{i}]") for i, r in enumerate(_tables(data, "severity")))
    silences = tuple(_silence(s, f"silence[{i}]") for i, s in enumerate(_tables(data, "silence")))
    g = _table(data, "grouping")
    _known(g, "grouping.", {"group_wait_s", "group_interval_s", "repeat_interval_s"})
    grouping = Grouping(**{k: _number(g, k, "grouping.", getattr(Grouping, k), low=0.0) for k in g})
    hb = _table(data, "heartbeat")
    _known(hb, "heartbeat.", {"silent_after_s", "enabled"})
    enabled = _typed(hb, "enabled", "heartbeat.", bool, True)
    k = _table(data, "kafka")
    _known(k, "kafka.", {"group"})
    return AlertConfig(routes=routes, rules=rules, silences=silences, grouping=grouping,
                       heartbeat_s=_number(hb, "silent_after_s", "heartbeat.", 300.0, low=0.0) if enabled else None,
                       consumer_group=_typed(k, "group", "kafka.", str, "channel-health-alert"))


def _route(raw: Any, where: str, env: Mapping[str, str]) -> Route:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    _known(raw, f"{where}.", {"name", "url", "url_file", "format", "min_severity", "backup", "backup_only",
                              "match_routes", "routing_key", "routing_key_file", "max_per_hour", "timeout_s",
                              "attempts", "backoff_s", "backoff_max_s"})
    name = _typed(raw, "name", f"{where}.", str, None)
    if not name:
        raise ConfigError(f"{where}.name is required")
    fmt = _choice(raw, "format", f"{where}.", FORMATS, None)
    url = _secret(raw, "url", where, env)
    if url is None and fmt == "pagerduty":
        url = PAGERDUTY_URL
    if url is None:
        raise ConfigError(f"{where}.url (or url_file) is required")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url must start with http:// or https://")
    key = _secret(raw, "routing_key", where, env)
    if fmt == "pagerduty" and not key:
        raise ConfigError(f"{where}.routing_key (or routing_key_file) is required for format 'pagerduty'")
    match = _typed(raw, "match_routes", f"{where}.", list, [])
    if not all(isinstance(m, str) for m in match):
        raise ConfigError(f"{where}.match_routes must be a list of strings")
    return Route(name=name, format=fmt, url=url, routing_key=key,
                 min_severity=_choice(raw, "min_severity", f"{where}.", SEVERITIES, "warning"),
                 backup=_typed(raw, "backup", f"{where}.", str, None),
                 backup_only=_typed(raw, "backup_only", f"{where}.", bool, False),
                 match_routes=tuple(match),
                 max_per_hour=int(_number(raw, "max_per_hour", f"{where}.", 60, low=1.0, integer=True)),
                 timeout_s=_number(raw, "timeout_s", f"{where}.", 5.0, low=0.0),
                 attempts=int(_number(raw, "attempts", f"{where}.", 3, low=1.0, integer=True)),
                 backoff_s=_number(raw, "backoff_s", f"{where}.", 0.5, low=0.0),
                 backoff_max_s=_number(raw, "backoff_max_s", f"{where}.", 10.0, low=0.0))


def _secret(raw: Mapping[str, Any], key: str, where: str, env: Mapping[str, str]) -> str | None:
    """``raw[key]`` with ``${NAME}`` expanded, or the text of ``raw[key + "_file"]``; registered for redaction."""
    text, path = raw.get(key), raw.get(f"{key}_file")
    if text is not None and path is not None:
        raise ConfigError(f"{where}: give {key} or {key}_file, not both")
    if path is not None:
        if not isinstance(path, str):
            raise ConfigError(f"{where}.{key}_file must be a string")
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{where}.{key}_file: cannot read {path}: {exc.strerror}") from None
    elif text is not None:
        if not isinstance(text, str):
            raise ConfigError(f"{where}.{key} must be a string")

        def expand(m: re.Match) -> str:
            if m.group(1) not in env:
                raise ConfigError(f"{where}.{key}: environment variable {m.group(1)} is not set")
            register_secret(env[m.group(1)])
            return env[m.group(1)]

        text = _ENV_REF.sub(expand, text)
    if text is not None:
        register_secret(text)
    return text


def _rule(raw: Any, where: str) -> SeverityRule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    _known(raw, f"{where}.", {"state", "route", "tier", "reason", "severity"})
    return SeverityRule(outcome=_choice(raw, "severity", f"{where}.", OUTCOMES, None),
                        state=_choice(raw, "state", f"{where}.", STATES, "")or None,
                        route=_typed(raw, "route", f"{where}.", str, None),
                        tier=_typed(raw, "tier", f"{where}.", str, None),
                        reason=_typed(raw, "reason", f"{where}.", str, None))


def _silence(raw: Any, where: str) -> Silence:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    _known(raw, f"{where}.", {"channel", "route", "until", "comment"})
    until = raw.get("until")
    if isinstance(until, str):
        try:
            until = datetime.fromisoformat(until.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{where}.until must be an ISO 8601 time, got {raw['until']!r}") from None
    if not isinstance(until, datetime) or until.tzinfo is None:
        raise ConfigError(f"{where}.until is required: a time with a zone, e.g. 2026-12-01T18:00:00Z")
    return Silence(until_s=until.astimezone(timezone.utc).timestamp(),
                   channel=_typed(raw, "channel", f"{where}.", str, "*"),
                   route=_typed(raw, "route", f"{where}.", str, "*"),
                   comment=_typed(raw, "comment", f"{where}.", str, ""))


def _tables(data: Mapping[str, Any], key: str) -> list:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be an array of tables ([[{key}]])")
    return value


def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table ([{key}])")
    return value


def _known(raw: Mapping[str, Any], prefix: str, keys: set[str]) -> None:
    for k in raw:
        if k not in keys:
            raise ConfigError(f"unknown key {prefix}{k} (known: {', '.join(sorted(keys))})")


def _typed(raw: Mapping[str, Any], key: str, prefix: str, kind: type, default: Any) -> Any:
    value = raw.get(key, default)
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"{prefix}{key} must be a {kind.__name__}, got {value!r}")
    return value


def _choice(raw: Mapping[str, Any], key: str, prefix: str, choices: tuple, default: Any) -> Any:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{prefix}{key} is required (one of {', '.join(choices)})")
    if value != default and value not in choices:
        raise ConfigError(f"{prefix}{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _number(raw: Mapping[str, Any], key: str, prefix: str, default: float, *, low: float,
            integer: bool = False) -> float:
    value = raw.get(key, default)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value >= low or value == float("inf") or (not integer and value <= 0):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{prefix}{key} must be {kind} >= {low:g}{'' if integer else ' (and > 0)'}, got {value!r}")
    return float(value)
