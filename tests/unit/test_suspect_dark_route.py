"""A suspicion (pipeline/engine/suspects.py) never darkens a route at the router (SPEC §4.2 "never black out a
route by inference"): the engine makes a channel suspect only while another channel of its route is in service
*in its own view*, but a router may see that peer at share 0 for reasons the engine cannot know: an operator's
override forcing it ``open`` or to weight 0 (applied after the engine, pipeline/policy/override.py), or no
verdict of it yet (a channel new on the route, whose first round is up to 30 s away). Then every share the
router holds is 0 and :func:`pipeline.router.table.route_shares` would report ``all_open``: a route dark on a
run of 3 failures. The suspects then share the route by their weights (a suspicion is a soft 0)."""

from __future__ import annotations

import msgspec

from pipeline.contracts import Verdict
from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC
from pipeline.policy.override import Override, OverrideTable
from pipeline.router import table as router_table
from pipeline.router.table import HealthTable, route_shares

from test_suspects import START, WARM_S, _stream

WALL = 1_800_000_000_000  # wall clock of the overrides (UTC epoch ms)


def _three_quick_failures(events: list[dict], ch: str = "a") -> list[dict]:
    """Three requests to ``ch`` sent at WARM_S + 10, 50 and 100 ms fail in 40 ms: they complete in a row
    (+50, +90, +140 ms) between two of its regular successes: ``ch`` is suspect at +140 ms (test_suspects)."""
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": ch, "route": "r",
                       "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    return events


def _table_at(verdicts: list[Verdict], until_ms: int, overrides: OverrideTable | None = None) -> HealthTable:
    """A router's table fed every verdict up to event time ``until_ms`` (overrides applied, as the worker does)."""
    table = HealthTable()
    for v in verdicts:
        if v.ts_ms <= until_ms:
            table.update(overrides.apply(v) if overrides is not None else v)
    return table


def test_a_suspect_beside_a_peer_an_operator_forced_open_keeps_the_route():
    """Route r = a, b; an operator forced b open (maintenance). a is healthy and carries the route (share 1 at
    the router). a's three quick failures make it suspect (+140 ms): the engine sees b in service (it does not
    know the override), so the router held a at 0 beside b forced to 0: all_open, the route dark. a keeps the
    route (share 1, weight 1) while suspect; b stays at 0 as forced."""
    _, verdicts = replay(_three_quick_failures(_stream({})))
    suspect = next(v for v in verdicts if SUSPECT_METRIC in v.metrics)
    assert (suspect.channel, suspect.ts_ms - START - WARM_S * 1000) == ("a", 140)
    overrides = OverrideTable()
    overrides.put(Override(kind="open", by="op", reason="maintenance", set_ts_ms=WALL, expires_ts_ms=WALL + 3_600_000,
                           channel="b"), WALL)
    before = _table_at(verdicts, suspect.ts_ms - 1, overrides).weights("r")
    assert (before.shares, before.all_open) == ({"a": 1.0, "b": 0.0}, False)
    during = _table_at(verdicts, suspect.ts_ms, overrides).weights("r")
    assert (during.shares, during.all_open, during.overridden) == ({"a": 1.0, "b": 0.0}, False, ("b",))


def test_a_suspect_beside_a_peer_without_a_verdict_yet_keeps_the_route():
    """Route r had only a until WARM_S; b's traffic starts at WARM_S + 50 ms (a channel added to the route): the
    engine counts b in service at once, but b's first verdict comes with its first round (+10 s here). a's
    suspicion at +140 ms left the router's route r = {a: 0}: all_open for 2.5 s. a keeps the route."""
    events = [e for e in _stream({}) if e["channel"] == "a" or e["ts_ms"] >= START + WARM_S * 1000 + 50]
    _, verdicts = replay(_three_quick_failures(events))
    suspect = next(v for v in verdicts if SUSPECT_METRIC in v.metrics)
    assert (suspect.channel, suspect.ts_ms - START - WARM_S * 1000) == ("a", 140)
    assert not any(v.channel == "b" for v in verdicts if v.ts_ms <= suspect.ts_ms)
    during = _table_at(verdicts, suspect.ts_ms).weights("r")
    assert (during.shares, during.all_open) == ({"a": 1.0}, False)


def _v(channel: str, weight: float, share: float, seq: int = 1, suspect: bool = False,
       override: dict | None = None) -> Verdict:
    metrics: dict = {"route_share": share, **({SUSPECT_METRIC: 3} if suspect else {})}
    return Verdict(channel=channel, route="r", ts_ms=START, state="healthy" if weight > 0 else "open",
                   weight=weight, reasons=[], metrics=metrics, seq=seq,
                   **({"override": override} if override else {}))


def test_route_shares_suspects_share_a_route_otherwise_dark_by_their_weights():
    """Pure rule: all shares 0 with suspects at weight > 0 among them -> the suspects by weight; a suspect beside
    a peer with a share stays at 0; an all-open route without a suspect stays all 0; a suspect forced to weight
    0 by an operator stays at 0 (the override wins)."""
    forced_open = {"kind": "open", "by": "op", "reason": "m", "expires_ts_ms": WALL + 1, "set_ts_ms": WALL}
    assert route_shares([_v("a", 1.0, 0.0, suspect=True), _v("b", 0.0, 0.0, override=forced_open)])[0] == {
        "a": 1.0, "b": 0.0}
    assert route_shares([_v("a", 0.5, 0.0, suspect=True), _v("b", 1.0, 0.0, suspect=True),
                         _v("c", 0.0, 0.0)])[0] == {"a": 1 / 3, "b": 2 / 3, "c": 0.0}
    assert route_shares([_v("a", 1.0, 0.0, suspect=True), _v("b", 1.0, 0.5)])[0] == {"a": 0.0, "b": 1.0}
    assert route_shares([_v("a", 0.0, 0.0), _v("b", 0.0, 0.0)])[0] == {"a": 0.0, "b": 0.0}
    forced_zero = {**forced_open, "kind": "weight", "weight": 0.0}
    assert route_shares([_v("a", 0.0, 0.0, suspect=True, override=forced_zero), _v("b", 0.0, 0.0)])[0] == {
        "a": 0.0, "b": 0.0}


def test_the_router_names_the_engine_metric():
    """The router keeps no import of the engine: its copy of the metric's name is the engine's."""
    assert router_table.SUSPECT_METRIC == SUSPECT_METRIC
    assert msgspec.json.decode(msgspec.json.encode(_v("a", 1.0, 0.0, suspect=True)), type=Verdict).metrics[
        SUSPECT_METRIC] == 3


def test_the_scorecard_router_model_follows_the_table():
    """The scorecard's router model (pipeline/tools/scorecard/runner.py ``_engine_shares``) hands out what
    :class:`HealthTable` does: route r = a, b(no verdict yet); a's round verdict (share 1) at t 1 s, its suspect
    verdict at t 2 s, its end at t 3 s. Before the rule, the grid point t 2 s was a blackout (all 0); now a keeps
    the route, as at the router. b's verdict (share 0.5) at t 4 s: 2/3, 1/3 of a's 1.0 and b's 0.5; a suspect again at 5 s
    beside b with a share stays at 0."""
    from types import SimpleNamespace

    import numpy as np

    from pipeline.tools.scorecard.goodput import RouteTruth
    from pipeline.tools.scorecard.runner import _engine_shares

    rt = RouteTruth("r", t_s=np.arange(7.0), demand_rps=np.ones(7), channels=("a", "b"), static=np.full((2, 7), 0.5))
    vs = [_v("a", 1.0, 1.0, 1), _v("a", 1.0, 0.0, 2, suspect=True), _v("a", 1.0, 1.0, 3),
          Verdict(channel="b", route="r", ts_ms=START, state="healthy", weight=1.0, reasons=[],
                  metrics={"route_share": 0.5}, seq=1), _v("a", 1.0, 0.0, 4, suspect=True)]
    times = [1000, 2000, 3000, 4000, 5000]
    vs = [msgspec.structs.replace(v, ts_ms=t) for v, t in zip(vs, times)]
    shares = _engine_shares(SimpleNamespace(routes={"r": rt}), vs, lambda ts: ts / 1000)["r"]
    assert shares[0].tolist() == [0.5, 1.0, 1.0, 1.0, 2 / 3, 0.0, 0.0]
    assert shares[1].tolist() == [0.5, 0.0, 0.0, 0.0, 1 / 3, 1.0, 1.0]


def test_the_litellm_hook_keeps_serving_a_suspect_beside_a_forced_open_peer():
    """The LiteLLM hook (pipeline/router/litellm_hook.py) reads the table: with a suspect (engine share 0) and
    its only peer forced open by an operator it raised AllChannelsOpen (every request of the model refused);
    now it sends the suspect everything."""
    import pytest

    litellm = pytest.importorskip("litellm", reason="optional extra")
    from pipeline.router.litellm_hook import install

    forced_open = {"kind": "open", "by": "op", "reason": "m", "expires_ts_ms": WALL + 1, "set_ts_ms": WALL}
    table = HealthTable()
    router = litellm.Router(model_list=[
        {"model_name": "m", "litellm_params": {"model": f"openai/{c}", "api_key": "sk-test", "mock_response": c},
         "model_info": {"id": c, "channel": c}} for c in ("a", "b")])
    strategy = install(router, table)
    table.update(_v("a", 1.0, 0.0, suspect=True))
    table.update(_v("b", 0.0, 0.0, override=forced_open))
    assert [(d["model_info"]["channel"], w) for d, w in strategy.shares("m")] == [("a", 1.0), ("b", 0.0)]
