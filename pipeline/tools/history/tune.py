"""Tune: search policy thresholds within bounds against labelled history (issue #22 item 4).

Ground truth comes from ``channel_incidents`` (:mod:`.incidents`): labelled
incidents (detect each as early as possible) and clean periods (no
non-healthy verdict allowed). Each candidate policy is replayed offline over
the stored events of the channels concerned (read once, kept in memory) and
scored; the best feasible candidate is proposed as a ``policy.toml`` text.
Nothing is applied.

Bounds file (TOML)::

    # [low, high, step]: the values tried are low, low+step, ... <= high
    [bounds]
    "latency.trip_ratio" = [1.3, 2.0, 0.1]        # an alias (BOUND_ALIASES)
    "tier.paid.error_rate_trip" = [0.002, 0.01, 0.002]
    "policy.open_cooldown_ms" = [60000, 120000, 30000]
    "route_wide.peer_trip_ratio" = [2.2, 3.4, 0.4]  # SPEC §4.2 route-wide / peer_latency numbers

    [search]                 # optional
    max_evaluations = 200    # replays at most (grid when it fits, else coordinate descent)

A key is an alias or a path in the policy file's layout (:func:`~pipeline.policy.defaults.load_policy`):
``policy.KEY``, ``tier.NAME.KEY``, ``tier.*.KEY`` (every tier of the base
policy) or ``route_wide.KEY`` (a key of the global ``[route_wide]`` table,
:class:`~pipeline.policy.route_wide.RouteWideConfig`; checked when the bounds
load, and its integer keys need integer bounds). A route's own
``[route."name".route_wide]`` table is not searched: a base policy's per-route
tables are copied into the proposal unchanged and keep overriding the global
one for their routes. Integer bounds give integer values.

Objective (lexicographic, smaller is better): non-healthy verdicts on
clean periods, incidents missed, sum of detection delays (ms). Feasible:
zero clean-period verdicts and every incident detected; :func:`tune`
raises :class:`TuneRefused` when no candidate is feasible.
"""

from __future__ import annotations

import itertools
import math
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.policy.defaults import PolicyConfig, load_policy
from pipeline.policy.route_wide import TABLE as ROUTE_WIDE, RouteWideConfig
from pipeline.tools.history.backtest import (
    ChannelEvents, Timeline, clean_violations, first_detection, read_events, replay_chunks,
)
from pipeline.tools.history.incidents import Incident

#: Short names for the thresholds people tune, mapped to policy-file paths (SPEC §4 numbers). The one place
#: to update when the policy layout changes.
BOUND_ALIASES: dict[str, str] = {
    "latency.trip_ratio": "tier.*.latency_ratio_trip",
    "latency.clear_ratio": "tier.*.latency_ratio_clear",
    "latency.min_requests": "tier.*.latency_min_requests",
    "errors.trip_rate": "tier.*.error_rate_trip",
    "errors.min_requests": "tier.*.error_min_requests",
    "errors.min_failures": "tier.*.error_min_failures",
    "failures.run": "tier.*.consecutive_failures",
    "missing.trip_rate": "tier.*.missing_rate_trip",
    "missing.min_checked": "tier.*.missing_min_checked",
    "cooldown_ms": "policy.open_cooldown_ms",
}
#: Most values one bound may span (a finer step is a mistake, not a search).
MAX_VALUES_PER_BOUND = 200
DEFAULT_MAX_EVALUATIONS = 200


class TuneError(ValueError):
    """A bounds file or request that cannot be used; the message names the key and the rule."""


class TuneRefused(RuntimeError):
    """No setting within the bounds detects every incident with no clean-period verdict.

    ``report``: the evidence of the least bad candidate (the report of
    :func:`tune` without ``policy_toml``).
    """

    def __init__(self, message: str, report: dict[str, Any]) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Bound:
    """One tuned number: its policy path, the values tried (ascending)."""

    name: str
    path: str
    values: tuple[float, ...]


@dataclass
class Evaluation:
    """One candidate: its values, per-incident delays (ms, None = missed), clean-period verdicts."""

    values: dict[str, float]
    delays_ms: dict[str, int | None] = field(default_factory=dict)
    clean_verdicts: dict[str, int] = field(default_factory=dict)
    refused: str | None = None

    @property
    def key(self) -> tuple[float, int, float]:
        """Objective, smaller is better: (clean verdicts, missed incidents, sum of delays ms)."""
        if self.refused is not None:
            return (math.inf, 0, 0.0)
        missed = sum(d is None for d in self.delays_ms.values())
        return (sum(self.clean_verdicts.values()), missed, float(sum(d for d in self.delays_ms.values() if d)))

    @property
    def feasible(self) -> bool:
        """Every incident detected and no non-healthy verdict on a clean period."""
        return self.refused is None and self.key[0] == 0 and self.key[1] == 0


def load_bounds(path: str | Path) -> tuple[list[Bound], int]:
    """Read a bounds file; return the bounds and ``max_evaluations``.

    Raises :class:`TuneError` for a missing/invalid file, an unknown alias or
    path, a value that is not ``[low, high, step]`` with ``low <= high`` and
    ``step > 0``, or more than :data:`MAX_VALUES_PER_BOUND` values.
    """
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise TuneError(f"cannot read bounds file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TuneError(f"bounds file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"bounds", "search"}
    if unknown:
        raise TuneError(f"bounds file {path}: unknown tables {sorted(unknown)}; expected [bounds] and [search]")
    table = data.get("bounds")
    if not isinstance(table, dict) or not table:
        raise TuneError(f'bounds file {path} has no [bounds] table; e.g. "latency.trip_ratio" = [1.3, 2.0, 0.1]')
    bounds = [_bound(name, spec) for name, spec in table.items()]
    search = data.get("search", {})
    extra = set(search) - {"max_evaluations"}
    if extra:
        raise TuneError(f"[search]: unknown keys {sorted(extra)}; valid: max_evaluations")
    max_eval = search.get("max_evaluations", DEFAULT_MAX_EVALUATIONS)
    if not isinstance(max_eval, int) or isinstance(max_eval, bool) or max_eval < 1:
        raise TuneError(f"[search] max_evaluations must be a positive integer, got {max_eval!r}")
    return bounds, max_eval


def _bound(name: str, spec: Any) -> Bound:
    path = BOUND_ALIASES.get(name, name)
    parts = path.split(".")
    if parts[0] == ROUTE_WIDE:
        _check_route_wide(name, parts, spec)
    elif not ((len(parts) == 2 and parts[0] == "policy") or (len(parts) == 3 and parts[0] == "tier")):
        raise TuneError(f"bound {name!r}: not an alias ({', '.join(sorted(BOUND_ALIASES))}) nor a policy path "
                        f"policy.KEY / tier.NAME.KEY / tier.*.KEY / {ROUTE_WIDE}.KEY")
    ok = isinstance(spec, list) and len(spec) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in spec)
    if not ok:
        raise TuneError(f"bound {name!r} must be [low, high, step] (numbers), got {spec!r}")
    low, high, step = spec
    if not (low <= high and step > 0):
        raise TuneError(f"bound {name!r}: need low <= high and step > 0, got {spec!r}")
    count = int(math.floor((high - low) / step + 1e-9)) + 1
    if count > MAX_VALUES_PER_BOUND:
        raise TuneError(f"bound {name!r} spans {count} values (at most {MAX_VALUES_PER_BOUND}); use a larger step")
    integer = all(isinstance(x, int) for x in spec)
    values = tuple(int(low + i * step) if integer else round(low + i * step, 10) for i in range(count))
    return Bound(name, path, values)


def _check_route_wide(name: str, parts: list[str], spec: Any) -> None:
    """Refuse a ``route_wide.KEY`` bound whose key :class:`RouteWideConfig` does not have (naming the valid
    ones), a deeper path (per-route tables are not searched) or a non-integer bound on an integer key."""
    keys = RouteWideConfig.keys()
    if len(parts) != 2 or parts[1] not in keys:
        raise TuneError(f"bound {name!r}: {ROUTE_WIDE}.KEY names a key of the global [{ROUTE_WIDE}] table, one of "
                        f"{', '.join(keys)} (per-route tables are not searched)")
    if isinstance(getattr(RouteWideConfig(), parts[1]), int) and isinstance(spec, list) and not all(
            isinstance(x, int) and not isinstance(x, bool) for x in spec):
        raise TuneError(f"bound {name!r}: {ROUTE_WIDE}.{parts[1]} is an integer; give integer [low, high, step], "
                        f"got {spec!r}")


def current_value(policy: PolicyConfig, path: str) -> float:
    """The value of a policy path in ``policy`` (``tier.*`` reads the default tier, ``route_wide.KEY`` the global
    ``[route_wide]`` table). Raises :class:`TuneError`."""
    parts = path.split(".")
    try:
        if parts[0] == "policy":
            return getattr(policy, parts[1])
        if parts[0] == ROUTE_WIDE and parts[1] in RouteWideConfig.keys():
            return getattr(policy.route_wide, parts[1])
        tier = policy.default_tier if parts[1] == "*" else parts[1]
        return getattr(policy.tiers[tier], parts[2])
    except (AttributeError, KeyError):
        raise TuneError(f"policy has no {path!r} (see pipeline/policy/defaults.py for the keys)") from None


def policy_toml(base: Mapping[str, Any], values: Mapping[str, float], tiers: Sequence[str]) -> str:
    """The policy file text: ``base`` (a parsed policy file) with ``values`` (path → number) set.

    ``tier.*`` paths are written into every tier of ``tiers``, ``route_wide.KEY``
    into the global ``[route_wide]`` table. Only tables of scalars are supported
    (the policy file's layout).
    """
    doc: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for path, value in values.items():
        parts = path.split(".")
        if parts[0] in ("policy", ROUTE_WIDE):
            doc.setdefault(parts[0], {})[parts[1]] = value
        else:
            tier_table = doc.setdefault("tier", {})
            for t in (tiers if parts[1] == "*" else [parts[1]]):
                tier_table[t] = dict(tier_table.get(t, {}))
                tier_table[t][parts[2]] = value
    return _dump(doc)


def _dump(doc: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for name, table in doc.items():
        if not isinstance(table, dict):
            raise TuneError(f"policy file: top-level key {name!r} is not a table")
        _dump_table(lines, name, table)
    return "\n".join(lines)


def _dump_table(lines: list[str], name: str, table: Mapping[str, Any]) -> None:
    """Append table ``name`` (its scalars, then its sub-tables, at any depth: ``[route."r".route_wide]``)."""
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    if scalars:
        lines += [f"[{name}]", *(f"{k} = {_scalar(v)}" for k, v in scalars.items()), ""]
    for sub, inner in table.items():
        if isinstance(inner, dict):
            _dump_table(lines, f"{name}.{_key(sub)}", inner)


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else '"' + k.replace('"', '\\"') + '"'


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list) and all(isinstance(x, str) for x in v):  # [error_classes.<provider>] patterns
        return "[" + ", ".join(map(_scalar, v)) + "]"
    raise TuneError(f"policy file value {v!r} cannot be written (numbers, strings, booleans and lists of "
                    f"strings only)")


@dataclass
class History:
    """What every candidate is replayed on: stored events in memory and the labelled periods."""

    chunks: list[ChannelEvents]
    incidents: list[Incident]
    clean: list[Incident]
    from_ms: int
    to_ms: int


def load_history(client: Any, from_ms: int, to_ms: int, incidents: Sequence[Incident],
                 warmup_ms: int) -> History:
    """Read the events of the labelled channels on ``[from_ms - warmup_ms, to_ms)`` once, into memory.

    Raises :class:`TuneError` when there is no labelled incident or no clean period in the span.
    """
    labelled = [i for i in incidents if not i.is_clean]
    clean = [i for i in incidents if i.is_clean]
    if not labelled:
        raise TuneError("no labelled incident in the span; mark one with `channel-health incident mark` or run a drill")
    if not clean:
        raise TuneError("no clean period in the span; mark one with `channel-health incident mark --kind clean` "
                        "(without one, every threshold would be pushed to its most sensitive bound)")
    channels = sorted({i.channel for i in incidents})
    chunks = list(read_events(client, max(0, from_ms - warmup_ms), to_ms, channels))
    if not chunks:
        raise TuneError(f"no stored request events for channels {', '.join(channels)} in the span")
    return History(chunks, labelled, clean, from_ms, to_ms)


def evaluate(history: History, base_doc: Mapping[str, Any], tiers: Sequence[str],
             values: Mapping[str, float]) -> Evaluation:
    """Replay ``history`` with the base policy plus ``values``; a policy the loader refuses is recorded, not raised."""
    ev = Evaluation(dict(values))
    try:
        policy = _load_text(policy_toml(base_doc, values, tiers))
    except (ValueError, TypeError) as exc:
        ev.refused = str(exc)
        return ev
    grace = policy.window_ms
    tl = replay_chunks(history.chunks, policy, history.from_ms, history.to_ms).timelines
    for i in history.incidents:
        found = first_detection(tl.get(i.channel, Timeline()), i, grace)
        ev.delays_ms[i.incident_id] = None if found is None else found - i.from_ms
    for c in history.clean:
        ev.clean_verdicts[c.incident_id] = clean_violations(tl.get(c.channel, Timeline()), c)[0]
    return ev


def _load_text(text: str) -> PolicyConfig:
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(text)
    try:
        return load_policy(fh.name)
    finally:
        Path(fh.name).unlink(missing_ok=True)


def search(history: History, bounds: Sequence[Bound], base_doc: Mapping[str, Any], base: PolicyConfig,
           max_evaluations: int) -> tuple[Evaluation, Evaluation, int]:
    """Find the best values; return ``(best, current, evaluations)``.

    Full grid when it has at most ``max_evaluations`` points; otherwise
    coordinate descent from the current values (snapped into the bounds):
    each pass tries every value of one bound with the others fixed and keeps
    the best, until a pass improves nothing or the budget is spent.
    """
    tiers = list(base.tiers)
    cache: dict[tuple, Evaluation] = {}

    def run(values: dict[str, float]) -> Evaluation:
        k = tuple(sorted(values.items()))
        if k not in cache:
            cache[k] = evaluate(history, base_doc, tiers, values)
        return cache[k]

    current = run({b.path: current_value(base, b.path) for b in bounds}) if bounds else run({})
    grid = math.prod(len(b.values) for b in bounds)
    if grid <= max_evaluations:
        candidates = [dict(zip((b.path for b in bounds), combo)) for combo in itertools.product(*(b.values for b in bounds))]
        best = min((run(v) for v in candidates), key=_rank)
        return best, current, len(cache)
    point = {b.path: min(b.values, key=lambda x, c=current_value(base, b.path): abs(x - c))  # noqa: B008 (bound per b)
             for b in bounds}
    best = run(point)
    improved = True
    while improved and len(cache) < max_evaluations:
        improved = False
        for b in bounds:
            for v in b.values:
                if len(cache) >= max_evaluations:
                    break
                cand = run({**best.values, b.path: v})
                if _rank(cand) < _rank(best):
                    best, improved = cand, True
    return best, current, len(cache)


def _rank(e: Evaluation) -> tuple:
    # Ties on the objective: prefer the least sensitive values (larger thresholds = fewer false alarms later).
    return (*e.key, tuple(-v for _, v in sorted(e.values.items())))


def tune(client: Any, from_ms: int, to_ms: int, bounds_path: str | Path, policy_path: str | Path | None,
         incidents: Sequence[Incident], warmup_ms: int | None = None) -> dict[str, Any]:
    """Propose a policy for ``[from_ms, to_ms)``; return a JSON-ready report with ``policy_toml``.

    Report keys: ``policy_toml`` (the proposal: the base file plus the tuned
    values), ``values`` / ``current_values`` (path → number), ``incidents``
    (per incident: kind, channel, delay ms proposed and current),
    ``clean_periods`` (non-healthy verdicts proposed and current),
    ``evaluations``. ``warmup_ms`` defaults to the base policy's baseline window.

    Raises :class:`TuneError` (bad bounds file, policy or history) and
    :class:`TuneRefused` when no candidate is feasible.
    """
    bounds, max_eval = load_bounds(bounds_path)
    try:
        base = load_policy(policy_path)
        base_doc = tomllib.loads(Path(policy_path).read_text(encoding="utf-8")) if policy_path else {}
    except (OSError, ValueError) as exc:  # TOMLDecodeError is a ValueError
        raise TuneError(f"base policy {policy_path}: {exc}") from None
    for b in bounds:
        current_value(base, b.path)  # unknown keys fail here, before any replay
    history = load_history(client, from_ms, to_ms, incidents,
                           base.baseline_window_ms if warmup_ms is None else warmup_ms)
    best, current, count = search(history, bounds, base_doc, base, max_eval)
    report = _report(history, best, current, count)
    if not best.feasible:
        why = best.refused or (f"best candidate {best.values}: {best.key[0]} clean-period verdicts, "
                               f"{best.key[1]} incidents missed")
        raise TuneRefused(f"no setting within the bounds detects every incident with no clean-period verdict ({why}); "
                          "widen the bounds or check the labels", report)
    report["policy_toml"] = policy_toml(base_doc, best.values, list(base.tiers))
    return report


def _report(history: History, best: Evaluation, current: Evaluation, count: int) -> dict[str, Any]:
    return {
        "from_ms": history.from_ms, "to_ms": history.to_ms, "evaluations": count,
        "values": best.values, "current_values": current.values,
        "incidents": [{"incident_id": i.incident_id, "channel": i.channel, "kind": i.kind, "from_ms": i.from_ms,
                       "delay_ms": best.delays_ms.get(i.incident_id),
                       "delay_ms_current": current.delays_ms.get(i.incident_id)} for i in history.incidents],
        "clean_periods": [{"incident_id": c.incident_id, "channel": c.channel, "from_ms": c.from_ms, "to_ms": c.to_ms,
                           "non_healthy_verdicts": best.clean_verdicts.get(c.incident_id),
                           "non_healthy_verdicts_current": current.clean_verdicts.get(c.incident_id)}
                          for c in history.clean],
    }

