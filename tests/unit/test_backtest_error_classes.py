"""Issue #32 part 3 "ClickHouse stores the class per event and the backtest replays it" (SPEC §4.1).

A worker with a policy whose ``[error_classes.acme]`` makes "channel key retired" (HTTP 500) a dead key stores
45 min of three channels (A and B on account acct-a); A's key dies at 40 min. The backtest reads the stored
class, message and account of each event: with that policy, and with the default one (the stored class is
what the worker decided), it reproduces the recorded verdicts exactly, A and B opening at the first such
event. A failed row stored without a class (written before migration 014) is classified with the candidate
policy's patterns. Before this change the backtest read none of the error fields: the replay saw a transient
5xx run on A only and never opened B, so none of these matched.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from pipeline.config import Settings
from pipeline.contracts import RequestEvent
from pipeline.policy.defaults import PolicyConfig, load_policy
from pipeline.tools.history.backtest import read_events, run_backtest
from pipeline.tools.history.synthetic import record

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
END = T0 + 45 * 60_000
DEAD_MS = T0 + 40 * 60_000
A, B, C = "acme/big@paid", "acme/mini@paid", "other/big@paid"
MESSAGE = "upstream: channel key retired (code 7)"


def _events() -> list[RequestEvent]:
    out = []
    for i, ts in enumerate(range(T0, END, 1_000)):
        for k, (ch, acct) in enumerate(((A, "acct-a"), (B, "acct-a"), (C, "acct-c"))):
            dead = ch == A and ts >= DEAD_MS
            out.append(RequestEvent(event_id=f"{ch}-{i}", ts_ms=ts + k, channel=ch, route="r",
                                    status="error" if dead else "ok", latency_ms=20.0 if dead else 700.0,
                                    tier="paid", account=acct, http_status=500 if dead else None,
                                    error_message=MESSAGE if dead else None))
    return out


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> PolicyConfig:
    p = tmp_path_factory.mktemp("pol") / "policy.toml"
    p.write_text('[error_classes.acme]\ncredential = ["channel key (is )?retired"]\n')
    return load_policy(p)


@pytest.fixture(scope="module")
def stored(tmp_path_factory, policy: PolicyConfig) -> Iterator[object]:
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl

    close_clients()
    path = tmp_path_factory.mktemp("btc") / "chdb"
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{path}"))
    apply_ddl(client)
    verdicts = record(client, _events(), policy)
    first = DEAD_MS
    for ch in (A, B):  # the worker opened A and its account sibling at A's first classified event
        v = next(v for v in verdicts if v.channel == ch and v.state == "open")
        assert (v.ts_ms, v.reasons) == (first, ["credential_invalid"])
    yield client
    close_clients()


def _exact(report: dict) -> None:
    assert report["transitions_recorded"] > 0
    assert report["transitions_replayed"] == report["transitions_recorded"] == report["transitions_matching"]
    for ch in report["channels"].values():
        assert ch["gained"] == [] and ch["lost"] == []


def test_stored_events_carry_class_message_and_account(stored) -> None:
    chunk = next(read_events(stored, DEAD_MS, DEAD_MS + 1_000, [A, B]))
    a = next(e for e in chunk.events if e.channel == A)
    b = next(e for e in chunk.events if e.channel == B)
    assert (a.error_class, a.error_message, a.account, a.status) == ("credential", MESSAGE, "acct-a", "error")
    assert (b.error_class, b.account, b.status) == (None, "acct-a", "ok")


@pytest.mark.parametrize("which", ["same policy", "default policy"])
def test_backtest_replays_the_stored_classes_exactly(stored, policy: PolicyConfig, which: str) -> None:
    report = run_backtest(stored, policy if which == "same policy" else PolicyConfig(), T0, END, keep_timelines=True)
    _exact(report)
    replayed = report["timelines"]["replayed"]
    for ch in (A, B):
        assert next(ts for ts, s in replayed[ch].points if s == "open") == DEAD_MS
    assert {s for _, s in replayed[C].points} == {"healthy"}


def test_rows_without_a_stored_class_are_classified_with_the_candidate_policy(stored, policy) -> None:
    update = "ALTER TABLE channel_health.request_events UPDATE error_class = {c} WHERE {w} SETTINGS mutations_sync = 1"
    stored.command(update.format(c="''", w="error_class != ''"))
    try:
        chunk = next(read_events(stored, DEAD_MS, DEAD_MS + 1_000, [A]))
        assert chunk.events[0].error_class is None and chunk.events[0].http_status == 500
        _exact(run_backtest(stored, policy, T0, END))
        plain = run_backtest(stored, PolicyConfig(), T0, END, keep_timelines=True)
        assert plain["channels"][B]["lost"]  # the built-in phrases: B's open is not replayed
        assert {s for _, s in plain["timelines"]["replayed"][B].points} == {"healthy"}
    finally:  # the module's other tests read the stored classes (any order, any xdist worker)
        stored.command(update.format(c="'credential'", w="status = 'error'"))
