"""Issue #32 part 1 "patterns overridable in policy.toml per provider": one ``[error_classes.<provider>]`` table
gives the same class in the worker's decoder, the offline replay (scorecard, acceptance), the backtest and the
sink's salvage path; a bad table is refused at load naming its key.

The provider ``acme`` answers a dead key as HTTP 500 "channel key retired" (a relay wrapping the upstream 401):
the built-in phrases call that ``transient``; the policy's pattern makes it ``credential``, which opens the
channel and its account sibling at that very event (SPEC §4.1). Before this change ``load_policy`` ignored
the ``[error_classes]`` table and every path classified with the built-in phrases only: each test below
fails there (checked on main: ``PolicyConfig`` has no ``classifier``/``error_patterns``, the salvage path
re-classified as ``transient``).
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.engine.batch import BatchProcessor
from pipeline.engine.replay import replay
from pipeline.ingest.error_class import ErrorTableError
from pipeline.policy.defaults import PolicyConfig, load_policy
from pipeline.sinks.batches import rows_of

T0 = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
A, B, C = "acme/big@paid", "acme/mini@paid", "other/big@paid"
RETIRED = {"status": "error", "http_status": 500, "error_message": "upstream: channel key retired (code 7)"}
POLICY_TOML = '[error_classes.acme]\ncredential = ["channel key (is )?retired"]\n'


@pytest.fixture()
def policy(tmp_path: Path) -> PolicyConfig:
    p = tmp_path / "policy.toml"
    p.write_text(POLICY_TOML)
    return load_policy(p)


def _events(dead_from_s: int = 600, end_s: int = 660) -> list[dict]:
    """2 req/s on A, B (account acct-a) and C (acct-c); A answers "channel key retired" from ``dead_from_s``."""
    out = []
    for i in range(end_s * 2):
        for k, (ch, acct) in enumerate(((A, "acct-a"), (B, "acct-a"), (C, "acct-c"))):
            ts = T0 + i * 500 + k
            e = {"event_id": f"{ch}-{i}", "ts_ms": ts, "channel": ch, "route": "r", "status": "ok",
                 "latency_ms": 700.0, "tier": "paid", "account": acct}
            if ch == A and i >= dead_from_s * 2:
                e.update(RETIRED, latency_ms=20.0)
            out.append(e)
    return out


def test_policy_toml_error_classes_are_loaded_into_the_policy_classifier(policy: PolicyConfig) -> None:
    assert policy.error_patterns == {"acme": {"credential": ["channel key (is )?retired"]}}
    cls = policy.classifier.classify("error", 500, None, RETIRED["error_message"], "acme")
    assert cls == "credential"
    assert PolicyConfig().classifier.classify("error", 500, None, RETIRED["error_message"], "acme") == "transient"
    # only for that provider: another provider's identical message keeps the built-in class
    assert policy.classifier.classify("error", 500, None, RETIRED["error_message"], "other") == "transient"


def test_worker_decoder_classifies_with_the_policy_patterns(policy: PolicyConfig) -> None:
    raw = msgspec.json.encode({"events": [{"event_id": "e1", "ts_ms": T0, "channel": A, "route": "r",
                                           "latency_ms": 20.0, **RETIRED}]})
    for proc in (BatchProcessor(Engine(policy)),
                 BatchProcessor.for_settings(Settings(kafka_bootstrap=None, clickhouse_url=None), policy)):
        assert proc.decoder.classifier is policy.classifier
        result = proc.decoder.decode(raw, now_ms=T0)
        assert [e.error_class for e in result.events] == ["credential"]
        assert result.envelope is not None and result.envelope.endswith(b',"error_classes":["credential"]}')
    default = BatchProcessor(Engine()).decoder.decode(raw, now_ms=T0)
    assert [e.error_class for e in default.events] == ["transient"]


def test_replay_with_the_policy_opens_the_channel_and_its_account_sibling_at_the_first_event(
        policy: PolicyConfig) -> None:
    events = _events()
    first = min(e["ts_ms"] for e in events if e.get("http_status") == 500)
    _, verdicts = replay(events, policy=policy)
    for ch in (A, B):
        v = next(v for v in verdicts if v.channel == ch and v.state == "open")
        assert (v.ts_ms, v.reasons, v.metrics["error_class"]) == (first, ["credential_invalid"], "credential")
        assert v.metrics["account"] == "acct-a" and v.metrics["account_channels"] == 2
    assert {v.state for v in verdicts if v.channel == C} == {"healthy"}
    # the built-in phrases: a transient 5xx run, detected later by the §4 detectors, and B is never opened
    _, plain = replay(events)
    assert not [v for v in plain if v.channel == B and v.state != "healthy"]
    assert next(v for v in plain if v.channel == A and v.state == "open").reasons != ["credential_invalid"]


def test_salvaged_envelope_keeps_the_class_the_worker_resolved() -> None:
    # the sink process holds no policy: a payload ClickHouse refused is re-encoded with the classes the
    # decoder put beside the events, not re-classified with the built-in phrases
    event = {"event_id": "e1", "ts_ms": T0, "channel": A, "route": "r", "latency_ms": 20.0, **RETIRED}
    payload = msgspec.json.encode({"events": [event], "error_classes": ["credential"]})
    rows = msgspec.json.decode(rows_of(payload)[0])
    assert rows[0][0]["error_class"] == "credential"
    bare = msgspec.json.decode(rows_of(msgspec.json.encode({"events": [event]}))[0])
    assert bare[0][0]["error_class"] == "transient"


@pytest.mark.parametrize(("toml", "key"), [
    ('[error_classes.acme]\ncredential = ["[unclosed"]\n', "error_classes.acme.credential[0]: invalid regex"),
    ('[error_classes.acme]\ndead_key = ["x"]\n', "error_classes.acme.dead_key: unknown error class"),
    ('[error_classes.acme]\ncredential = "x"\n', "error_classes.acme.credential: expected a list"),
    ('[error_classes.acme]\ncredential = ["(a+)+b"]\n', "error_classes.acme.credential[0]: nested quantifier"),
    ('[error_classes.acme]\ncredential = [""]\n', "error_classes.acme.credential[0]: a pattern must be"),
    ('[error_classes]\nacme = 3\n', "error_classes.acme: expected a table of classes"),
])
def test_bad_error_class_table_is_refused_at_load_naming_the_key(tmp_path: Path, toml: str, key: str) -> None:
    p = tmp_path / "policy.toml"
    p.write_text(toml)
    with pytest.raises(ErrorTableError) as exc:
        load_policy(p)
    assert isinstance(exc.value, ValueError)  # the CLI's one-line refusal (`worker --policy`) catches ValueError
    assert str(exc.value).startswith(key)


def test_policy_with_patterns_pickles_and_copies(policy: PolicyConfig) -> None:
    import copy
    import pickle

    for clone in (pickle.loads(pickle.dumps(policy)), copy.deepcopy(policy)):
        assert clone.error_patterns == policy.error_patterns
        assert clone.classifier.classify("error", 500, None, RETIRED["error_message"], "acme") == "credential"



def test_scorecard_policy_file_classifies_the_scenario_events(tmp_path: Path) -> None:
    # dead-key: OpenAI's 401 "Incorrect API key provided". A policy calling that wording `caller` (the
    # client's fault) makes channel-health ignore it: the same file changes the scorecard's classes too
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    p = tmp_path / "policy.toml"
    p.write_text('[error_classes.openai]\ncaller = ["incorrect api key"]\n')
    card = {}
    for name, extra in (("default", []), ("policy", ["--policy", str(p)])):
        out = tmp_path / f"{name}.json"
        res = CliRunner().invoke(app, ["scorecard", "--seeds", "1", "--scenarios", "dead-key", "--json", str(out),
                                       *extra])
        assert res.exit_code == 0, res.output
        card[name] = json.loads(out.read_text())["scenarios"][0]["policies"]["channel-health"]
    assert card["default"]["detected"] == 1 and card["default"]["detection_delay_s"] < 1.0  # the first 401
    assert card["policy"]["detected"] == 0 and card["policy"]["detection_delay_s"] is None
    bad = tmp_path / "bad.toml"
    bad.write_text('[error_classes.openai]\ncredential = ["(x"]\n')
    res = CliRunner().invoke(app, ["scorecard", "--seeds", "1", "--scenarios", "dead-key", "--policy", str(bad)])
    assert res.exit_code == 2 and "error_classes.openai.credential[0]: invalid regex" in res.output


def test_tune_proposal_keeps_the_error_class_patterns() -> None:
    # `tune --policy` writes its proposal from the base file: the patterns (lists of strings) go with it
    import tomllib

    from pipeline.tools.history.tune import policy_toml

    base = tomllib.loads(POLICY_TOML + 'quota_exhausted = ["say \\"no\\" \\\\d+", "余额不足"]\n')
    text = policy_toml(base, {"tier.*.error_rate_trip": 0.01}, ["paid"])
    assert tomllib.loads(text)["error_classes"] == base["error_classes"]
    assert tomllib.loads(text)["tier"]["paid"]["error_rate_trip"] == 0.01


def test_worker_refuses_a_bad_pattern_table_in_one_line_naming_the_key(tmp_path: Path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import pipeline.stream.app as stream_app
    from pipeline.cli.main import app

    def never(*args, **kwargs):  # the policy is refused before the worker would start
        raise AssertionError("run_worker was called")

    monkeypatch.setattr(stream_app, "run_worker", never)
    p = tmp_path / "policy.toml"
    p.write_text('[error_classes.acme]\nquota_exhausted = ["(余额"]\n')
    res = CliRunner().invoke(app, ["worker", "--policy", str(p)],
                             env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:9"})
    assert res.exit_code == 2
    assert "error_classes.acme.quota_exhausted[0]: invalid regex '(余额'" in res.output
    assert "Traceback" not in res.output
