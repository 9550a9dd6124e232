"""The Grafana board cannot rot (issue #21): every ClickHouse panel and variable query of
``infra/grafana/dashboards/channel-health.json`` runs against chDB holding a scenario and returns rows of
the expected columns; every Prometheus panel names metrics that :mod:`pipeline.metrics` exports.

Grafana macros and variables are expanded the way the grafana-clickhouse-datasource plugin does
(``$__timeFilter(col)`` -> ``col >= toDateTime(from) AND col <= toDateTime(to)``), then the SQL goes through
the project's read-only query path, as a read-only Grafana user would run it.

Names are data (SPEC §8, issue #30 item 5): a variable's value is a route or channel name a gateway chose,
so every panel and variable query writes it as ``decodeURLComponent('${name:percentencode}')``. Grafana's
``percentencode`` format (``encodeURIComponent`` plus ``!'()*``) leaves only ``[A-Za-z0-9_.~%-]`` in the SQL
text, so no value can end the literal. (``sqlstring`` doubles ``'`` but leaves ``\\`` alone, and ClickHouse
reads ``\\'`` inside a literal as an escaped quote: a name ending in a backslash breaks out of it.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from pipeline.storage.query import run_readonly_query
from scenario_store import FAULTY_CHANNEL, START_MS, open_scenario, scenario_chdb_url  # noqa: F401  (fixture)

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "infra" / "grafana" / "dashboards" / "channel-health.json"
VARIABLES = {"route": "chat-13b", "channel": FAULTY_CHANNEL}
#: The scenario's event time (sparse-consecutive-failures: 9451 s), epoch seconds.
FROM_S, TO_S = START_MS // 1000, START_MS // 1000 + 9_451
#: Columns each ClickHouse panel must return, in order (a new panel says here what it shows).
EXPECTED = {
    "Traffic (requests per minute)": ["time", "channel", "requests"],
    "Latency P50/P90/P95/P99 (5 min, ok requests)": ["time", "p50_ms", "p90_ms", "p95_ms", "p99_ms"],
    "Error rate (1 min)": ["time", "error_rate", "failures", "requests"],
    "Content quality (5 min)": ["time", "quality_score", "quality_baseline", "missing_field_rate"],
    "State": ["time", "channel", "state"],
    "Weight and route share": ["time", "channel", "weight", "route_share"],
    "P95 against baseline (trip x1.8, clear x1.2)": ["time", "p95_ms", "baseline_p95_ms", "trip_ms", "clear_ms"],
    "Quota remaining": ["time", "quota_remaining", "forecast_in_30m"],
    "Storage lag (ingested_at - event time)": ["time", "max_lag_s"],
}


#: Grafana's variable formats used here (grafana/scenes formatRegistry): ``percentencode`` is
#: ``encodeURIComponent`` with ``!'()*`` also encoded, i.e. Python's ``quote(v, safe="")``.
FORMATS = {None: lambda v: v, "percentencode": lambda v: quote(v, safe="")}
VARIABLE_USE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\$(?!__)(\w+)")


def expand(sql: str, variables: dict[str, str] = VARIABLES, from_s: int = FROM_S, to_s: int = TO_S) -> str:
    """Plain SQL of a panel query: Grafana's macros and ``$var`` / ``${var}`` / ``${var:format}`` replaced
    (formats: :data:`FORMATS`); raises on any other ``$``."""
    sql = re.sub(r"\$__timeFilter\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)",
                 rf"\1 >= toDateTime({from_s}) AND \1 <= toDateTime({to_s})", sql)
    sql = sql.replace("$__fromTime", f"toDateTime({from_s})").replace("$__toTime", f"toDateTime({to_s})")
    sql = VARIABLE_USE.sub(lambda m: FORMATS[m.group(2)](variables[m.group(1) or m.group(3)]), sql)
    assert "$" not in sql, f"unexpanded macro in {sql}"
    return sql


def _board() -> dict:
    return json.loads(DASHBOARD.read_text())


def _targets(kind: str) -> list[tuple[str, dict]]:
    return [(p["title"], t) for p in _board()["panels"] for t in p["targets"] if t["datasource"]["type"] == kind]


def test_expand_replaces_macros_and_variables() -> None:
    assert expand("SELECT 1 WHERE c = '${channel}' AND r = '$route' AND $__timeFilter(ts)", from_s=10, to_s=20) \
        == f"SELECT 1 WHERE c = '{FAULTY_CHANNEL}' AND r = 'chat-13b' AND ts >= toDateTime(10) AND ts <= toDateTime(20)"


def test_board_has_seed_003_panels_and_route_channel_variables() -> None:
    board = _board()
    assert [v["name"] for v in board["templating"]["list"]] == ["route", "channel"]
    titles = [p["title"] for p in board["panels"]]
    assert len(set(titles)) == len(titles)
    assert {t for t, _ in _targets("grafana-clickhouse-datasource")} == set(EXPECTED)


def test_every_clickhouse_panel_returns_rows_of_its_columns(scenario_chdb_url) -> None:  # noqa: F811
    client = open_scenario(scenario_chdb_url)
    for title, target in _targets("grafana-clickhouse-datasource"):
        cols, rows = run_readonly_query(client, expand(target["rawSql"]))
        assert cols == EXPECTED[title], title
        assert rows, f"{title}: no rows"
    # spot checks against the scenario: the faulted channel's open state and its failures are on the board
    cols, rows = run_readonly_query(client, expand(next(t["rawSql"] for n, t in _targets(
        "grafana-clickhouse-datasource") if n == "State")))
    assert ("replicate/llama-13b@free", "open") in {(r[1], r[2]) for r in rows}
    cols, rows = run_readonly_query(client, expand(next(t["rawSql"] for n, t in _targets(
        "grafana-clickhouse-datasource") if n == "Error rate (1 min)")))
    assert sum(r[2] for r in rows) == 8


def _queries() -> list[tuple[str, str]]:
    """``(where, SQL)`` of every ClickHouse panel target and every variable query of the board."""
    board = _board()
    return ([(t, target["rawSql"]) for t, target in _targets("grafana-clickhouse-datasource")]
            + [(f"variable {v['name']}", v["query"]) for v in board["templating"]["list"]])


def test_every_variable_is_percent_encoded_and_decoded_by_clickhouse() -> None:
    uses = 0
    for where, sql in _queries():
        for m in VARIABLE_USE.finditer(sql):
            uses += 1
            name = m.group(1) or m.group(3)
            assert m.group(2) == "percentencode", f"{where}: ${name} must be written ${{{name}:percentencode}}"
            assert sql[:m.start()].endswith("decodeURLComponent('") and sql[m.end():].startswith("')"), where
    assert uses == 10  # 4 route and 5 channel filters in panels, 1 route filter in the channel variable
    assert all(v["definition"] == v["query"] for v in _board()["templating"]["list"])


@pytest.mark.parametrize("hostile", ["x\\' OR 1=1 --", "x' OR channel != '", "'; DROP TABLE x; --", "x\\",
                                     "<!channel>", "a\nb", "x/$\\undefinedcommand$", "\u202eevil"])
def test_hostile_names_in_variables_select_nothing_and_break_nothing(scenario_chdb_url, hostile) -> None:  # noqa: F811
    client = open_scenario(scenario_chdb_url)
    for where, sql in _queries():
        if not VARIABLE_USE.search(sql):
            continue  # the route variable's own query takes no variable
        text = expand(sql, {"route": hostile, "channel": hostile})
        assert hostile not in text, where  # only its percent-encoded form reaches the SQL text
        cols, rows = run_readonly_query(client, text)
        # no channel or route has this name: every filtered query returns nothing (an injected OR returns rows)
        assert rows == [], f"{where}: {len(rows)} rows for {hostile!r}"
    cols, rows = run_readonly_query(client, expand(_queries()[-1][1], {"route": "chat-13b"}))
    assert [r[0] for r in rows] == ["replicate/llama-13b@free", "together/llama-13b@paid"]


def test_variable_queries_list_routes_and_channels(scenario_chdb_url) -> None:  # noqa: F811
    client = open_scenario(scenario_chdb_url)
    route_var, channel_var = _board()["templating"]["list"]
    assert [r[0] for r in run_readonly_query(client, expand(route_var["query"]))[1]] == ["chat-13b", "chat-8b"]
    assert [r[0] for r in run_readonly_query(client, expand(channel_var["query"]))[1]] == [
        "replicate/llama-13b@free", "together/llama-13b@paid"]


def test_prometheus_panels_use_exported_metrics() -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from pipeline.metrics import PipelineMetrics

    registry = CollectorRegistry()
    metrics = PipelineMetrics(registry=registry)
    metrics.track_worker(lambda: None, dict, lambda: None, lambda: None)  # names only: no samples
    exported = set(re.findall(r"^# TYPE (\w+) ", generate_latest(registry).decode(), re.M))
    targets = _targets("prometheus")
    assert targets
    for title, target in targets:
        names = set(re.findall(r"\bchannel_health_\w+", target["expr"]))
        assert names, title
        for name in names:
            assert re.sub(r"_(bucket|count|sum)$", "", name) in exported, f"{title}: {name} is not exported"
