"""Scorecard aggregation over seeds, the terminal table and the JSON document.

JSON (``--json PATH``)::

    {"seeds": [0, 1, ...],
     "scenarios": [{"name", "description", "primary", "start_s", "target_delay_s",
                    "policies": {"channel-health": {...}, "litellm": {...}, "envoy": {...},
                                 "resilience4j": {...}, "pybreaker": {...}, "new-api": {...},
                                 "one-api": {...}, "linkerd": {...}, "helicone": {...},
                                 "higress": {...}},
                    "oracle": {"goodput", "goodput_per_seed", "route_blackout_s", ...}}]}

Each policy: ``detection_delay_s`` (median over seeds of the primary target's delay, a missed seed
counting as infinitely late; null when the median is a miss or there is no target), ``detected``
(seeds that detected), ``delays_s`` (per seed, null = missed), ``false_verdicts`` (sum over seeds),
``false_verdicts_per_seed``, ``open_cycles`` (median), ``injected_at_detection`` (median per metric
over the detecting seeds), ``targets`` (per target channel: ``detection_delay_s``, ``detected``);
channel-health also ``first_reasons`` (per seed) and ``recovery`` (median per field; see
:func:`.runner.recovery_timeline`). Outcome (issue #33, :mod:`.goodput`): ``goodput`` (median over the
seeds of the share of the scenario's requests served, 0..1), ``goodput_per_seed``, ``route_blackout_s``
(median seconds with a route of the scenario and no channel in service, summed over routes) and
``route_blackout_s_per_seed``; ``oracle`` holds the same for a router that knows the truth.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Sequence

from .runner import CHANNEL_HEALTH, ORACLE, POLICIES, PolicyRun, targets
from .scenarios import GRADUAL_TARGET_ERROR_RATE, TARGET_DELAY_S

_SHORT = {"channel-health": "channel-health", "litellm": "LiteLLM", "envoy": "Envoy",
          "resilience4j": "resilience4j", "pybreaker": "pybreaker", "new-api": "new-api",
          "one-api": "one-api", "linkerd": "Linkerd", "helicone": "Helicone", "higress": "Higress"}


def _median_delay(values: Sequence[float | None]) -> float | None:
    if not values:
        return None
    m = median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else round(m, 1)


def _median_fields(dicts: Sequence[dict | None]) -> dict | None:
    present = [d for d in dicts if d]
    if not present:
        return None
    out = {}
    for k in present[0]:
        vals = [d[k] for d in present if d.get(k) is not None]
        out[k] = round(median(vals), 5) if vals else None
    return out


def aggregate(sc, runs: Sequence[dict[str, PolicyRun]]) -> dict:
    """One scenario's JSON entry from its per-seed runs (``runs[i][policy]``)."""
    tg = targets(sc)
    primary = tg[0] if tg else None
    entry = {"name": sc.name, "description": sc.description, "primary": primary.channel if primary else None,
             "start_s": primary.start_s if primary else None, "target_delay_s": TARGET_DELAY_S.get(sc.name),
             "policies": {}}
    if sc.name == "gradual-degradation" and primary:
        entry["target_error_rate_at_detection"] = GRADUAL_TARGET_ERROR_RATE
    for p in POLICIES:
        rs = [r[p] for r in runs]
        delays = [r.delays_s.get(primary.channel) if primary else None for r in rs]
        d = {
            "detection_delay_s": _median_delay(delays) if primary else None,
            "detected": sum(v is not None for v in delays) if primary else 0,
            "delays_s": [None if v is None else round(v, 1) for v in delays] if primary else [],
            "false_verdicts": sum(r.false_verdicts for r in rs),
            "false_verdicts_per_seed": [r.false_verdicts for r in rs],
            "open_cycles": median([r.open_cycles for r in rs]) if rs else 0,
            "injected_at_detection": _median_fields([r.injected for r in rs]),
            "targets": {t.channel: {"detection_delay_s": _median_delay([r.delays_s.get(t.channel) for r in rs]),
                                    "detected": sum(r.delays_s.get(t.channel) is not None for r in rs)}
                        for t in tg},
        }
        d.update(_outcome(rs))
        if p == CHANNEL_HEALTH:
            d["first_reasons"] = [r.reasons for r in rs]
            d["recovery"] = _median_fields([r.recovery for r in rs])
        entry["policies"][p] = d
    entry["oracle"] = _outcome([r[ORACLE] for r in runs if ORACLE in r])
    return entry


def _outcome(rs: Sequence[PolicyRun]) -> dict:
    """Goodput and blackout of one policy over its seeds (see the module doc)."""
    good = [r.goodput for r in rs if r.goodput is not None]
    return {"goodput": round(median(good), 5) if good else None, "goodput_per_seed": [r.goodput for r in rs],
            "route_blackout_s": median([r.route_blackout_s for r in rs]) if rs else 0.0,
            "route_blackout_s_per_seed": [r.route_blackout_s for r in rs]}


def outcome_table(doc: dict) -> str:
    """Markdown table: per scenario, each policy's median goodput (%) and route blackout (s), and the oracle."""
    head = "| scenario | " + " | ".join(_SHORT[p] for p in POLICIES) + " | oracle |"
    lines = [head, "|" + "---|" * (2 + len(POLICIES))]
    for e in doc["scenarios"]:
        cells = []
        for d in [*(e["policies"][p] for p in POLICIES), e.get("oracle") or {}]:
            g = d.get("goodput")
            cell = "—" if g is None else f"{100 * g:.2f} %"
            if d.get("route_blackout_s"):
                cell += f", dark {d['route_blackout_s']:.0f} s"
            cells.append(cell)
        lines.append(f"| {e['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(d: dict, n: int, has_target: bool) -> str:
    fv = f"FV {d['false_verdicts']}"
    if not has_target:
        return fv
    delay = d["detection_delay_s"]
    s = "missed" if delay is None else f"{delay:.0f} s"
    if 0 < d["detected"] < n or (delay is None and d["detected"]):
        s += f" ({d['detected']}/{n})"
    return f"{s}, {fv}"


def table(doc: dict) -> str:
    """Markdown table: per scenario, each policy's median detection delay and false verdicts."""
    n = len(doc["seeds"])
    head = "| scenario | target | " + " | ".join(_SHORT[p] for p in POLICIES) + " |"
    lines = [head, "|" + "---|" * (2 + len(POLICIES))]
    for e in doc["scenarios"]:
        tgt = "—" if e["target_delay_s"] is None else f"≤ {e['target_delay_s']:.0f} s"
        if e.get("target_error_rate_at_detection"):
            tgt = f"< {100 * e['target_error_rate_at_detection']:.0f} % err"
        if e["primary"] is None:
            tgt = "FV 0"
        cells = [_cell(e["policies"][p], n, e["primary"] is not None) for p in POLICIES]
        lines.append(f"| {e['name']} | {tgt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail(doc: dict) -> str:
    """Markdown table of channel-health's detail: injected strength at detection, open cycles, recovery."""
    lines = ["| scenario | first reasons | injected at detection | open cycles | open→half_open / →recovering / "
             "→healthy (SPEC) |", "|---|---|---|---|---|"]
    for e in doc["scenarios"]:
        if e["primary"] is None:
            continue
        d = e["policies"][CHANNEL_HEALTH]
        reasons = next((r for r in d["first_reasons"] if r), [])
        inj = ", ".join(f"{k} {v:.4g}" for k, v in (d["injected_at_detection"] or {}).items()) or "—"
        rec = d.get("recovery")
        if rec:
            def f(k, rec=rec):
                return "—" if rec.get(k) is None else f"{rec[k]:.0f}"
            r = (f"{f('open_to_half_open_s')} / {f('half_open_to_recovering_s')} / {f('recovering_to_healthy_s')} s "
                 f"({f('spec_open_to_half_open_s')} / {f('spec_half_open_to_recovering_s')} / "
                 f"{f('spec_recovering_to_healthy_s')})")
        else:
            r = "never opened"
        lines.append(f"| {e['name']} | {', '.join(reasons) or '—'} | {inj} | {d['open_cycles']:g} | {r} |")
    return "\n".join(lines)
