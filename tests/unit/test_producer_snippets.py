"""docs/PRODUCERS.md (issue #36, part 3): each producer snippet's event matches the request-event contract.

Every Go and Node snippet marks its event literal with ``event:begin`` / ``event:end``. The test reads each
``"key": value`` line between them, turns the value into JSON (a JSON literal as written, or one of the few
known runtime expressions below, replaced by a value of the type it returns) and validates the event, and a
batch envelope of it, against ``schemas/``. A value that is neither is an error, so a snippet cannot hide a
field of the wrong type behind an expression. It also checks what makes events land right: the topic, the
channel as the key, acks=all and a compression the worker can read.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "PRODUCERS.md"
SCHEMAS = REPO / "schemas"

#: Runtime expressions allowed as values, with a value of the type each returns (Go and Node standard APIs).
EXPRESSIONS = {
    "uuid.NewString()": "0b5e3c1e-8a1f-4d7e-9f57-3c2a1d9e8b70",   # github.com/google/uuid: a string
    "randomUUID()": "0b5e3c1e-8a1f-4d7e-9f57-3c2a1d9e8b70",       # node:crypto: a string
    "time.Now().UnixMilli()": 1_780_000_000_000,                   # Go: int64 epoch ms
    "Date.now()": 1_780_000_000_000,                               # Node: integer epoch ms
}
_ENTRY = re.compile(r"""^\s*(?:"(?P<q>[a-z_]+)"|(?P<b>[a-z_]+))\s*:\s*(?P<value>.+?)\s*,?\s*(?://.*)?$""")


def snippets() -> dict[str, str]:
    """``{"franz-go" | "sarama" | "kafkajs": code}``: the fenced code block under each ``## ...`` heading."""
    text = DOC.read_text(encoding="utf-8")
    out = {}
    for name, heading in (("franz-go", "## Go: franz-go"), ("sarama", "## Go: sarama"), ("kafkajs", "## Node: kafkajs")):
        section = text.split(heading, 1)[1]
        m = re.search(r"```(?:go|js)\n(.*?)```", section, re.S)
        assert m, f"no code block under {heading}"
        out[name] = m.group(1)
    return out


def event_literal(code: str, variables: dict[str, str]) -> dict:
    """The event between the markers, as JSON values; ``variables``: names the snippet binds earlier."""
    body = code.split("event:begin", 1)[1].split("event:end", 1)[0].splitlines()[1:-1]
    event = {}
    for line in body:
        m = _ENTRY.match(line)
        assert m, f"not a `key: value` line: {line!r}"
        key, raw = m.group("q") or m.group("b"), m.group("value")
        assert key not in event, f"{key} given twice"
        if raw in EXPRESSIONS:
            event[key] = EXPRESSIONS[raw]
        elif raw in variables:
            event[key] = variables[raw]
        else:
            text = raw[1:-1].replace('"', '\\"') if raw.startswith("'") and raw.endswith("'") else None
            event[key] = json.loads(f'"{text}"' if text is not None else raw)
    return event


def bound_strings(code: str) -> dict[str, str]:
    """``channel := "..."`` (Go) and ``const channel = '...'`` (Node) bindings of the snippet."""
    found = re.findall(r"""(\w+)\s*(?::=|=)\s*["']([^"']+)["']\s*$""", code, re.M)
    return dict(found)


def validators() -> tuple[jsonschema.Draft202012Validator, jsonschema.Draft202012Validator]:
    event_schema = json.loads((SCHEMAS / "request_event.v1.json").read_text())
    batch_schema = json.loads((SCHEMAS / "batch.v1.json").read_text())
    registry = Registry().with_resources([
        (event_schema["$id"], Resource.from_contents(event_schema)),
        ("request_event.v1.json", Resource.from_contents(event_schema)),
    ])
    return (jsonschema.Draft202012Validator(event_schema, registry=registry),
            jsonschema.Draft202012Validator(batch_schema, registry=registry))


@pytest.mark.parametrize("client", ["franz-go", "sarama", "kafkajs"])
def test_snippet_event_is_a_valid_request_event(client):
    code = snippets()[client]
    event = event_literal(code, bound_strings(code))
    event_v, batch_v = validators()
    errors = [e.message for e in event_v.iter_errors(event)]
    assert errors == [], f"{client}: {errors}"
    assert list(batch_v.iter_errors({"events": [event]})) == []
    # Every field is one the contract names (an unknown field would be ignored: a silent typo).
    assert set(event) <= set(json.loads((SCHEMAS / "request_event.v1.json").read_text())["properties"])
    assert event["channel"] == bound_strings(code)["channel"]


def test_the_three_snippets_show_the_three_kinds_of_outcome():
    statuses = {client: event_literal(code, bound_strings(code))["status"] for client, code in snippets().items()}
    assert statuses == {"franz-go": "ok", "sarama": "rate_limited", "kafkajs": "error"}


@pytest.mark.parametrize("client, rules", [
    ("franz-go", [r'DefaultProduceTopic\("gateway\.requests"\)', r"Key: \[\]byte\(channel\)",
                  r"RequiredAcks\(kgo\.AllISRAcks\(\)\)", r"ProducerBatchCompression\(kgo\.GzipCompression\(\)\)",
                  r'"events": \[\]any\{event\}']),
    ("sarama", [r'Topic: "gateway\.requests"', r"Key: +sarama\.StringEncoder\(channel\)",
                r"RequiredAcks = sarama\.WaitForAll", r"Partitioner = sarama\.NewMurmur2Partitioner",
                r"Compression = sarama\.CompressionGZIP", r'"events": \[\]any\{event\}']),
    ("kafkajs", [r"topic: 'gateway\.requests'", r"key: channel", r"acks: -1",
                 r"createPartitioner: Partitioners\.DefaultPartitioner", r"compression: CompressionTypes\.GZIP",
                 r"JSON\.stringify\(\{ events: \[event\] \}\)"]),
])
def test_snippet_keys_by_channel_with_acks_all_and_a_readable_compression(client, rules):
    code = snippets()[client]
    missing = [rule for rule in rules if not re.search(rule, code)]
    assert missing == [], f"{client} lacks {missing}"


def test_event_literal_refuses_an_unknown_expression():
    code = 'event := map[string]any{ // event:begin\n\t"ts_ms": time.Now().Unix(),\n} // event:end\n'
    with pytest.raises(json.JSONDecodeError):
        event_literal(code, {})


def test_a_wrong_unit_fails_validation():
    """The check can fail: ``ts_ms`` as a float of seconds, as ``time.time()`` gives, is refused."""
    event = event_literal(snippets()["kafkajs"], bound_strings(snippets()["kafkajs"]))
    event["ts_ms"] = 1_780_000_000.25
    assert [e.validator for e in validators()[0].iter_errors(event)] == ["type"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
def test_kafkajs_snippet_is_valid_javascript(tmp_path):
    path = tmp_path / "producer.js"
    path.write_text(snippets()["kafkajs"])
    res = subprocess.run(["node", "--check", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
